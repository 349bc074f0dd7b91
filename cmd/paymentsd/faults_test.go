package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"example.com/paymentsd/internal/simulator"
)

// perKey scripts replies by attempt number within each idempotency key,
// so a gRPC call and a REST call with different keys see the same script.
// The last reply repeats.
func perKey(replies ...simulator.Reply) simulator.Script {
	var mu sync.Mutex
	seen := map[string]int{}
	return func(_ int, r simulator.Request) simulator.Reply {
		key := idempotencyKey(r.Body)
		mu.Lock()
		seen[key]++
		n := seen[key]
		mu.Unlock()
		if n > len(replies) {
			n = len(replies)
		}
		return replies[n-1]
	}
}

func idempotencyKey(body []byte) string {
	var b struct {
		IdempotencyKey string `json:"idempotencyKey"`
	}
	json.Unmarshal(body, &b)
	return b.IdempotencyKey
}

// attemptsFor returns the provider's requests with the idempotency key.
func attemptsFor(p *simulator.Server, key string) []simulator.Request {
	var out []simulator.Request
	for _, r := range p.Requests() {
		if idempotencyKey(r.Body) == key {
			out = append(out, r)
		}
	}
	return out
}

func reasonOf(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(interface{ GetReason() string }); ok {
			return info.GetReason()
		}
	}
	return ""
}

var (
	okBody   = []byte(`{"id":"pay_1","status":"COMPLETED"}`)
	big2xx   = []byte(`{"pad":"` + strings.Repeat("x", 4096) + `"}`)
	htmlPage = []byte("<html><body>502 Bad Gateway</body></html>")
)

// faultCase is a way the provider can fail a payment, and what paymentsd's
// caller must hear.
type faultCase struct {
	name         string
	replies      []simulator.Reply
	env          []string      // extra configuration
	deadline     time.Duration // the caller's; 0 for none
	wantCode     codes.Code
	wantREST     int
	wantAttempts int
	wantReason   string // for errors
	// retryAfter, if set, is the Retry-After the provider sent: its
	// second attempt must come no sooner.
	retryAfter   time.Duration
	wantCanceled bool // the provider saw the caller go away
}

const (
	notCreated = "PAYMENT_NOT_CREATED"
	unknown    = "PAYMENT_OUTCOME_UNKNOWN"
	inProgress = "PAYMENT_IN_PROGRESS"
)

// faultCases are the provider's failures TestFaults checks the answers
// to, and BenchmarkFaults times.
func faultCases() []faultCase {
	type R = simulator.Reply
	return []faultCase{
		// Any status but a 2xx or a refusal before processing may come
		// from something in front of the provider while it works on: the
		// request may still be there, so nothing follows it.
		{name: "503", replies: []R{{Status: 503}, {Status: 200, Body: okBody}},
			wantCode: codes.Unavailable, wantREST: 503, wantAttempts: 1, wantReason: unknown},
		{name: "408", replies: []R{{Status: 408}, {Status: 200, Body: okBody}},
			wantCode: codes.DeadlineExceeded, wantREST: 504, wantAttempts: 1, wantReason: unknown},
		{name: "500", replies: []R{{Status: 500}, {Status: 200, Body: okBody}},
			wantCode: codes.Internal, wantREST: 500, wantAttempts: 1, wantReason: unknown},
		{name: "504", replies: []R{{Status: 504}, {Status: 200, Body: okBody}},
			wantCode: codes.DeadlineExceeded, wantREST: 504, wantAttempts: 1, wantReason: unknown},
		{name: "429 with Retry-After seconds", replies: []R{{Status: 429, Header: http.Header{"Retry-After": {"1"}}}, {Status: 200, Body: okBody}},
			wantCode: codes.OK, wantREST: 200, wantAttempts: 2, retryAfter: time.Second},
		{name: "429 on every attempt", replies: []R{{Status: 429}},
			wantCode: codes.ResourceExhausted, wantREST: 429, wantAttempts: 3, wantReason: notCreated},
		// A retry the caller can't wait for still happens: the request is
		// paymentsd's, not the caller's, and the caller hears that it is
		// in progress (its retry gets the outcome).
		{name: "Retry-After past the deadline", replies: []R{{Status: 429, Header: http.Header{"Retry-After": {"4"}}}, {Status: 200, Body: okBody}},
			deadline: 1500 * time.Millisecond,
			wantCode: codes.DeadlineExceeded, wantREST: 504, wantAttempts: 1, wantReason: inProgress},
		{name: "400 is tried once", replies: []R{{Status: 400, Body: []byte(`{"error":"bad"}`)}},
			wantCode: codes.InvalidArgument, wantREST: 400, wantAttempts: 1, wantReason: notCreated},
		{name: "401 is tried once", replies: []R{{Status: 401}},
			wantCode: codes.Unauthenticated, wantREST: 401, wantAttempts: 1, wantReason: notCreated},
		{name: "403 is tried once", replies: []R{{Status: 403}},
			wantCode: codes.PermissionDenied, wantREST: 403, wantAttempts: 1, wantReason: notCreated},
		// A request lost after it was sent may still be at the provider:
		// nothing follows it until its quiet period is over.
		{name: "reset", replies: []R{{Fault: simulator.Reset}, {Status: 200, Body: okBody}},
			wantCode: codes.Unavailable, wantREST: 503, wantAttempts: 1, wantReason: unknown},
		{name: "EOF before a response", replies: []R{{Fault: simulator.Hangup}},
			wantCode: codes.Unavailable, wantREST: 503, wantAttempts: 1, wantReason: unknown},
		{name: "reply cut off mid-body", replies: []R{{Status: 200, Body: okBody, Fault: simulator.CutBody}},
			wantCode: codes.Unavailable, wantREST: 503, wantAttempts: 3, wantReason: unknown},
		{name: "cut off then whole", replies: []R{{Status: 200, Body: okBody, Fault: simulator.CutBody}, {Status: 200, Body: okBody}},
			wantCode: codes.OK, wantREST: 200, wantAttempts: 2},
		{name: "2xx HTML page", replies: []R{{Status: 200, Body: htmlPage}},
			wantCode: codes.Unknown, wantREST: 500, wantAttempts: 1, wantReason: unknown},
		{name: "2xx JSON array", replies: []R{{Status: 200, Body: []byte(`[{"id":"pay_1"}]`)}},
			wantCode: codes.Unknown, wantREST: 500, wantAttempts: 1, wantReason: unknown},
		{name: "2xx malformed JSON", replies: []R{{Status: 201, Body: []byte(`{"id":"pay_1",`)}},
			wantCode: codes.Unknown, wantREST: 500, wantAttempts: 1, wantReason: unknown},
		{name: "2xx empty body", replies: []R{{Status: 200}},
			wantCode: codes.Unknown, wantREST: 500, wantAttempts: 1, wantReason: unknown},
		{name: "2xx over the size limit", replies: []R{{Status: 200, Body: big2xx}},
			env:      []string{"PAYMENTS_UPSTREAM_MAX_RESPONSE_BYTES", "1024"},
			wantCode: codes.Unknown, wantREST: 500, wantAttempts: 1, wantReason: unknown},
		// The caller's deadline does not cut paymentsd's request off: the
		// provider would go on working on it anyway. The caller hears the
		// request is still at the provider; paymentsd waits on (here until
		// its upstream timeout) and records what it learns.
		{name: "slow provider past the caller's deadline", replies: []R{{Delay: time.Minute}},
			env:      []string{"PAYMENTS_UPSTREAM_TIMEOUT", "3s"},
			deadline: time.Second,
			wantCode: codes.DeadlineExceeded, wantREST: 504, wantAttempts: 1, wantReason: inProgress},
		{name: "slow provider past the upstream timeout", replies: []R{{Delay: time.Minute}},
			env:      []string{"PAYMENTS_UPSTREAM_TIMEOUT", "300ms"},
			wantCode: codes.DeadlineExceeded, wantREST: 504, wantAttempts: 1, wantReason: unknown, wantCanceled: true},
		{name: "upstream timeout shorter than the caller's deadline", replies: []R{{Delay: time.Minute}},
			env: []string{"PAYMENTS_UPSTREAM_TIMEOUT", "300ms"}, deadline: time.Minute,
			wantCode: codes.DeadlineExceeded, wantREST: 504, wantAttempts: 1, wantReason: unknown, wantCanceled: true},
		{name: "provider dribbling its body", replies: []R{{Status: 200, Body: okBody, Fault: simulator.Dribble, DribbleInterval: 100 * time.Millisecond}},
			env:      []string{"PAYMENTS_UPSTREAM_TIMEOUT", "3s"},
			deadline: time.Second,
			wantCode: codes.DeadlineExceeded, wantREST: 504, wantAttempts: 1, wantReason: inProgress},
	}
}

// TestFaults checks what a caller hears when the provider fails in each
// way, over gRPC and REST, and what the provider saw. How long each answer
// takes is BenchmarkFaults' figure, not an assertion here.
func TestFaults(t *testing.T) {
	t.Parallel()
	for _, tt := range faultCases() {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := fakeProvider(t, "sandbox")
			arrivals := arrivalTimes(p, perKey(tt.replies...))
			env := with(sandboxEnv(p), append([]string{"PAYMENTS_UPSTREAM_BREAKER_FAILURES", "1000"}, tt.env...)...)
			in := start(t, env)

			check := func(t *testing.T, transport, key string, code codes.Code, reason string) {
				t.Helper()
				if code != tt.wantCode {
					t.Errorf("%s: code = %v, want %v", transport, code, tt.wantCode)
				}
				if tt.wantCode != codes.OK && reason != tt.wantReason {
					t.Errorf("%s: ErrorInfo reason = %q, want %q", transport, reason, tt.wantReason)
				}
				attempts := attemptsFor(p, key)
				if len(attempts) != tt.wantAttempts {
					t.Errorf("%s: provider saw %d attempts, want %d", transport, len(attempts), tt.wantAttempts)
				}
				for i, a := range attempts {
					if a.Header.Get("X-Api-Key") != sandboxKey || !bytes.Equal(a.Body, attempts[0].Body) {
						t.Errorf("%s: attempt %d differs from the first: key or body changed", transport, i+1)
					}
				}
				// The wait the provider asked for is a floor, which no load
				// can make flaky: a retry may come later, never sooner.
				if at := arrivals(key); tt.retryAfter > 0 && len(at) >= 2 && at[1].Sub(at[0]) < tt.retryAfter {
					t.Errorf("%s: second attempt %v after the first, before its Retry-After of %v", transport, at[1].Sub(at[0]), tt.retryAfter)
				}
				if tt.wantCanceled {
					select {
					case <-p.Canceled():
					case <-time.After(time.Minute):
						t.Errorf("%s: the provider never saw the request cancelled", transport)
					}
				}
			}

			t.Run("gRPC", func(t *testing.T) {
				ctx := t.Context()
				if tt.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.deadline)
					defer cancel()
				}
				_, err := in.client.CreateMultiCardPayment(ctx, validRequest("grpc-"+tt.name))
				st := status.Convert(err)
				check(t, "gRPC", "grpc-"+tt.name, st.Code(), reasonOf(st))
			})
			t.Run("REST", func(t *testing.T) {
				r := in.rest(t, validBody("rest-"+tt.name), deadlineHeader(tt.deadline))
				if r.status != tt.wantREST {
					t.Errorf("REST: status = %d, want %d (%s)", r.status, tt.wantREST, r.raw)
				}
				code := codes.OK
				reason := ""
				if r.status != 200 {
					code = restCode(r)
					reason = restReason(r)
				}
				check(t, "REST", "rest-"+tt.name, code, reason)
			})

			// Whatever happened, the service still serves.
			p.SetScript(nil)
			if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("after-"+tt.name)); err != nil {
				t.Errorf("a good call after the fault = %v, want OK", err)
			}
		})
	}
}

// arrivalTimes scripts p with script, and returns a function that gives
// the times the provider received each attempt with a key.
func arrivalTimes(p *simulator.Server, script simulator.Script) func(key string) []time.Time {
	var mu sync.Mutex
	at := map[string][]time.Time{}
	p.SetScript(func(n int, r simulator.Request) simulator.Reply {
		key := idempotencyKey(r.Body)
		mu.Lock()
		at[key] = append(at[key], time.Now())
		mu.Unlock()
		return script(n, r)
	})
	return func(key string) []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return append([]time.Time(nil), at[key]...)
	}
}

// deadlineHeader is the gateway's header for a caller's deadline d, or nil
// for none.
func deadlineHeader(d time.Duration) http.Header {
	if d <= 0 {
		return nil
	}
	return http.Header{"Grpc-Timeout": {fmt.Sprintf("%dm", d.Milliseconds())}}
}

// restCode and restReason read the gateway's google.rpc.Status body.
func restCode(r restResult) codes.Code {
	var s struct {
		Code codes.Code `json:"code"`
	}
	json.Unmarshal(r.raw, &s)
	return s.Code
}

func restReason(r restResult) string {
	var s struct {
		Details []struct {
			Type   string `json:"@type"`
			Reason string `json:"reason"`
		} `json:"details"`
	}
	json.Unmarshal(r.raw, &s)
	for _, d := range s.Details {
		if strings.HasSuffix(d.Type, "google.rpc.ErrorInfo") {
			return d.Reason
		}
	}
	return ""
}

func TestProviderUnreachable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/v1"
	ln.Close()
	in := start(t, map[string]string{
		"PAYMENTS_SANDBOX_BASE_URL":          closed,
		"PAYMENTS_SANDBOX_API_KEY":           sandboxKey,
		"PAYMENTS_UPSTREAM_BREAKER_FAILURES": "1000",
	})
	_, err = in.client.CreateMultiCardPayment(t.Context(), validRequest("k-refused"))
	st := status.Convert(err)
	if st.Code() != codes.Unavailable || reasonOf(st) != "PAYMENT_NOT_CREATED" {
		t.Errorf("connection refused: code, reason = %v, %q, want Unavailable, PAYMENT_NOT_CREATED", st.Code(), reasonOf(st))
	}
	if r := in.rest(t, validBody("k-refused-rest"), nil); r.status != http.StatusServiceUnavailable {
		t.Errorf("connection refused: REST status = %d, want 503", r.status)
	}
}

func TestCircuitBreaker(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	p.SetScript(simulator.Always(simulator.Reply{Status: 503}))
	in := start(t, with(sandboxEnv(p),
		"PAYMENTS_UPSTREAM_MAX_ATTEMPTS", "1",
		"PAYMENTS_UPSTREAM_BREAKER_FAILURES", "3",
		"PAYMENTS_UPSTREAM_BREAKER_COOLDOWN", "1h",
	))
	for i := range 3 {
		in.client.CreateMultiCardPayment(t.Context(), validRequest(fmt.Sprint("k-brk-", i)))
	}
	seen := len(p.Requests())
	_, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-brk-open"))
	st := status.Convert(err)
	if st.Code() != codes.Unavailable || reasonOf(st) != "PAYMENT_NOT_CREATED" {
		t.Errorf("with the circuit open: code, reason = %v, %q, want Unavailable, PAYMENT_NOT_CREATED", st.Code(), reasonOf(st))
	}
	// The RetryInfo is what is left of the hour's cooldown: a retry
	// sooner would be refused again at once.
	if d := retryDelay(st); d <= 59*time.Minute || d > time.Hour {
		t.Errorf("with the circuit open: RetryInfo %v, want what is left of the 1h cooldown", d)
	}
	r := in.rest(t, validBody("k-brk-open-rest"), nil)
	if secs, _ := strconv.Atoi(r.header.Get("Retry-After")); r.status != http.StatusServiceUnavailable || secs < 3540 || secs > 3600 {
		t.Errorf("with the circuit open: REST %d, Retry-After %q; want 503 and what is left of the 1h cooldown, in seconds", r.status, r.header.Get("Retry-After"))
	}
	if n := len(p.Requests()) - seen; n != 0 {
		t.Errorf("with the circuit open the provider saw %d requests, want 0", n)
	}
}

// TestBurst sends several hundred concurrent payments over gRPC and REST
// with failures mixed in: each must end with a definite answer, and no
// reply may cross between calls.
func TestBurst(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	p.KeepRequests(false)
	// The simulated success echoes the request, so each caller can check
	// that the reply is its own.
	var mu sync.Mutex
	attempts := map[string]int{}
	p.SetScript(func(_ int, r simulator.Request) simulator.Reply {
		key := idempotencyKey(r.Body)
		mu.Lock()
		attempts[key]++
		n := attempts[key]
		mu.Unlock()
		var i int
		fmt.Sscanf(key[strings.LastIndex(key, "-")+1:], "%d", &i)
		switch i % 6 {
		case 0:
			if n == 1 {
				return simulator.Reply{Status: 503}
			}
		case 1:
			if n == 1 {
				return simulator.Reply{Fault: simulator.Reset}
			}
		case 2:
			return simulator.Reply{Status: 400, Body: []byte(`{"error":"scripted"}`)}
		case 3:
			return simulator.Reply{Status: 200, Body: []byte(`[]`)}
		case 4:
			return simulator.Reply{Delay: 20 * time.Millisecond}
		}
		return simulator.Reply{}
	})
	in := start(t, with(sandboxEnv(p), "PAYMENTS_UPSTREAM_BREAKER_FAILURES", "1000"))

	const calls = 400
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := range calls {
		wg.Go(func() {
			key := fmt.Sprintf("burst-%d", i)
			// A 503 or a reset may leave the request at the provider: its
			// outcome is unknown until the key's quiet period has passed.
			want := map[int]codes.Code{0: codes.Unavailable, 1: codes.Unavailable, 2: codes.InvalidArgument, 3: codes.Unknown, 4: codes.OK, 5: codes.OK}[i%6]
			var code codes.Code
			var echoed string
			if i%2 == 0 {
				resp, err := in.client.CreateMultiCardPayment(context.Background(), validRequest(key))
				code = status.Code(err)
				echoed = resp.GetPayment().GetFields()["request"].GetStructValue().GetFields()["idempotencyKey"].GetStringValue()
			} else {
				r := postRESTNoFatal(in, validBody(key))
				if r.err != nil {
					errs <- fmt.Errorf("%s: %v", key, r.err)
					return
				}
				code = codes.OK
				if r.status != 200 {
					code = restCode(r.restResult)
				}
				var reply struct {
					Payment struct {
						Request struct {
							IdempotencyKey string `json:"idempotencyKey"`
						} `json:"request"`
					} `json:"payment"`
				}
				json.Unmarshal(r.raw, &reply)
				echoed = reply.Payment.Request.IdempotencyKey
			}
			if code != want {
				errs <- fmt.Errorf("%s: code = %v, want %v", key, code, want)
			}
			if code == codes.OK && echoed != key {
				errs <- fmt.Errorf("%s: reply belongs to %q", key, echoed)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

type restOutcome struct {
	restResult
	err error
}

// postRESTNoFatal is postREST for goroutines other than the test's.
func postRESTNoFatal(in *instance, body string) restOutcome {
	resp, err := in.http.Post("http://"+in.httpAddr+"/v1/multi-card-payments", "application/json", strings.NewReader(body))
	if err != nil {
		return restOutcome{err: err}
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return restOutcome{err: err}
	}
	return restOutcome{restResult: restResult{status: resp.StatusCode, header: resp.Header, raw: buf.Bytes()}}
}
