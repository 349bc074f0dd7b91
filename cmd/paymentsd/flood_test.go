package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/service"
)

// The flood tests replay the attacks on issue 9 against the real binary, in
// its own process, and check that paymentsd answers each flood as it
// should and keeps taking payments. They are scaled to run in a few
// seconds on 2 cores. What a flood costs in memory is BenchmarkFlood's
// figure (flood_bench_test.go; docs/security.md gives it): the peak
// resident set of paymentsd's own process, which is why it runs as one.
//
// PAYMENTSD_FLOOD_BIN runs them against another build (such as the
// previous commit's, to measure what a change bought).

// process is paymentsd running as its own process.
type process struct {
	cmd                *exec.Cmd
	grpcAddr, httpAddr string
	webhookAddr        string // "" unless PAYMENTS_WEBHOOK_ADDR is set
	// logs holds what it logged (at PAYMENTS_LOG_LEVEL, error unless set).
	logs *logBuffer
}

var buildOnce struct {
	sync.Once
	dir, bin string
	err      error
}

var buildHooksOnce struct {
	sync.Once
	bin string
	err error
}

// paymentsdBinary builds paymentsd once per test run.
func paymentsdBinary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("PAYMENTSD_FLOOD_BIN"); bin != "" {
		return bin
	}
	buildOnce.Do(func() {
		buildOnce.bin, buildOnce.err = buildBinary("paymentsd")
	})
	if buildOnce.err != nil {
		t.Fatal(buildOnce.err)
	}
	return buildOnce.bin
}

// paymentsdTestBinary builds, once per test run, paymentsd with its test
// hooks (testhooks_on.go: a clock off by PAYMENTSD_TESTHOOK_CLOCK_OFFSET,
// retention every PAYMENTSD_TESTHOOK_RETENTION_INTERVAL).
func paymentsdTestBinary(t testing.TB) string {
	t.Helper()
	buildHooksOnce.Do(func() {
		buildHooksOnce.bin, buildHooksOnce.err = buildBinary("paymentsd-testhooks", "-tags", "paymentsd_testhooks")
	})
	if buildHooksOnce.err != nil {
		t.Fatal(buildHooksOnce.err)
	}
	return buildHooksOnce.bin
}

var buildDir struct {
	sync.Mutex
	dir string
}

func buildBinary(name string, flags ...string) (string, error) {
	buildDir.Lock()
	defer buildDir.Unlock()
	if buildDir.dir == "" {
		dir, err := os.MkdirTemp("", "paymentsd-build")
		if err != nil {
			return "", err
		}
		buildDir.dir = dir
		buildOnce.dir = dir
	}
	bin := filepath.Join(buildDir.dir, name)
	args := append(append([]string{"build", "-o", bin}, flags...), ".")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
}

// startProcess starts the binary with env and waits until it serves.
func startProcess(t testing.TB, env map[string]string) *process {
	t.Helper()
	return startCommand(t, exec.Command(paymentsdBinary(t)), env)
}

// startProcessArgs is startProcess with command-line arguments.
func startProcessArgs(t testing.TB, env map[string]string, args ...string) *process {
	t.Helper()
	return startCommand(t, exec.Command(paymentsdBinary(t), args...), env)
}

// startBinary starts bin with env and waits until it serves.
func startBinary(t testing.TB, bin string, env map[string]string) *process {
	t.Helper()
	return startCommand(t, exec.Command(bin), env)
}

// startCommand is startProcess with the command that runs the binary.
func startCommand(t testing.TB, cmd *exec.Cmd, env map[string]string) *process {
	t.Helper()
	cmd.Env = []string{
		"PAYMENTS_GRPC_ADDR=127.0.0.1:0", "PAYMENTS_HTTP_ADDR=127.0.0.1:0", "PAYMENTS_LOG_LEVEL=error",
		"PAYMENTS_DATABASE_URL=sqlite:" + filepath.Join(t.TempDir(), "records.db"),
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, logs: newLogBuffer()}
	lines := bufio.NewScanner(stderr)
	lines.Buffer(nil, 1<<20)
	for lines.Scan() {
		p.logs.Write(append(lines.Bytes(), '\n'))
		var m map[string]any
		if json.Unmarshal(lines.Bytes(), &m) == nil && m["msg"] == "serving" {
			p.grpcAddr, p.httpAddr = m["grpc_addr"].(string), m["http_addr"].(string)
			p.webhookAddr, _ = m["webhook_addr"].(string)
			break
		}
	}
	drained := make(chan struct{})
	go func() {
		// The scanner may hold lines it read past "serving": keep using it.
		for lines.Scan() {
			p.logs.Write(append(lines.Bytes(), '\n'))
		}
		io.Copy(io.Discard, stderr) // past a line too long for the scanner
		close(drained)
	}()
	t.Cleanup(func() {
		if cmd.ProcessState != nil {
			return // the test killed it and waited
		}
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("paymentsd after SIGTERM: %v", err)
			}
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("paymentsd did not exit within 30s of SIGTERM")
		}
		<-drained
	})
	if p.grpcAddr == "" {
		t.Fatalf("paymentsd did not start; it logged:\n%s", p.logs.String())
	}
	return p
}

// pays makes a real payment over gRPC and over REST.
func (p *process) pays(t testing.TB, key string) {
	t.Helper()
	conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := paymentsv1.NewPaymentsServiceClient(conn).CreateMultiCardPayment(t.Context(), validRequest(key+"-grpc")); err != nil {
		t.Errorf("gRPC payment during the flood: %v", err)
	}
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	if r := postREST(t, &http.Client{Transport: transport}, "http://"+p.httpAddr, validBody(key+"-rest"), nil); r.status != http.StatusOK {
		t.Errorf("REST payment during the flood = %d %s", r.status, r.raw)
	}
}

// floods are the attacks of issue 9, scaled down, each with the
// configuration it runs against.
var floods = []struct {
	name  string
	env   map[string]string
	flood func(t testing.TB, p *process)
}{
	{"gRPC streams with headers only", nil, floodStreams},
	{"gRPC unfinished huge headers", nil, floodGRPCHeaders},
	{"REST unfinished huge headers", nil, floodRESTHeaders},
	{"REST slow bodies", map[string]string{"PAYMENTS_HTTP_READ_TIMEOUT": "1s"}, floodSlowBodies},
}

// TestFlood: paymentsd answers each flood as it should (the flood
// functions check that) and takes payments over gRPC and REST after it.
func TestFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and floods the binary")
	}
	for _, tt := range floods {
		t.Run(tt.name, func(t *testing.T) {
			provider := fakeProvider(t, "sandbox")
			p := startProcess(t, with(sandboxEnv(provider), flatten(tt.env)...))
			p.pays(t, "warm-up")
			tt.flood(t, p)
			p.pays(t, "after")
		})
	}
}

func flatten(m map[string]string) []string {
	var kv []string
	for k, v := range m {
		kv = append(kv, k, v)
	}
	return kv
}

// h2Conn is a raw HTTP/2 client connection whose frames the server's
// replies are read and discarded from, as an attacker's would be.
type h2Conn struct {
	conn net.Conn
	fr   *http2.Framer
	bw   *bufio.Writer
	// pong closes when the server acknowledges our PING, or the
	// connection ends.
	pong chan struct{}
	done chan struct{}
	// refused counts the streams the server refused (RST_STREAM with
	// REFUSED_STREAM).
	refused atomic.Int64
}

func dialH2(t testing.TB, addr string) *h2Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := &h2Conn{conn: conn, bw: bufio.NewWriterSize(conn, 64<<10), pong: make(chan struct{}), done: make(chan struct{})}
	c.fr = http2.NewFramer(c.bw, conn)
	c.fr.ReadMetaHeaders = nil
	t.Cleanup(func() {
		conn.Close()
		<-c.done
	})
	c.bw.WriteString(http2.ClientPreface)
	c.fr.WriteSettings()
	c.bw.Flush()
	go func() {
		defer close(c.done)
		var once sync.Once
		defer once.Do(func() { close(c.pong) })
		for {
			f, err := c.fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.PingFrame:
				if f.IsAck() {
					once.Do(func() { close(c.pong) })
				}
			case *http2.RSTStreamFrame:
				if f.ErrCode == http2.ErrCodeRefusedStream {
					c.refused.Add(1)
				}
			case *http2.SettingsFrame:
				// The ack is written from this goroutine only while the
				// flood isn't writing: skip it; the server tolerates a
				// missing ack for longer than a test runs.
			}
		}
	}()
	return c
}

// grpcHeaders is a request header block for CreateMultiCardPayment. Every
// field is never-indexed, so the same block can be sent on every stream.
func grpcHeaders(authority string) []byte {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"},
		{":path", paymentsv1.PaymentsService_CreateMultiCardPayment_FullMethodName},
		{":authority", authority}, {"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1], Sensitive: true})
	}
	return buf.Bytes()
}

// floodStreams opens 20,000 streams on one connection, headers only: the
// attack took 40,000 and 470 MiB. Every stream past the connection's cap
// must be refused at once, or the connection closed.
func floodStreams(t testing.TB, p *process) {
	const streams = 20000
	c := dialH2(t, p.grpcAddr)
	block := grpcHeaders(p.grpcAddr)
	for i := range streams {
		if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block, EndHeaders: true}); err != nil {
			break
		}
	}
	c.fr.WritePing(false, [8]byte{1})
	c.bw.Flush()
	select {
	case <-c.pong: // the server has read every frame, or closed the connection
	case <-time.After(time.Minute):
		t.Fatal("the server neither answered a PING after the streams nor closed the connection")
	}
	select {
	case <-c.done:
		return // closed: nothing of it is held
	default:
	}
	if n := c.refused.Load(); n < streams-service.MaxConcurrentStreams {
		t.Errorf("the server refused %d of %d streams on one connection, want all but its cap of %d", n, streams, service.MaxConcurrentStreams)
	}
}

// floodGRPCHeaders sends four connections' worth of one 15 MB header
// field, never finished. The server must close each connection once the
// header passes its limit, long before 15 MB have arrived.
func floodGRPCHeaders(t testing.TB, p *process) {
	var wg sync.WaitGroup
	var whole atomic.Int64
	for range 4 {
		c := dialH2(t, p.grpcAddr)
		wg.Go(func() {
			block := append(grpcHeaders(p.grpcAddr), 0x00) // literal, new name
			block = appendHPACKInt(block, 7, 5)
			block = append(block, "x-pad"...)
			block = appendHPACKInt(block, 7, 15<<20)
			if c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block}) != nil {
				return
			}
			chunk := bytes.Repeat([]byte{'a'}, 16<<10)
			for range (15 << 20) / len(chunk) {
				if c.fr.WriteContinuation(1, false, chunk) != nil || c.bw.Flush() != nil {
					return
				}
			}
			whole.Add(1)
		})
	}
	wg.Wait()
	if n := whole.Load(); n > 0 {
		t.Errorf("%d of 4 connections took 15 MB of one header, want each closed past %d KiB", n, service.MaxHeaderBytes>>10)
	}
}

// appendHPACKInt appends n as an HPACK integer with an n-bit prefix
// (RFC 7541, 5.1), the flag bits of the first byte already in b's caller.
func appendHPACKInt(b []byte, prefix uint, n int) []byte {
	max := 1<<prefix - 1
	if n < max {
		return append(b, byte(n))
	}
	b = append(b, byte(max))
	for n -= max; n >= 128; n >>= 7 {
		b = append(b, byte(n%128+128))
	}
	return append(b, byte(n))
}

// floodRESTHeaders sends 130 connections' worth of a 1 MB header, never
// finished: the attack reached 450 MiB. Each must be answered 431 once the
// header passes the limit.
func floodRESTHeaders(t testing.TB, p *process) {
	const conns = 130
	var wg sync.WaitGroup
	answers := make(chan string, conns)
	for range conns {
		conn, err := net.Dial("tcp", p.httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		wg.Go(func() {
			io.WriteString(conn, "POST /v1/multi-card-payments HTTP/1.1\r\nHost: paymentsd\r\nX-Pad: ")
			chunk := bytes.Repeat([]byte{'a'}, 32<<10)
			for range (1 << 20) / len(chunk) {
				if _, err := conn.Write(chunk); err != nil {
					break // the server has closed the connection
				}
			}
			// A guard against a hang: the answer is due at once.
			conn.SetReadDeadline(time.Now().Add(time.Minute))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				answers <- err.Error()
				return
			}
			resp.Body.Close()
			answers <- resp.Status
		})
	}
	wg.Wait()
	close(answers)
	for a := range answers {
		if a != "431 Request Header Fields Too Large" {
			t.Errorf("a REST request with a 1 MB header was answered %q, want 431", a)
		}
	}
}

// floodSlowBodies holds 100 requests whose bodies arrive a byte at a time
// (the attack: 300, a byte every 5s, all still open after 45s). With
// PAYMENTS_HTTP_READ_TIMEOUT=1s every one must be answered 408 (or closed)
// before its body is whole.
func floodSlowBodies(t testing.TB, p *process) {
	const n = 100
	closed := make(chan error, n)
	stop := make(chan struct{})
	defer close(stop)
	for range n {
		conn, err := net.Dial("tcp", p.httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		io.WriteString(conn, "POST /v1/multi-card-payments HTTP/1.1\r\nHost: paymentsd\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
		go func() {
			// A byte every 100ms, at most 100 of them; the server must
			// close the connection long before.
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for range 99 {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				if _, err := conn.Write([]byte{' '}); err != nil {
					return
				}
			}
		}()
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode != http.StatusRequestTimeout {
					err = fmt.Errorf("status %d, want 408", resp.StatusCode)
				}
			}
			closed <- err
		}()
	}
	// A body that got through whole (after about 10s) would be answered
	// 400, not 408: the status says the read timeout ended it. The timer
	// only guards against a hang.
	hang := time.After(time.Minute)
	for i := range n {
		select {
		case err := <-closed:
			if err != nil && !errors.Is(err, io.EOF) {
				t.Errorf("slow body: %v", err)
			}
		case <-hang:
			t.Fatalf("%d of %d slow-body connections never answered with PAYMENTS_HTTP_READ_TIMEOUT=1s", n-i, n)
		}
	}
}
