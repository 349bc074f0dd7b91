package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"example.com/paymentsd/internal/simulator"
)

// TestDrain checks the shutdown order: health flips to NOT_SERVING, new
// connections stop, in-flight payments finish, and run returns nil.
func TestDrain(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	release := make(chan struct{})
	arrived := make(chan string, 2)
	p.SetScript(func(_ int, r simulator.Request) simulator.Reply {
		arrived <- idempotencyKey(r.Body)
		return simulator.Reply{Wait: release, Status: 200, Body: okBody}
	})
	in := start(t, sandboxEnv(p))

	watchCtx, stopWatch := context.WithCancel(t.Context())
	defer stopWatch()
	watch, err := healthpb.NewHealthClient(in.conn).Watch(watchCtx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := watch.Recv(); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health before shutdown = %v, %v, want SERVING", st.GetStatus(), err)
	}

	grpcDone := make(chan error, 1)
	go func() {
		_, err := in.client.CreateMultiCardPayment(context.Background(), validRequest("in-flight-grpc"))
		grpcDone <- err
	}()
	restDone := make(chan restOutcome, 1)
	go func() { restDone <- postRESTNoFatal(in, validBody("in-flight-rest")) }()
	<-arrived
	<-arrived

	stopped := make(chan error, 1)
	go func() { stopped <- in.stop() }()

	if st, err := watch.Recv(); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health after SIGTERM = %v, %v, want NOT_SERVING", st.GetStatus(), err)
	}
	stopWatch()
	in.logs.waitFor(t, "draining", nil)

	// New connections are refused while the payments are still in flight.
	for _, addr := range []string{in.grpcAddr, in.httpAddr} {
		waitRefused(t, addr)
	}
	select {
	case err := <-stopped:
		t.Fatalf("run returned %v with payments in flight", err)
	default:
	}

	close(release)
	if err := <-grpcDone; err != nil {
		t.Errorf("in-flight gRPC payment = %v, want OK", err)
	}
	if r := <-restDone; r.err != nil || r.status != http.StatusOK {
		t.Errorf("in-flight REST payment = %d, %v, want 200", r.status, r.err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("run() = %v, want nil after draining", err)
	}
}

// waitRefused waits until addr refuses connections.
func waitRefused(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("%s still accepts connections while draining", addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDrainTimeout checks that a payment stuck at the provider does not
// keep the process up past PAYMENTS_SHUTDOWN_TIMEOUT. PAYMENTS_UPSTREAM_TIMEOUT
// may not be longer, so the call ends by its own deadline, with its
// outcome unknown, rather than being cut off by the drain. The provider
// would hold the request for an hour: that run returns at all (stop
// gives it a minute) is the proof, not how long it took.
func TestDrainTimeout(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	arrived := make(chan struct{}, 1)
	p.SetScript(func(int, simulator.Request) simulator.Reply {
		arrived <- struct{}{}
		return simulator.Reply{Delay: time.Hour}
	})
	in := start(t, with(sandboxEnv(p), "PAYMENTS_SHUTDOWN_TIMEOUT", "300ms", "PAYMENTS_UPSTREAM_TIMEOUT", "300ms"))
	done := make(chan error, 1)
	go func() {
		_, err := in.client.CreateMultiCardPayment(context.Background(), validRequest("stuck"))
		done <- err
	}()
	<-arrived
	if err := in.stop(); err != nil {
		t.Errorf("run() = %v, want nil", err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("a payment cut off by shutdown returned OK")
		}
	case <-time.After(time.Minute):
		t.Fatal("a payment stuck at the provider still had no answer after shutdown")
	}
	select {
	case <-p.Canceled():
	case <-time.After(time.Minute):
		t.Error("the provider never saw the stuck request given up")
	}
}

// TestSIGTERM runs the real binary and sends it SIGTERM: it must drain and
// exit 0.
func TestSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "paymentsd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "--simulate")
	cmd.Env = []string{"PAYMENTS_GRPC_ADDR=127.0.0.1:0", "PAYMENTS_HTTP_ADDR=127.0.0.1:0"}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stderr)
	var msgs []string
	for lines.Scan() {
		var m map[string]any
		json.Unmarshal(lines.Bytes(), &m)
		msgs = append(msgs, m["msg"].(string))
		if m["msg"] == "serving" {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for lines.Scan() {
		var m map[string]any
		json.Unmarshal(lines.Bytes(), &m)
		msgs = append(msgs, m["msg"].(string))
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("paymentsd after SIGTERM: %v, want exit status 0", err)
	}
	if want := []string{"starting", "opening the record store", "applied migrations", "serving", "draining", "stopped"}; !equal(msgs, want) {
		t.Errorf("log messages = %q, want %q", msgs, want)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestBinaryFirstContact runs the built binary as a newcomer would first:
// --help and --version exit 0 on stdout, and a misspelt variable stops it
// with exit status 1 and a suggestion on stderr.
func TestBinaryFirstContact(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel()
	bin := paymentsdBinary(t)
	for _, tc := range []struct {
		args     []string
		env      []string
		wantExit int
		want     string // in stdout for exit 0, stderr otherwise
	}{
		{[]string{"--help"}, nil, 0, "PAYMENTS_DATABASE_CONNECT_TIMEOUT"},
		{[]string{"-h"}, nil, 0, "PAYMENTS_ENVIRONMENT"},
		{[]string{"--version"}, nil, 0, "paymentsd "},
		{[]string{"--simulate"}, []string{"PAYMENTS_GRPC_ADR=:0"}, 1, "did you mean PAYMENTS_GRPC_ADDR?"},
		{nil, []string{"PAYMENTS_ENVIRONMENT=live", "PAYMENTS_LIVE_BASE_URL=https://x.test/v1", "PAYMENTS_LIVE_API_KEY=k"}, 1, "PAYMENTS_DATABASE_URL"},
	} {
		cmd := exec.Command(bin, tc.args...)
		cmd.Env = tc.env
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		exit := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			exit = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		out := stdout.String()
		if tc.wantExit != 0 {
			out = stderr.String()
		}
		if exit != tc.wantExit || !strings.Contains(out, tc.want) {
			t.Errorf("paymentsd %q with %q: exit %d, stdout %q, stderr %q; want exit %d and %q", tc.args, tc.env, exit, stdout.String(), stderr.String(), tc.wantExit, tc.want)
		}
	}
}
