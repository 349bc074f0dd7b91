package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/config"
	"example.com/paymentsd/internal/daemon"
	"example.com/paymentsd/internal/simulator"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) {
		if buildOnce.dir != "" {
			os.RemoveAll(buildOnce.dir)
		}
	}))
}

// sandboxKey and liveKey are the keys the tests' fake providers know.
const (
	sandboxKey = "sk_sandbox_SENTINEL_7f3a9c"
	liveKey    = "sk_live_SENTINEL_0b21e4"
)

// logBuffer collects paymentsd's log lines and lets a test wait for one.
type logBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func newLogBuffer() *logBuffer { return &logBuffer{changed: make(chan struct{})} }

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.buf.Write(p)
	close(l.changed)
	l.changed = make(chan struct{})
	return n, err
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// lines returns the JSON log lines whose msg is msg.
func (l *logBuffer) lines(msg string) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(l.buf.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// waitFor waits until a line with msg has been logged, or done fires.
func (l *logBuffer) waitFor(t testing.TB, msg string, done <-chan error) map[string]any {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		l.mu.Lock()
		changed := l.changed
		l.mu.Unlock()
		if lines := l.lines(msg); len(lines) > 0 {
			return lines[0]
		}
		select {
		case <-changed:
		case err := <-done:
			t.Fatalf("paymentsd exited before logging %q: %v\nlogs:\n%s", msg, err, l.String())
		case <-timeout:
			t.Fatalf("paymentsd did not log %q in time; logs:\n%s", msg, l.String())
		}
	}
}

// instance is a paymentsd started in-process through run.
type instance struct {
	grpcAddr, httpAddr string
	webhookAddr        string // "" unless PAYMENTS_WEBHOOK_ADDR is set
	conn               *grpc.ClientConn
	http               *http.Client
	client             paymentsv1.PaymentsServiceClient
	logs               *logBuffer
	stop               func() error // cancels run's context and returns its error
}

// start runs paymentsd with env (on top of loopback listeners on port 0)
// and waits until it serves. It stops when the test ends.
func start(t testing.TB, env map[string]string, args ...string) *instance {
	t.Helper()
	return startWith(t, env, nil, args...)
}

// startWith is start with a tracer provider; it calls serve, as run does
// once it has read OTEL_* into a tracer provider.
func startWith(t testing.TB, env map[string]string, tp trace.TracerProvider, args ...string) *instance {
	t.Helper()
	return startConfigured(t, env, tp, nil, args...)
}

// startConfigured is startWith with a change to the loaded configuration,
// for states the configuration's own checks refuse.
func startConfigured(t testing.TB, env map[string]string, tp trace.TracerProvider, change func(*config.Config), args ...string) *instance {
	t.Helper()
	full := map[string]string{
		"PAYMENTS_GRPC_ADDR": "127.0.0.1:0",
		"PAYMENTS_HTTP_ADDR": "127.0.0.1:0",
		// Each instance gets its own records unless the test shares some.
		"PAYMENTS_DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "records.db"),
	}
	for k, v := range env {
		full[k] = v
	}
	logs := newLogBuffer()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	argv := append([]string{"paymentsd"}, args...)
	if tp == nil && change == nil {
		go func() { done <- run(ctx, argv, envList(full), io.Discard, logs) }()
	} else {
		go func() {
			cfg, err := loadConfig(argv, envList(full))
			if err != nil {
				done <- err
				return
			}
			if change != nil {
				change(cfg)
			}
			done <- daemon.Serve(ctx, cfg, logs, tp)
		}()
	}
	serving := logs.waitFor(t, "serving", done)

	in := &instance{
		grpcAddr: serving["grpc_addr"].(string),
		httpAddr: serving["http_addr"].(string),
		logs:     logs,
	}
	in.webhookAddr, _ = serving["webhook_addr"].(string)
	var once sync.Once
	var runErr error
	in.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(60 * time.Second):
				t.Errorf("paymentsd did not stop in time")
			}
		})
		return runErr
	}
	t.Cleanup(func() {
		if err := in.stop(); err != nil {
			t.Errorf("run() = %v, want nil after the context ends", err)
		}
	})
	transport := &http.Transport{}
	in.http = &http.Client{Transport: transport}
	t.Cleanup(transport.CloseIdleConnections)
	if full["PAYMENTS_TLS_CERT_FILE"] == "" {
		conn, err := grpc.NewClient(in.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatalf("grpc.NewClient(%s) = %v", in.grpcAddr, err)
		}
		t.Cleanup(func() { conn.Close() })
		in.conn = conn
		in.client = paymentsv1.NewPaymentsServiceClient(conn)
	}
	return in
}

// runRefused runs paymentsd with args and env, expecting it to refuse to
// start, and returns the refusal and what it wrote. One that starts
// serving instead is stopped, and the test fails.
func runRefused(t *testing.T, env map[string]string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var out bytes.Buffer // written by run only, and read once it returns
	logs := newLogBuffer()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"paymentsd"}, args...), envList(env), &out, logs)
	}()
	// A guard against a hang, not a timed assertion: a refusal needs no
	// waiting.
	hang := time.NewTimer(time.Minute)
	defer hang.Stop()
	for {
		logs.mu.Lock()
		changed := logs.changed
		logs.mu.Unlock()
		if len(logs.lines("serving")) > 0 {
			cancel()
			<-done
			t.Fatalf("run() started serving, want a refusal")
		}
		select {
		case err := <-done:
			return out.String(), logs.String(), err
		case <-changed:
		case <-hang.C:
			cancel()
			t.Fatalf("run() neither refused to start nor served within a minute; logs:\n%s", logs.String())
		}
	}
}

// fakeProvider starts a fake provider that knows both keys: each is
// permitted in its own environment and forbidden in the other, as the
// provider's documentation says.
func fakeProvider(t testing.TB, env string) *simulator.Server {
	t.Helper()
	var p *simulator.Server
	if env == "live" {
		p = simulator.NewTLSServer()
		p.AllowKey(liveKey)
		p.ForbidKey(sandboxKey)
	} else {
		p = simulator.NewServer()
		p.AllowKey(sandboxKey)
		p.ForbidKey(liveKey)
	}
	t.Cleanup(p.Close)
	return p
}

// sandboxEnv is the configuration of a sandbox deployment against p.
func sandboxEnv(p *simulator.Server) map[string]string {
	return map[string]string{
		"PAYMENTS_ENVIRONMENT":      "sandbox",
		"PAYMENTS_SANDBOX_BASE_URL": p.URL,
		"PAYMENTS_SANDBOX_API_KEY":  sandboxKey,
	}
}

// liveEnv is the configuration of a live deployment against the TLS fake p.
func liveEnv(t *testing.T, p *simulator.Server) map[string]string {
	return map[string]string{
		"PAYMENTS_ENVIRONMENT":      "live",
		"PAYMENTS_LIVE_BASE_URL":    p.URL,
		"PAYMENTS_LIVE_API_KEY":     liveKey,
		"PAYMENTS_UPSTREAM_CA_FILE": writeCertPEM(t, p),
		// These tests are not about callers' identities, which live
		// otherwise requires (TestLiveRequiresCallerIdentity).
		"PAYMENTS_ALLOW_UNIDENTIFIED_CALLERS": "true",
	}
}

func writeCertPEM(t *testing.T, p *simulator.Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "provider-ca.pem")
	b := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.Certificate().Raw})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// with returns m plus the pairs kv.
func with(m map[string]string, kv ...string) map[string]string {
	out := make(map[string]string, len(m)+len(kv)/2)
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// restResult is a REST call's outcome.
type restResult struct {
	status int
	header http.Header
	body   map[string]any
	raw    []byte
}

// rest posts body to the instance's REST endpoint.
func (in *instance) rest(t *testing.T, body string, header http.Header) restResult {
	t.Helper()
	return postREST(t, in.http, "http://"+in.httpAddr, body, header)
}

// postREST posts body to the REST endpoint at baseURL.
func postREST(t testing.TB, client *http.Client, baseURL, body string, header http.Header) restResult {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, baseURL+"/v1/multi-card-payments", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST /v1/multi-card-payments: %v", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading REST reply: %v", err)
	}
	r := restResult{status: resp.StatusCode, header: resp.Header, raw: raw}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	d.Decode(&r.body)
	return r
}

func validRequest(key string) *paymentsv1.CreateMultiCardPaymentRequest {
	return &paymentsv1.CreateMultiCardPaymentRequest{
		AmountMoney:    &paymentsv1.Money{Currency: "USD", Amount: 1250},
		IdempotencyKey: key,
	}
}

func validBody(key string) string {
	return `{"amountMoney":{"currency":"USD","amount":1250},"idempotencyKey":"` + key + `"}`
}

// envList is m as os.Environ gives an environment, sorted.
func envList(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}
