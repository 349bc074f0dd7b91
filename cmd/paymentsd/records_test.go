package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
)

// idempotentProvider is a sandbox fake that remembers payments by key.
func idempotentProvider(t *testing.T) *simulator.Server {
	t.Helper()
	p := fakeProvider(t, "sandbox")
	p.Idempotent(true)
	return p
}

// getREST GETs path on the instance's HTTP port.
func (in *instance) get(t *testing.T, path string) restResult {
	t.Helper()
	resp, err := in.http.Get("http://" + in.httpAddr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading reply: %v", path, err)
	}
	r := restResult{status: resp.StatusCode, header: resp.Header, raw: raw}
	json.Unmarshal(raw, &r.body)
	return r
}

// waitForState polls the record of key until it is in want, which
// settlement brings about in the background.
func waitForState(t *testing.T, in *instance, key string, want paymentsv1.PaymentState, within time.Duration) *paymentsv1.GetMultiCardPaymentResponse {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got, err := in.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
		if err == nil && got.GetState() == want {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("GetMultiCardPayment(%q) = %v, %v; want state %v within %v", key, got.GetState(), err, want, within)
		}
		time.Sleep(20 * time.Millisecond) // polling the record: settlement has no other signal
	}
}

func TestReplayAnswersFromTheRecord(t *testing.T) {
	t.Parallel()
	p := idempotentProvider(t)
	in := start(t, sandboxEnv(p))

	first, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-replay"))
	if err != nil {
		t.Fatalf("CreateMultiCardPayment() = %v", err)
	}
	if first.GetReplayed() {
		t.Errorf("first call replayed = true, want false")
	}
	again, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-replay"))
	if err != nil {
		t.Fatalf("CreateMultiCardPayment(again) = %v", err)
	}
	if !again.GetReplayed() {
		t.Errorf("second call replayed = false, want true")
	}
	if string(again.GetPaymentJson()) != string(first.GetPaymentJson()) || again.GetProviderHttpStatus() != first.GetProviderHttpStatus() {
		t.Errorf("replay = %s %d, want the original %s %d", again.GetPaymentJson(), again.GetProviderHttpStatus(), first.GetPaymentJson(), first.GetProviderHttpStatus())
	}
	// REST replays the same record, with the provider's exact bytes.
	r := in.rest(t, validBody("k-replay"), nil)
	if r.status != http.StatusOK || r.body["replayed"] != true {
		t.Fatalf("REST replay = %d %s, want 200 with replayed true", r.status, r.raw)
	}
	if !strings.Contains(string(r.raw), `"payment":`+string(first.GetPaymentJson())) {
		t.Errorf("REST replay body %s does not hold the provider's reply %s exactly", r.raw, first.GetPaymentJson())
	}
	if n := len(p.Requests()); n != 1 {
		t.Errorf("provider received %d requests, want 1 (replays must not call it)", n)
	}

	// The log line says the call was replayed.
	var replayed int
	for _, l := range in.logs.lines("call") {
		if l["replayed"] == true {
			replayed++
		}
	}
	if replayed != 2 {
		t.Errorf("call log lines with replayed=true: %d, want 2", replayed)
	}
}

func TestReusedKeyIsRefused(t *testing.T) {
	t.Parallel()
	p := idempotentProvider(t)
	in := start(t, sandboxEnv(p))

	if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-reuse")); err != nil {
		t.Fatalf("CreateMultiCardPayment() = %v", err)
	}
	other := validRequest("k-reuse")
	other.AmountMoney.Amount = 9999
	_, err := in.client.CreateMultiCardPayment(t.Context(), other)
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition {
		t.Fatalf("CreateMultiCardPayment(other amount) code = %v, want FailedPrecondition", st.Code())
	}
	checkReason(t, st, "IDEMPOTENCY_KEY_REUSED")
	if !strings.Contains(st.Message(), "k-reuse") {
		t.Errorf("message %q does not name the key", st.Message())
	}

	r := in.rest(t, `{"amountMoney":{"currency":"EUR","amount":1250},"idempotencyKey":"k-reuse"}`, nil)
	if r.status != http.StatusUnprocessableEntity {
		t.Errorf("REST reuse status = %d, want 422: %s", r.status, r.raw)
	}
	if got := restReason(r); got != "IDEMPOTENCY_KEY_REUSED" {
		t.Errorf("REST reuse reason = %q, want IDEMPOTENCY_KEY_REUSED", got)
	}
	if n := len(p.Requests()); n != 1 {
		t.Errorf("provider received %d requests, want 1: a reused key must not reach it", n)
	}
}

// concurrentCalls makes n calls with one key, spread over clients, while
// the provider holds its reply until every call has started, and returns
// their responses.
func concurrentCalls(t *testing.T, p *simulator.Server, clients []paymentsv1.PaymentsServiceClient, key string, n int) []*paymentsv1.CreateMultiCardPaymentResponse {
	t.Helper()
	release := make(chan struct{})
	arrived := make(chan struct{}, n)
	p.SetScript(func(int, simulator.Request) simulator.Reply {
		arrived <- struct{}{}
		return simulator.Reply{Wait: release}
	})
	var wg sync.WaitGroup
	resps := make([]*paymentsv1.CreateMultiCardPaymentResponse, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			resps[i], errs[i] = clients[i%len(clients)].CreateMultiCardPayment(ctx, validRequest(key))
		})
	}
	<-arrived // one request is at the provider; the others wait on it
	close(release)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	return resps
}

func checkOneInFlight(t *testing.T, p *simulator.Server, key string, resps []*paymentsv1.CreateMultiCardPaymentResponse) {
	t.Helper()
	if got := p.MaxInFlight(key); got != 1 {
		t.Errorf("provider saw %d requests for the key in flight at once, want 1", got)
	}
	if got := p.Created(); got != 1 {
		t.Errorf("provider created %d payments, want 1", got)
	}
	fresh := 0
	for _, r := range resps {
		if r == nil {
			continue
		}
		if !r.GetReplayed() {
			fresh++
		}
		if string(r.GetPaymentJson()) != string(resps[0].GetPaymentJson()) {
			t.Errorf("answers differ: %s and %s", r.GetPaymentJson(), resps[0].GetPaymentJson())
		}
	}
	if fresh != 1 {
		t.Errorf("%d calls answered by the provider, want 1 (the rest from the record)", fresh)
	}
}

func TestOneRequestInFlightPerKey(t *testing.T) {
	t.Parallel()
	p := idempotentProvider(t)
	in := start(t, sandboxEnv(p))
	resps := concurrentCalls(t, p, []paymentsv1.PaymentsServiceClient{in.client}, "k-16", 16)
	checkOneInFlight(t, p, "k-16", resps)
}

func TestOneRequestInFlightAcrossReplicas(t *testing.T) {
	t.Parallel()
	p := idempotentProvider(t)
	env := with(sandboxEnv(p), "PAYMENTS_DATABASE_URL", storetest.PostgresURL(t))
	a, b := start(t, env), start(t, env)
	resps := concurrentCalls(t, p, []paymentsv1.PaymentsServiceClient{a.client, b.client}, "k-16-pg", 16)
	checkOneInFlight(t, p, "k-16-pg", resps)
}

func TestInProgressPastTheDeadlineIsAborted(t *testing.T) {
	t.Parallel()
	p := idempotentProvider(t)
	in := start(t, sandboxEnv(p))
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	p.SetScript(simulator.Sequence(simulator.Reply{Wait: release}))
	p.SetScript(func(n int, _ simulator.Request) simulator.Reply {
		if n == 1 {
			arrived <- struct{}{}
			return simulator.Reply{Wait: release}
		}
		return simulator.Reply{}
	})
	first := make(chan error, 1)
	go func() {
		_, err := in.client.CreateMultiCardPayment(context.Background(), validRequest("k-busy"))
		first <- err
	}()
	<-arrived

	// paymentsd answers 250 ms before this deadline (a quarter of a
	// shorter one), leaving room for a busy machine.
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	_, err := in.client.CreateMultiCardPayment(ctx, validRequest("k-busy"))
	st := status.Convert(err)
	if st.Code() != codes.Aborted {
		t.Fatalf("second call code = %v, want Aborted", st.Code())
	}
	checkReason(t, st, "PAYMENT_IN_PROGRESS")
	if retryDelay(st) <= 0 {
		t.Errorf("second call has no RetryInfo")
	}

	// Over REST the same is a 409.
	hdr := http.Header{"Grpc-Timeout": {"1000m"}}
	if r := in.rest(t, validBody("k-busy"), hdr); r.status != http.StatusConflict || restReason(r) != "PAYMENT_IN_PROGRESS" {
		t.Errorf("REST while in progress = %d %q, want 409 PAYMENT_IN_PROGRESS", r.status, restReason(r))
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first call = %v", err)
	}
	if n := len(p.Requests()); n != 1 {
		t.Errorf("provider received %d requests, want 1", n)
	}
}

func TestNotCreatedIsTriedAgain(t *testing.T) {
	t.Parallel()
	p := idempotentProvider(t)
	in := start(t, sandboxEnv(p))
	p.SetScript(simulator.Sequence(simulator.Reply{Status: http.StatusUnauthorized, Body: []byte(`{"error":"revoked"}`)}))

	_, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-again"))
	if st := status.Convert(err); st.Code() != codes.Unauthenticated {
		t.Fatalf("first call code = %v, want Unauthenticated", st.Code())
	}
	got, err := in.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-again"})
	if err != nil || got.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED {
		t.Fatalf("GetMultiCardPayment() = %v, %v; want NOT_CREATED", got.GetState(), err)
	}
	// The operator fixed the key: the same key now makes a new attempt.
	resp, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-again"))
	if err != nil {
		t.Fatalf("second call = %v, want success", err)
	}
	if resp.GetReplayed() {
		t.Errorf("second call replayed = true, want a new attempt")
	}
	if n := len(p.Requests()); n != 2 {
		t.Errorf("provider received %d requests, want 2", n)
	}
}

func TestLookup(t *testing.T) {
	t.Parallel()
	p := idempotentProvider(t)
	in := start(t, sandboxEnv(p))
	key := "order 7/attempt 1" // a space and a slash, percent-encoded over REST
	before := time.Now().Add(-time.Second)
	created, err := in.client.CreateMultiCardPayment(t.Context(), validRequest(key))
	if err != nil {
		t.Fatalf("CreateMultiCardPayment() = %v", err)
	}
	got, err := in.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
	if err != nil {
		t.Fatalf("GetMultiCardPayment() = %v", err)
	}
	if got.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED ||
		got.GetRequest().GetAmountMoney().GetAmount() != 1250 || got.GetRequest().GetAmountMoney().GetCurrency() != "USD" ||
		got.GetRequest().GetIdempotencyKey() != key ||
		string(got.GetPaymentJson()) != string(created.GetPaymentJson()) ||
		got.GetProviderHttpStatus() != created.GetProviderHttpStatus() ||
		got.GetAttempts() != 1 || got.GetPayment() == nil ||
		got.GetCreateTime().AsTime().Before(before) || got.GetUpdateTime().AsTime().Before(got.GetCreateTime().AsTime()) ||
		got.GetEnvironment() != paymentsv1.Environment_ENVIRONMENT_SANDBOX {
		t.Errorf("GetMultiCardPayment() = %v, want the succeeded record of %v", got, created)
	}

	r := in.get(t, "/v1/multi-card-payments/"+url.PathEscape(key))
	if r.status != http.StatusOK || r.body["state"] != "PAYMENT_STATE_SUCCEEDED" {
		t.Fatalf("REST lookup = %d %s, want 200 SUCCEEDED", r.status, r.raw)
	}
	if !strings.Contains(string(r.raw), `"payment":`+string(created.GetPaymentJson())) {
		t.Errorf("REST lookup %s does not hold the provider's reply exactly", r.raw)
	}
	if _, ok := r.body["paymentJson"]; ok {
		t.Errorf("REST lookup has paymentJson; REST gives payment exactly instead")
	}

	_, err = in.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "never-used"})
	if code := status.Code(err); code != codes.NotFound {
		t.Errorf("GetMultiCardPayment(unknown) code = %v, want NotFound", code)
	}
	if r := in.get(t, "/v1/multi-card-payments/never-used"); r.status != http.StatusNotFound {
		t.Errorf("REST lookup of an unknown key = %d, want 404", r.status)
	}
	if n := len(p.Requests()); n != 1 {
		t.Errorf("provider received %d requests, want 1: lookups never call it", n)
	}
}

func TestSettlementAfterConnectionResets(t *testing.T) {
	t.Parallel()
	p := idempotentProvider(t)
	// A short quiet period: each lost reply leaves the key quiet for it.
	in := start(t, with(sandboxEnv(p), "PAYMENTS_UPSTREAM_TIMEOUT", "1s", "PAYMENTS_PROVIDER_QUIET_PERIOD", "1s"))
	// The provider creates the payment and every reply is lost: the call
	// can only say the outcome is unknown.
	reset := simulator.Reply{Fault: simulator.Reset}
	p.SetScript(simulator.Sequence(reset, reset, reset))
	_, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-settle"))
	st := status.Convert(err)
	if st.Code() != codes.Unavailable {
		t.Fatalf("call code = %v, want Unavailable", st.Code())
	}
	checkReason(t, st, "PAYMENT_OUTCOME_UNKNOWN")

	// Nobody retries; settlement re-sends the recorded body and learns the
	// provider's answer.
	got := waitForState(t, in, "k-settle", paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED, 20*time.Second)
	if p.Created() != 1 {
		t.Errorf("provider created %d payments, want 1", p.Created())
	}
	reqs := p.Requests()
	for _, r := range reqs[1:] {
		if string(r.Body) != string(reqs[0].Body) {
			t.Errorf("settlement sent %s, want the recorded body %s byte for byte", r.Body, reqs[0].Body)
		}
	}
	if !strings.Contains(string(got.GetPaymentJson()), `"pay_sim_1"`) {
		t.Errorf("settled record holds %s, want the payment the first attempt created", got.GetPaymentJson())
	}
	// And a caller coming back now gets it from the record.
	resp, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-settle"))
	if err != nil || !resp.GetReplayed() {
		t.Errorf("call after settlement = %v, %v; want a replay", resp, err)
	}
}

// TestRefusalAfterUnknownStaysUnknown: a definite refusal of a later
// attempt proves nothing about an earlier one that may have created the
// payment.
func TestRefusalAfterUnknownStaysUnknown(t *testing.T) {
	t.Parallel()
	p := idempotentProvider(t)
	in := start(t, with(sandboxEnv(p), "PAYMENTS_UPSTREAM_MAX_ATTEMPTS", "1", "PAYMENTS_SETTLEMENT_WINDOW", "1h",
		"PAYMENTS_UPSTREAM_TIMEOUT", "1s", "PAYMENTS_PROVIDER_QUIET_PERIOD", "1s"))
	// The first request is lost; every later one, the callers' and
	// settlement's, is refused: 409, then 400.
	p.SetScript(func(n int, _ simulator.Request) simulator.Reply {
		switch n {
		case 1:
			return simulator.Reply{Fault: simulator.Reset}
		case 2:
			return simulator.Reply{Status: http.StatusConflict, Body: []byte(`{"error":"in flight"}`)}
		}
		return simulator.Reply{Status: http.StatusBadRequest, Body: []byte(`{"error":"no"}`)}
	})
	refused := 0
	for i := 0; refused < 2; i++ {
		if i == 20 {
			t.Fatalf("after %d calls the provider refused %d of them, want 2", i, refused)
		}
		_, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-409"))
		st := status.Convert(err)
		switch reasonOf(st) {
		case "PAYMENT_OUTCOME_UNKNOWN":
			if providerStatus(st) >= 400 {
				refused++
			}
		case "PAYMENT_IN_PROGRESS":
			// The first request's quiet period, or settlement at the
			// provider: wait as told.
		default:
			t.Fatalf("call %d = %v (%s), want PAYMENT_OUTCOME_UNKNOWN or PAYMENT_IN_PROGRESS: a refusal proves nothing about the first request", i+1, st.Code(), reasonOf(st))
		}
		got, gerr := in.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-409"})
		if gerr != nil || (got.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN && got.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_IN_PROGRESS) {
			t.Fatalf("after call %d: state %v, %v; want OUTCOME_UNKNOWN", i+1, got.GetState(), gerr)
		}
		time.Sleep(retryDelay(st)) // as the RetryInfo says
	}
}

// providerStatus is the provider's HTTP status in st's ProviderError, or 0.
func providerStatus(st *status.Status) int {
	for _, d := range st.Details() {
		if pe, ok := d.(*paymentsv1.ProviderError); ok {
			return int(pe.GetHttpStatus())
		}
	}
	return 0
}

func TestExactNumbersBeyondDoublePrecision(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	reply := `{"id":"pay_big","big":9007199254740993,"huge":12345678901234567891,"fraction":1.10,"nested":{"n":-9223372036854775809}}`
	p.SetScript(simulator.Always(simulator.Reply{Status: http.StatusCreated, Body: []byte(reply)}))
	in := start(t, sandboxEnv(p))

	resp, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-big"))
	if err != nil {
		t.Fatalf("CreateMultiCardPayment() = %v", err)
	}
	if string(resp.GetPaymentJson()) != reply {
		t.Errorf("payment_json = %s, want %s exactly", resp.GetPaymentJson(), reply)
	}
	for _, path := range []string{"POST", "/v1/multi-card-payments/k-big", "/v1/multi-card-payments/k-big-rest"} {
		var r restResult
		switch path {
		case "POST":
			r = in.rest(t, validBody("k-big-rest"), nil)
		default:
			r = in.get(t, path)
		}
		if r.status != http.StatusOK {
			t.Fatalf("%s = %d %s", path, r.status, r.raw)
		}
		if !strings.Contains(string(r.raw), `"payment":`+reply) {
			t.Errorf("%s = %s, want payment to be %s exactly", path, r.raw, reply)
		}
	}
}

func TestEnvironmentStamp(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		db   func(t testing.TB) string
	}{
		{"sqlite", storetest.SQLiteURL},
		{"postgres", storetest.PostgresURL},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := tt.db(t)
			sandbox := fakeProvider(t, "sandbox")
			in := start(t, with(sandboxEnv(sandbox), "PAYMENTS_DATABASE_URL", db))
			if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-stamp")); err != nil {
				t.Fatalf("CreateMultiCardPayment() = %v", err)
			}
			if err := in.stop(); err != nil {
				t.Fatalf("stop: %v", err)
			}

			live := fakeProvider(t, "live")
			env := with(liveEnv(t, live), "PAYMENTS_DATABASE_URL", db, "PAYMENTS_GRPC_ADDR", "127.0.0.1:0", "PAYMENTS_HTTP_ADDR", "127.0.0.1:0")
			var stderr strings.Builder
			err := run(t.Context(), []string{"paymentsd"}, envList(env), io.Discard, &stderr)
			if !errors.Is(err, store.ErrWrongEnvironment) {
				t.Fatalf("run(live on a sandbox database) = %v, want ErrWrongEnvironment", err)
			}
			if !strings.Contains(err.Error(), "PAYMENTS_DATABASE_URL") {
				t.Errorf("refusal %q does not name PAYMENTS_DATABASE_URL", err)
			}
			if len(live.Requests()) != 0 {
				t.Errorf("the live provider was called")
			}

			// Nor does --simulate, whose payments are not real.
			// (A paymentsd that starts serving instead is stopped after a
			// while, and fails the test.)
			env = with(env, "PAYMENTS_ENVIRONMENT", "sandbox")
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			err = run(ctx, []string{"paymentsd", "--simulate"}, envList(env), io.Discard, &stderr)
			if !errors.Is(err, store.ErrWrongEnvironment) {
				t.Fatalf("run(--simulate on a sandbox database) = %v, want ErrWrongEnvironment", err)
			}
		})
	}
}

// A database --simulate has used is refused by a real sandbox deployment.
func TestSimulatedDatabaseRefusedBySandbox(t *testing.T) {
	t.Parallel()
	db := storetest.SQLiteURL(t)
	sim := start(t, map[string]string{"PAYMENTS_DATABASE_URL": db}, "--simulate")
	if _, err := sim.client.CreateMultiCardPayment(t.Context(), validRequest("k-simulated")); err != nil {
		t.Fatalf("CreateMultiCardPayment(--simulate) = %v", err)
	}
	if err := sim.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	sandbox := fakeProvider(t, "sandbox")
	env := with(sandboxEnv(sandbox), "PAYMENTS_DATABASE_URL", db, "PAYMENTS_GRPC_ADDR", "127.0.0.1:0", "PAYMENTS_HTTP_ADDR", "127.0.0.1:0")
	// A paymentsd that starts serving instead is stopped after a while, and
	// fails the test.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err := run(ctx, []string{"paymentsd"}, envList(env), io.Discard, io.Discard)
	if !errors.Is(err, store.ErrWrongEnvironment) {
		t.Fatalf("run(sandbox on a simulated database) = %v, want ErrWrongEnvironment", err)
	}
}

func retryDelay(st *status.Status) time.Duration {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// TestSettlementGivesUpAfterTheWindow: a record whose outcome stays
// unknown past the settlement window is logged at error level once,
// counted, and never sent again, not even when its caller retries.
func TestSettlementGivesUpAfterTheWindow(t *testing.T) {
	t.Parallel()
	p := idempotentProvider(t)
	p.SetScript(simulator.Always(simulator.Reply{Fault: simulator.Reset}))
	in := start(t, with(sandboxEnv(p),
		"PAYMENTS_UPSTREAM_MAX_ATTEMPTS", "1",
		"PAYMENTS_UPSTREAM_BREAKER_FAILURES", "1000",
		"PAYMENTS_SETTLEMENT_WINDOW", "1500ms",
		"PAYMENTS_UPSTREAM_TIMEOUT", "500ms",
		"PAYMENTS_PROVIDER_QUIET_PERIOD", "1s",
	))
	_, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-window"))
	checkReason(t, status.Convert(err), "PAYMENT_OUTCOME_UNKNOWN")

	const gaveUp = "settlement window closed with the payment's outcome unknown; check the provider's dashboard"
	line := in.logs.waitFor(t, gaveUp, nil)
	if line["level"] != "ERROR" {
		t.Errorf("give-up line level = %v, want ERROR", line["level"])
	}
	// The key as the call line has it, so one grep finds both.
	calls := in.logs.lines("call")
	if len(calls) == 0 || line["idempotency_key"] != "k-window" || calls[0]["idempotency_key"] != line["idempotency_key"] ||
		calls[0]["idempotency_key_sha256"] != line["idempotency_key_sha256"] {
		t.Errorf("give-up line names the key %q (%v), want k-window as the call line has it", line["idempotency_key"], line["idempotency_key_sha256"])
	}
	families, _ := scrape(t, in)
	if v, _ := sample(families, "paymentsd_settlement_gave_up_total", nil); v != 1 {
		t.Errorf("paymentsd_settlement_gave_up_total = %v, want 1", v)
	}

	sent := len(p.Requests())
	_, err = in.client.CreateMultiCardPayment(t.Context(), validRequest("k-window"))
	st := status.Convert(err)
	checkReason(t, st, "PAYMENT_OUTCOME_UNKNOWN")
	if retryDelay(st) != 0 {
		t.Errorf("a retry past the window carries RetryInfo; retrying can't help")
	}
	got, err := in.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-window"})
	if err != nil || got.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN {
		t.Errorf("GetMultiCardPayment() = %v, %v; want OUTCOME_UNKNOWN", got.GetState(), err)
	}
	if n := len(p.Requests()); n != sent {
		t.Errorf("provider received %d more requests past the window, want none", n-sent)
	}
	if n := len(in.logs.lines(gaveUp)); n != 1 {
		t.Errorf("give-up logged %d times, want once", n)
	}
}

// TestDatabaseURLShownWithoutPassword: pgx reads a password from the URL's
// user info and from its query (password, sslpassword), and a password
// with an unescaped '#', '/' or '?' moves the parser's idea of where the
// host is. In none of these does the password reach the starting line or a
// refusal.
func TestDatabaseURLShownWithoutPassword(t *testing.T) {
	t.Parallel()
	const password = "PGPASS_SENTINEL_91c2e7"
	leaked := func(out string) bool {
		for range 2 {
			low := strings.ToLower(out)
			for i := 0; i+8 <= len(password); i++ {
				if strings.Contains(low, strings.ToLower(password[i:i+8])) {
					return true
				}
			}
			if u, err := url.PathUnescape(out); err == nil {
				out = u
			}
		}
		return false
	}
	for _, raw := range []string{
		"postgres://app:" + password + "@127.0.0.1:1/payments",
		"postgres://app:" + url.PathEscape(password+"/#?@") + "@127.0.0.1:1/payments",
		"postgres://app@127.0.0.1:1/payments?password=" + password + "&sslmode=disable",
		"postgres://app@127.0.0.1:1/payments?sslmode=disable&PASSWORD=" + password,
		"postgres://app@127.0.0.1:1/payments?sslpassword=" + password,
		"postgresql://app@127.0.0.1:1/payments?sslmode=disable&sslpassword=" + url.QueryEscape(password+"&="),
		"postgres://app:1234#" + password + "@127.0.0.1:1/payments",
		"postgres://app:#" + password + "@127.0.0.1:1/payments",
		"postgres://app:12/" + password + "@127.0.0.1:1/payments",
		"postgres://app:12?" + password + "@127.0.0.1:1/payments",
		"postgres://127.0.0.1:1/payments?user=alice@server&password=" + password,
		"postgres:///payments?host=/nonexistent/socket/dir&password=" + password,
	} {
		env := map[string]string{
			"PAYMENTS_GRPC_ADDR":    "127.0.0.1:0",
			"PAYMENTS_HTTP_ADDR":    "127.0.0.1:0",
			"PAYMENTS_DATABASE_URL": raw,
		}
		// A context already ended: run logs the starting line, if the
		// configuration is accepted, and stops at the first thing that
		// waits, connecting to the database, so nothing need listen or
		// resolve.
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		var stderr strings.Builder
		err := run(ctx, []string{"paymentsd", "--simulate"}, envList(env), io.Discard, &stderr)
		if err == nil {
			t.Fatalf("run() with an ended context = nil, want an error")
		}
		if leaked(err.Error()) || leaked(stderr.String()) {
			t.Errorf("the database password appears in the refusal or the logs:\n%v\n%s", err, stderr.String())
		}
	}
}

// TestDatabasePasswordNeverShown: a database URL's password appears in no
// log line, refusal or metric, whether paymentsd starts or can't.
func TestDatabasePasswordNeverShown(t *testing.T) {
	t.Parallel()
	const password = "PGPASS_SENTINEL_4b1d"
	leaked := func(out string) bool {
		for _, form := range []string{password, url.QueryEscape(password), strings.ToLower(password), "UEdQQVNTX1NFTlRJTkVM"} {
			if strings.Contains(out, form) {
				return true
			}
		}
		return false
	}
	withPassword := func(raw string) string {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(u.User.Username(), password)
		return u.String()
	}

	// Starts (the test server trusts loopback and ignores the password).
	p := fakeProvider(t, "sandbox")
	in := start(t, with(sandboxEnv(p), "PAYMENTS_DATABASE_URL", withPassword(storetest.PostgresURL(t))))
	if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-pw")); err != nil {
		t.Fatalf("CreateMultiCardPayment() = %v", err)
	}
	_, metrics := scrape(t, in)
	if leaked(in.logs.String()) || leaked(metrics) {
		t.Errorf("the database password appears in the logs or metrics")
	}

	// Can't start: nothing listens there, or the URL is malformed.
	for _, bad := range []string{
		"postgres://paymentsd:" + password + "@127.0.0.1:1/payments?connect_timeout=1",
		"postgres://paymentsd:" + password + "@127.0.0.1:notaport/payments",
		"postgres://paymentsd:" + password + "@127.0.0.1/payments?sslmode=bogus",
	} {
		env := with(sandboxEnv(p), "PAYMENTS_DATABASE_URL", bad, "PAYMENTS_GRPC_ADDR", "127.0.0.1:0", "PAYMENTS_HTTP_ADDR", "127.0.0.1:0")
		var stderr strings.Builder
		err := run(t.Context(), []string{"paymentsd"}, envList(env), io.Discard, &stderr)
		if err == nil {
			t.Fatalf("run() with an unusable database URL = nil, want a refusal")
		}
		if !strings.Contains(err.Error(), "PAYMENTS_DATABASE_URL") {
			t.Errorf("refusal %q does not name PAYMENTS_DATABASE_URL", err)
		}
		if leaked(err.Error()) || leaked(stderr.String()) {
			t.Errorf("the database password appears in the refusal or the logs: %v\n%s", err, stderr.String())
		}
	}
}
