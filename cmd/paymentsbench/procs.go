package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"
)

// startTimeout bounds how long a child may take to report that it serves.
const startTimeout = 30 * time.Second

// environment is what the benchmark starts its processes from.
type environment struct {
	paymentsd   string // the paymentsd binary
	self        string // this binary, re-executed as the fake provider and the floors
	providerKey string // the key the fake provider accepts
	dbs         *databases
	pprof       bool   // paymentsd was built to write CPU profiles
	gogc        string // GOGC for paymentsd, or ""
}

// benchProfileEnv names the file a paymentsd built with the benchprofile
// tag writes its CPU profile to (see cmd/paymentsd/benchprofile.go).
const benchProfileEnv = "PAYMENTS_BENCH_CPUPROFILE"

// buildPaymentsd builds paymentsd into dir and returns the binary's path.
// With profile it is built with the benchprofile tag, which lets the
// benchmark take CPU profiles of it; the production binary can't.
//
// It is built with this binary's own build tags, so that a driver tag
// (go run -tags sqlite_ncruces ./cmd/paymentsbench) gives paymentsd and the
// record floors the same SQLite driver.
func buildPaymentsd(ctx context.Context, dir string, profile bool, stderr io.Writer) (string, error) {
	bin := filepath.Join(dir, "paymentsd")
	args := []string{"build", "-o", bin}
	tags := buildTags()
	if profile {
		tags = append(tags, "benchprofile")
	}
	if len(tags) > 0 {
		args = append(args, "-tags="+strings.Join(tags, ","))
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "example.com/paymentsd/cmd/paymentsd")...)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build paymentsd (run from inside the module): %w", err)
	}
	return bin, nil
}

// buildTags are the build tags this binary was built with.
func buildTags() []string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	for _, st := range info.Settings {
		if st.Key == "-tags" && st.Value != "" {
			return strings.Split(st.Value, ",")
		}
	}
	return nil
}

// sqliteDriver is the SQLite driver module this binary (and so paymentsd
// and the record floors) was built with, and its version.
func sqliteDriver() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, m := range info.Deps {
		switch m.Path {
		case "modernc.org/sqlite", "github.com/ncruces/go-sqlite3", "github.com/mattn/go-sqlite3":
			return m.Path + " " + m.Version
		}
	}
	return ""
}

// fakeProcess is a running fake provider.
type fakeProcess struct {
	*child
	addr      string // payments
	statsAddr string // GET /stats, on a listener of its own
}

func (f *fakeProcess) paymentURL() string { return "http://" + f.addr + "/v1/multi-card-payments" }

// startFake starts a fake provider that holds every reply for delay.
func (e *environment) startFake(ctx context.Context, name string, delay time.Duration) (*fakeProcess, error) {
	c, ready, err := startChild(ctx, name, nil, e.self,
		fakeProviderFlag, "-addr=127.0.0.1:0", "-stats-addr=127.0.0.1:0",
		"-delay="+delay.String(), "-key="+e.providerKey)
	if err != nil {
		return nil, err
	}
	if ready.Addr == "" || ready.StatsAddr == "" {
		c.stop()
		return nil, fmt.Errorf("%s reported no addresses", name)
	}
	return &fakeProcess{child: c, addr: ready.Addr, statsAddr: ready.StatsAddr}, nil
}

// serviceProcess is a running paymentsd.
type serviceProcess struct {
	*child
	grpcAddr string
	httpAddr string
	store    string // storeSQLite, storePostgres or storeMemory
	// profile is where paymentsd writes a CPU profile between SIGUSR1 and
	// SIGUSR2, when built with the benchprofile tag (-pprof).
	profile string
}

// startPaymentsd starts paymentsd in the sandbox environment against fake,
// with a fresh database of the store kind, at the default log level, so
// that every call writes its access-log line as in production. extraEnv
// adds or overrides settings.
func (e *environment) startPaymentsd(ctx context.Context, name, storeKind string, fake *fakeProcess, extraEnv ...string) (*serviceProcess, error) {
	dbURL, err := e.dbs.url(ctx, storeKind, name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	env := []string{
		"PAYMENTS_ENVIRONMENT=sandbox",
		"PAYMENTS_SANDBOX_BASE_URL=http://" + fake.addr + "/v1",
		"PAYMENTS_SANDBOX_API_KEY=" + e.providerKey,
		"PAYMENTS_GRPC_ADDR=127.0.0.1:0",
		"PAYMENTS_HTTP_ADDR=127.0.0.1:0",
		"PAYMENTS_DATABASE_URL=" + dbURL,
	}
	var profile string
	if e.pprof {
		profile = filepath.Join(e.dbs.dir, name+".pprof")
		env = append(env, benchProfileEnv+"="+profile)
	}
	if e.gogc != "" {
		env = append(env, "GOGC="+e.gogc)
	}
	env = append(env, extraEnv...)
	c, ready, err := startChild(ctx, name, env, e.paymentsd)
	if err != nil {
		return nil, err
	}
	if ready.GRPCAddr == "" || ready.HTTPAddr == "" {
		c.stop()
		return nil, fmt.Errorf("%s reported no addresses", name)
	}
	return &serviceProcess{child: c, grpcAddr: ready.GRPCAddr, httpAddr: ready.HTTPAddr, store: storeKind, profile: profile}, nil
}

// child is a process the benchmark started.
type child struct {
	name   string
	cmd    *exec.Cmd
	cancel context.CancelFunc
	out    *output
	exited chan struct{}
	err    error // from Wait; read after exited is closed
}

// startChild runs path with args, in the inherited environment minus
// paymentsd's own variables, plus env, and waits for its "serving" line.
func startChild(ctx context.Context, name string, env []string, path string, args ...string) (*child, servingLine, error) {
	ctx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(cleanEnv(), env...)
	out := &output{ready: make(chan servingLine, 1)}
	cmd.Stdout, cmd.Stderr = out, out
	// On cancel, ask it to stop; if it has not within WaitDelay, kill it.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	setDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, servingLine{}, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, cancel: cancel, out: out, exited: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()

	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case ready := <-out.ready:
		return c, ready, nil
	case <-c.exited:
		cancel()
		return nil, servingLine{}, fmt.Errorf("%s exited before serving (%v); its output:\n%s", name, c.err, out)
	case <-timer.C:
		c.stop()
		return nil, servingLine{}, fmt.Errorf("%s did not report serving within %v; its output:\n%s", name, startTimeout, out)
	case <-ctx.Done():
		c.stop()
		return nil, servingLine{}, ctx.Err()
	}
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// stop ends the process, if it is still running, and waits for it. It may
// be called more than once.
func (c *child) stop() {
	c.cancel()
	<-c.exited
}

// checkRunning reports an error if the process has exited.
func (c *child) checkRunning() error {
	select {
	case <-c.exited:
		return fmt.Errorf("%s exited (%v); its output:\n%s", c.name, c.err, c.out)
	default:
		return nil
	}
}

// cleanEnv is this process's environment without PAYMENTS_*, OTEL_* and
// Go runtime (GOGC, GOMEMLIMIT, GODEBUG) variables, so that a developer's
// shell settings cannot change what is measured.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PAYMENTS_") && !strings.HasPrefix(kv, "OTEL_") &&
			!strings.HasPrefix(kv, "GOGC=") && !strings.HasPrefix(kv, "GOMEMLIMIT=") && !strings.HasPrefix(kv, "GODEBUG=") {
			env = append(env, kv)
		}
	}
	return env
}

// servingLine is the JSON log line a child writes once it serves: paymentsd
// gives its gRPC and HTTP addresses, the fake provider its two addresses.
type servingLine struct {
	Msg       string `json:"msg"`
	GRPCAddr  string `json:"grpc_addr"`
	HTTPAddr  string `json:"http_addr"`
	Addr      string `json:"addr"`
	StatsAddr string `json:"stats_addr"`
}

// output takes a child's stdout and stderr, so that they never block it.
// It sends the first "serving" line on ready, and keeps the output up to
// that line and the latest output after it, for error messages; the rest,
// such as paymentsd's access log, it drops.
type output struct {
	ready chan servingLine

	mu         sync.Mutex
	head       []byte // up to the serving line
	scanned    int    // how much of head has been searched for it
	seen       bool
	prev, last []byte // the two latest writes after it
}

// maxHead bounds head, in case the serving line never comes.
const maxHead = 64 << 10

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen {
		o.prev, o.last = o.last, append(o.prev[:0], p...)
		return len(p), nil
	}
	o.head = append(o.head, p...)
	for !o.seen {
		i := bytes.IndexByte(o.head[o.scanned:], '\n')
		if i < 0 {
			break
		}
		line := o.head[o.scanned : o.scanned+i]
		o.scanned += i + 1
		var s servingLine
		if json.Unmarshal(line, &s) == nil && s.Msg == "serving" {
			o.seen = true
			o.ready <- s
		}
	}
	if len(o.head) > maxHead {
		o.head = append(o.head[:maxHead/2], "\n…\n"...)
		o.scanned = len(o.head)
	}
	return len(p), nil
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := string(o.head)
	if len(o.prev)+len(o.last) > 0 {
		s += "…\n" + string(o.prev) + string(o.last)
	}
	return s
}
