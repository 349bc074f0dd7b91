package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/config"
	"example.com/paymentsd/internal/service"
	"example.com/paymentsd/internal/simulator"
)

// TestInFlightCap fills PAYMENTS_MAX_IN_FLIGHT with payments the provider
// holds: the next gRPC call gets RESOURCE_EXHAUSTED and the next REST call
// 429, while health checks keep answering, and the held payments succeed.
func TestInFlightCap(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	release := make(chan struct{})
	arrived := make(chan struct{}, 2)
	p.SetScript(func(int, simulator.Request) simulator.Reply {
		arrived <- struct{}{}
		return simulator.Reply{Wait: release, Status: 200, Body: okBody}
	})
	in := start(t, with(sandboxEnv(p), "PAYMENTS_MAX_IN_FLIGHT", "2"))

	held := make(chan error, 2)
	go func() {
		_, err := in.client.CreateMultiCardPayment(context.Background(), validRequest("held-grpc"))
		held <- err
	}()
	go func() {
		r := postRESTNoFatal(in, validBody("held-rest"))
		if r.err == nil && r.status != http.StatusOK {
			r.err = status.Errorf(codes.Unknown, "REST %d", r.status)
		}
		held <- r.err
	}()
	<-arrived
	<-arrived

	// The refusal is made as the stream's headers arrive, and says, as
	// every CreateMultiCardPayment error does, what happened to the money.
	_, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("over-grpc"))
	st := status.Convert(err)
	// It reads no record, so it says only that this call sent nothing: a
	// payment may exist for the key (held-grpc's is at the provider now).
	if st.Code() != codes.ResourceExhausted || reasonOf(st) != service.ReasonNotSent || retryDelay(st) <= 0 {
		t.Errorf("CreateMultiCardPayment() over the cap = %v, reason %q, retry delay %v; want %v, %s, a RetryInfo", st.Code(), reasonOf(st), retryDelay(st), codes.ResourceExhausted, service.ReasonNotSent)
	}
	_, err = in.client.CreateMultiCardPayment(t.Context(), validRequest("held-grpc"))
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || reasonOf(st) != service.ReasonNotSent {
		t.Errorf("CreateMultiCardPayment(a key whose payment is at the provider) over the cap = %v, reason %q; want %v, %s", st.Code(), reasonOf(st), codes.ResourceExhausted, service.ReasonNotSent)
	}
	if r := in.rest(t, validBody("over-rest"), nil); r.status != http.StatusTooManyRequests || restCode(r) != codes.ResourceExhausted || restReason(r) != service.ReasonNotSent {
		t.Errorf("REST over the cap = %d, code %v, reason %q; want 429, %v, %s", r.status, restCode(r), restReason(r), codes.ResourceExhausted, service.ReasonNotSent)
	}
	// A lookup's refusal says nothing about the payment it looks up.
	_, err = in.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "held-grpc"})
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || reasonOf(st) != "" || retryDelay(st) <= 0 {
		t.Errorf("GetMultiCardPayment() over the cap = %v, reason %q, retry delay %v; want %v, no reason, a RetryInfo", st.Code(), reasonOf(st), retryDelay(st), codes.ResourceExhausted)
	}
	resp, err := in.http.Get("http://" + in.httpAddr + "/v1/multi-card-payments/held-rest")
	if err != nil {
		t.Fatal(err)
	}
	r := restResult{status: resp.StatusCode}
	r.raw, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if r.status != http.StatusTooManyRequests || restReason(r) != "" {
		t.Errorf("REST lookup over the cap = %d, reason %q; want 429, no reason", r.status, restReason(r))
	}
	if st, err := healthpb.NewHealthClient(in.conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health over the cap = %v, %v, want SERVING", st.GetStatus(), err)
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := in.http.Get("http://" + in.httpAddr + path)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s over the cap = %v, %v, want 200", path, statusOf(resp), err)
		}
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	close(release)
	for range 2 {
		if err := <-held; err != nil {
			t.Errorf("held payment = %v, want OK", err)
		}
	}
	if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("after")); err != nil {
		t.Errorf("CreateMultiCardPayment() after the cap freed = %v", err)
	}
}

// TestConnectionCap checks that connections over PAYMENTS_MAX_CONNECTIONS
// are closed at once, and that a freed slot serves again.
func TestConnectionCap(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	in := start(t, with(sandboxEnv(p), "PAYMENTS_MAX_CONNECTIONS", "2"))
	for _, addr := range []string{in.grpcAddr, in.httpAddr} {
		var held []net.Conn
		for range 2 {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
		over, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := over.Read(make([]byte, 1)); err == nil {
			t.Errorf("%s: connection over the cap read %d bytes, want it closed", addr, n)
		}
		over.Close()
		for _, c := range held {
			c.Close()
		}
	}
	// Closed slots are free again (the listener counts them on close, which
	// the server does once it reads EOF, so retry briefly).
	conn, err := grpc.NewClient(in.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Errorf("health after freeing slots: %v", err)
	}
}

// TestStrictREST checks the REST input rules: JSON content type (415),
// one JSON value (400), the method (405 with Allow: POST), all in the
// gateway's google.rpc.Status shape; none reaches the provider.
func TestStrictREST(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	in := start(t, sandboxEnv(p))
	body := validBody("strict")
	tests := []struct {
		name        string
		method      string
		contentType string // "-" for none
		body        string
		want        int
	}{
		{"JSON", "POST", "application/json", body, http.StatusOK},
		{"JSON with charset", "POST", "application/json; charset=utf-8", body, http.StatusOK},
		{"JSON in upper case", "POST", "Application/JSON; Charset=UTF-8", body, http.StatusOK},
		{"trailing whitespace", "POST", "application/json", body + " \n\t\r\n", http.StatusOK},
		{"no content type", "POST", "-", body, http.StatusUnsupportedMediaType},
		{"text/plain", "POST", "text/plain", body, http.StatusUnsupportedMediaType},
		{"form", "POST", "application/x-www-form-urlencoded", body, http.StatusUnsupportedMediaType},
		{"other charset", "POST", "application/json; charset=latin1", body, http.StatusUnsupportedMediaType},
		{"json suffix type", "POST", "application/problem+json", body, http.StatusUnsupportedMediaType},
		{"two objects", "POST", "application/json", body + body, http.StatusBadRequest},
		{"object then junk", "POST", "application/json", body + " x", http.StatusBadRequest},
		{"object then brace", "POST", "application/json", body + "}", http.StatusBadRequest},
		// GET is the list, an admin call: without mTLS, refused.
		{"GET", "GET", "-", "", http.StatusForbidden},
		{"PUT", "PUT", "application/json", body, http.StatusMethodNotAllowed},
		{"DELETE", "DELETE", "-", "", http.StatusMethodNotAllowed},
		{"PATCH", "PATCH", "application/json", body, http.StatusMethodNotAllowed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A key per case: an accepted body with a key used before
			// would be a replay.
			body := strings.ReplaceAll(tt.body, `"strict"`, strconv.Quote("strict-"+tt.name))
			req, err := http.NewRequest(tt.method, "http://"+in.httpAddr+"/v1/multi-card-payments", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if tt.contentType != "-" {
				req.Header.Set("Content-Type", tt.contentType)
			}
			resp, err := in.http.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			r := restResult{status: resp.StatusCode, header: resp.Header}
			r.raw, _ = io.ReadAll(resp.Body)
			if r.status != tt.want {
				t.Fatalf("%s with %q = %d %s, want %d", tt.method, tt.contentType, r.status, r.raw, tt.want)
			}
			if tt.want == http.StatusOK {
				return
			}
			if !strings.Contains(resp.Header.Get("Content-Type"), "application/json") || !strings.Contains(string(r.raw), `"code"`) || !strings.Contains(string(r.raw), `"message"`) {
				t.Errorf("error body %s (%s) is not a google.rpc.Status", r.raw, resp.Header.Get("Content-Type"))
			}
			if tt.want == http.StatusMethodNotAllowed && resp.Header.Get("Allow") != "GET, POST" {
				t.Errorf("Allow = %q, want GET, POST", resp.Header.Get("Allow"))
			}
		})
	}
	if n := len(p.Requests()); n != 4 {
		t.Errorf("provider saw %d requests, want 4 (the accepted ones)", n)
	}
}

// TestRESTRefusalsSayNotSent checks that every REST refusal made before
// anything was sent, by paymentsd's own checks or by the gateway reading
// the body, carries ErrorInfo REQUEST_NOT_SENT in its google.rpc.Status
// body, as a gRPC error does: paymentsd did not read the key's record, so
// it can't say no payment exists. A lookup's refusal carries no reason,
// since it says nothing about the payment looked up.
func TestRESTRefusalsSayNotSent(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	in := start(t, with(sandboxEnv(p), "PAYMENTS_MAX_REQUEST_BYTES", "2048", "PAYMENTS_HTTP_READ_TIMEOUT", "1s"))
	body := validBody("refused")
	post := func(header, body string) string {
		return "POST /v1/multi-card-payments HTTP/1.1\r\nHost: paymentsd\r\n" + header + "\r\n" + body
	}
	chunk := func(b string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(b), b) }
	tests := []struct {
		name       string
		request    string
		wantStatus int
		wantCode   codes.Code
		wantReason string
	}{
		{"not sent as JSON", post("Content-Type: text/plain\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n", body),
			http.StatusUnsupportedMediaType, codes.InvalidArgument, service.ReasonNotSent},
		{"declared over the size limit", post("Content-Type: application/json\r\nContent-Length: 4096\r\n", body),
			http.StatusRequestEntityTooLarge, codes.InvalidArgument, service.ReasonNotSent},
		{"chunked over the size limit", post("Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n", chunk(strings.Repeat(" ", 4096))+"0\r\n\r\n"),
			http.StatusRequestEntityTooLarge, codes.InvalidArgument, service.ReasonNotSent},
		{"body unreadable", post("Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n", "zz\r\n"),
			http.StatusBadRequest, codes.InvalidArgument, service.ReasonNotSent},
		{"body too slow", post("Content-Type: application/json\r\nContent-Length: 100\r\n", "{"),
			http.StatusRequestTimeout, codes.DeadlineExceeded, service.ReasonNotSent},
		{"data after the JSON value", post("Content-Type: application/json\r\nContent-Length: "+strconv.Itoa(2*len(body))+"\r\n", body+body),
			http.StatusBadRequest, codes.InvalidArgument, service.ReasonNotSent},
		{"not JSON", post("Content-Type: application/json\r\nContent-Length: 15\r\n", "amountMoney=USD"),
			http.StatusBadRequest, codes.InvalidArgument, service.ReasonNotSent},
		{"unknown field", post("Content-Type: application/json\r\nContent-Length: 12\r\n", `{"amount":1}`),
			http.StatusBadRequest, codes.InvalidArgument, service.ReasonNotSent},
		{"lookup not sent as JSON", "GET /v1/multi-card-payments/refused HTTP/1.1\r\nHost: paymentsd\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi",
			http.StatusUnsupportedMediaType, codes.InvalidArgument, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			conn, err := net.Dial("tcp", in.httpAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(time.Minute)) // a guard against a hang
			io.WriteString(conn, tt.request)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			defer resp.Body.Close()
			r := restResult{status: resp.StatusCode}
			r.raw, _ = io.ReadAll(resp.Body)
			if r.status != tt.wantStatus || restCode(r) != tt.wantCode || restReason(r) != tt.wantReason {
				t.Errorf("answer = %d, code %v, reason %q; want %d, %v, %q (body %s)", r.status, restCode(r), restReason(r), tt.wantStatus, tt.wantCode, tt.wantReason, r.raw)
			}
		})
	}
	t.Cleanup(func() {
		if n := len(p.Requests()); n != 0 {
			t.Errorf("provider saw %d requests, want 0", n)
		}
	})
}

// TestSlowBodyCutOffOnEveryPath trickles a request body, a byte every
// 100ms, to paths on the REST port that read it and paths that don't
// (net/http drains up to 256 KiB of an unread body before it answers):
// with PAYMENTS_HTTP_READ_TIMEOUT=1s each is answered and its connection
// closed, instead of being held for as long as the sender keeps trickling.
func TestSlowBodyCutOffOnEveryPath(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	in := start(t, with(sandboxEnv(p), "PAYMENTS_HTTP_READ_TIMEOUT", "1s"))
	tests := []struct {
		name, method, path string
		length             int // the declared Content-Length
		want               int
	}{
		{"payment", "POST", "/v1/multi-card-payments", 1000, http.StatusRequestTimeout},
		{"payment over the size limit", "POST", "/v1/multi-card-payments", 100000, http.StatusRequestEntityTooLarge},
		{"payments list", "GET", "/v1/multi-card-payments", 1000, http.StatusRequestTimeout},
		{"healthz", "GET", "/healthz", 1000, http.StatusOK},
		{"readyz", "GET", "/readyz", 1000, http.StatusOK},
		{"metrics", "POST", "/metrics", 1000, http.StatusMethodNotAllowed},
		{"openapi", "GET", "/openapi.json", 1000, http.StatusOK},
		{"unknown path", "POST", "/nowhere", 1000, http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			conn, err := net.Dial("tcp", in.httpAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// A guard against a hang, not a timed assertion: at a byte
			// every 100ms the body would take 100s to arrive whole (the
			// one over the size limit hours), so an answer before the
			// guard is the read timeout's, however long the machine takes
			// to give it.
			conn.SetReadDeadline(time.Now().Add(time.Minute))
			fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: paymentsd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", tt.method, tt.path, tt.length)
			stop := make(chan struct{})
			var trickle sync.WaitGroup
			defer trickle.Wait()
			defer close(stop)
			trickle.Go(func() {
				tick := time.NewTicker(100 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					if _, err := conn.Write([]byte{' '}); err != nil {
						return
					}
				}
			})
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%s %s with a trickled body: no answer: %v", tt.method, tt.path, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("%s %s with a trickled body = %d, want %d", tt.method, tt.path, resp.StatusCode, tt.want)
			}
			// Whatever follows on the wire is the rest of the body, so the
			// connection must end here.
			if n, err := br.Read(make([]byte, 1)); err == nil || isTimeout(err) {
				t.Errorf("%s %s with a trickled body: connection still open after the answer (read %d bytes, %v)", tt.method, tt.path, n, err)
			}
		})
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestKeyControlCharacters checks that an idempotency key with an ASCII
// control character is refused over both transports, naming the field.
func TestKeyControlCharacters(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	in := start(t, sandboxEnv(p))
	for _, tt := range []struct{ name, key, jsonKey string }{
		{"NUL", "k\x00ey", `k\u0000ey`},
		{"CR", "k\rey", `k\rey`},
		{"LF", "k\ney", `k\ney`},
		{"tab", "k\tey", `k\tey`},
		{"DEL", "k\x7fey", `k\u007fey`},
		{"unit separator", "k\x1fey", `k\u001fey`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := in.client.CreateMultiCardPayment(t.Context(), validRequest(tt.key))
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !contains(violatedFields(st), "idempotency_key") {
				t.Errorf("CreateMultiCardPayment(key %q) = %v, fields %v; want INVALID_ARGUMENT naming idempotency_key", tt.key, err, violatedFields(st))
			}
			r := in.rest(t, validBody(tt.jsonKey), nil)
			if r.status != http.StatusBadRequest || !strings.Contains(string(r.raw), "idempotency_key") {
				t.Errorf("REST key %q = %d %s, want 400 naming idempotency_key", tt.key, r.status, r.raw)
			}
		})
	}
	if n := len(p.Requests()); n != 0 {
		t.Errorf("provider saw %d requests, want 0", n)
	}
}

// TestLongKeyLogged checks that a 60 KB idempotency key is logged as a
// bounded prefix and a hash of the whole key.
func TestLongKeyLogged(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	in := start(t, sandboxEnv(p))
	key := strings.Repeat("k", 60<<10)
	if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest(key)); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(key))
	line := in.logs.waitFor(t, "call", nil)
	if got, _ := line["idempotency_key"].(string); len(got) > 64 || !strings.HasPrefix(key, got) || got == "" {
		t.Errorf("logged idempotency_key has %d bytes, want a prefix of at most 64", len(got))
	}
	if got := line["idempotency_key_sha256"]; got != hex.EncodeToString(sum[:6]) {
		t.Errorf("idempotency_key_sha256 = %v, want %s", got, hex.EncodeToString(sum[:6]))
	}
	if n := len(in.logs.String()); n > 8<<10 {
		t.Errorf("the log holds %d bytes after one call with a 60 KB key", n)
	}
}

// TestDrainDeadline checks that a payment cut off by the drain deadline
// ends with paymentsd's own status: UNAVAILABLE with ErrorInfo
// PAYMENT_OUTCOME_UNKNOWN (the request was sent), over both ports.
func TestDrainDeadline(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	hold := make(chan struct{})
	defer close(hold)
	arrived := make(chan struct{}, 2)
	p.SetScript(func(int, simulator.Request) simulator.Reply {
		arrived <- struct{}{}
		return simulator.Reply{Wait: hold, Status: 200, Body: okBody}
	})
	// The configuration refuses an upstream timeout longer than the drain,
	// so only a call held some other way outlives it; the hard stop is the
	// safety net for that, and this reaches it by lifting the timeout.
	in := startConfigured(t, with(sandboxEnv(p), "PAYMENTS_SHUTDOWN_TIMEOUT", "300ms", "PAYMENTS_UPSTREAM_TIMEOUT", "300ms"), nil,
		func(c *config.Config) { c.UpstreamTimeout = time.Minute })
	grpcDone := make(chan error, 1)
	go func() {
		_, err := in.client.CreateMultiCardPayment(context.Background(), validRequest("cut-off-grpc"))
		grpcDone <- err
	}()
	restDone := make(chan restOutcome, 1)
	go func() { restDone <- postRESTNoFatal(in, validBody("cut-off-rest")) }()
	<-arrived
	<-arrived
	if err := in.stop(); err != nil {
		t.Errorf("run() = %v, want nil", err)
	}
	st := status.Convert(<-grpcDone)
	if st.Code() != codes.Unavailable || reasonOf(st) != service.ReasonOutcomeUnknown {
		t.Errorf("gRPC payment cut off by the drain = %v %q, reason %q; want UNAVAILABLE, %s", st.Code(), st.Message(), reasonOf(st), service.ReasonOutcomeUnknown)
	}
	r := <-restDone
	if r.err != nil || r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.raw), service.ReasonOutcomeUnknown) {
		t.Errorf("REST payment cut off by the drain = %d %s, %v; want 503 with %s", r.status, r.raw, r.err, service.ReasonOutcomeUnknown)
	}
}

// TestWatchStreamsHaveTheirOwnCap opens service.MaxWatchStreams watches
// with PAYMENTS_MAX_IN_FLIGHT at 2: payments still go through, the next
// watch gets RESOURCE_EXHAUSTED, and closing a watch frees its slot.
func TestWatchStreamsHaveTheirOwnCap(t *testing.T) {
	t.Parallel()
	// --simulate: every caller reads events (see TestEventsOnlyForReaders).
	in := start(t, with(webhookEnv(t), "PAYMENTS_MAX_IN_FLIGHT", "2"), "--simulate")
	events := paymentsv1.NewProviderEventsServiceClient(in.conn)
	watch := func(ctx context.Context) error {
		stream, err := events.WatchProviderEvents(ctx, &paymentsv1.WatchProviderEventsRequest{})
		if err != nil {
			return err
		}
		// An open watch sends its headers (the request ID) at once; a
		// refused one ends with no headers, and Recv has its status.
		md, err := stream.Header()
		if err != nil {
			return err
		}
		if md == nil {
			_, err := stream.Recv()
			return err
		}
		return nil
	}
	cancels := make([]context.CancelFunc, service.MaxWatchStreams)
	for i := range cancels {
		ctx, cancel := context.WithCancel(t.Context())
		cancels[i] = cancel
		if err := watch(ctx); err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
	}
	defer func() {
		for _, cancel := range cancels {
			cancel()
		}
	}()

	for _, key := range []string{"with-watches-1", "with-watches-2", "with-watches-3"} {
		if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest(key)); err != nil {
			t.Errorf("CreateMultiCardPayment(%s) with %d watches open = %v, want OK", key, service.MaxWatchStreams, err)
		}
	}
	over, cancelOver := context.WithCancel(t.Context())
	defer cancelOver()
	if err := watch(over); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("watch over the cap = %v, want ResourceExhausted", err)
	}

	// The slot comes back once the server sees the cancellation, which
	// nothing outside it signals: try again until it does.
	cancels[0]()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithCancel(t.Context())
		err := watch(ctx)
		if err == nil {
			cancels[0] = cancel
			break
		}
		cancel()
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("watch after one closed = %v, want OK", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("a closed watch's slot did not come back within 30s")
		}
		<-tick.C
	}
}

// TestMetricsPortServesOnlyMetrics: the deploy NetworkPolicy admitted
// Prometheus to the HTTP port for /metrics, and a NetworkPolicy admits by
// port, so the scraper could also take payments and read the webhook inbox
// there. PAYMENTS_METRICS_ADDR serves /metrics alone, for the scraper.
func TestMetricsPortServesOnlyMetrics(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	in := start(t, with(sandboxEnv(p), "PAYMENTS_METRICS_ADDR", "127.0.0.1:0"))
	addr, _ := in.logs.lines("serving")[0]["metrics_addr"].(string)
	if addr == "" {
		t.Fatalf("the serving line has no metrics_addr:\n%s", in.logs.String())
	}
	get := func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, "http://"+addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, body := get(http.MethodGet, "/metrics", ""); status != http.StatusOK || !strings.Contains(body, "paymentsd_") {
		t.Errorf("GET /metrics on the metrics port = %d, want 200 with paymentsd's series", status)
	}
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPost, "/v1/multi-card-payments", validBody("metrics-port-1")},
		{http.MethodGet, "/v1/multi-card-payments/metrics-port-1", ""},
		{http.MethodGet, "/v1/provider-events", ""},
		{http.MethodGet, "/readyz", ""},
		{http.MethodGet, "/openapi.json", ""},
	} {
		if status, _ := get(c.method, c.path, c.body); status != http.StatusNotFound && status != http.StatusMethodNotAllowed {
			t.Errorf("%s %s on the metrics port = %d, want 404 or 405", c.method, c.path, status)
		}
	}
	if n := len(p.AllKeyStats()); n != 0 {
		t.Errorf("the provider got requests for %d keys through the metrics port, want 0", n)
	}
	// /metrics stays on the HTTP port too.
	resp, err := http.Get("http://" + in.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /metrics on the HTTP port = %d, want 200", resp.StatusCode)
	}
}

// TestMethodNotAllowedTrailingSlash: a POST to the payments path with a
// trailing slash is not a payment (the gateway routes it as a lookup with
// an empty key): the 405 it gets must not tell the caller to use POST.
func TestMethodNotAllowedTrailingSlash(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	in := start(t, sandboxEnv(p))
	req, err := http.NewRequest(http.MethodPost, "http://"+in.httpAddr+"/v1/multi-card-payments/", strings.NewReader(validBody("slash-key")))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := in.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	allow := resp.Header.Get("Allow")
	if resp.StatusCode == http.StatusMethodNotAllowed && strings.Contains(allow, "POST") {
		t.Errorf("POST /v1/multi-card-payments/ = 405 with Allow %q: a POST told to use POST", allow)
	}
	if resp.StatusCode == http.StatusOK {
		t.Errorf("POST /v1/multi-card-payments/ = 200, want a refusal")
	}
	if ks := p.KeyStats("slash-key"); ks.Requests != 0 {
		t.Errorf("the provider got %d requests, want none", ks.Requests)
	}
}
