package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/store/storetest"
)

// The tests of issue 14 run paymentsd as the built binary, against a fake
// provider that does what a real one would do and counts, per key, the
// requests it received, the most it worked on at once, the distinct
// bodies and the payments it made:
//
//   - it keeps working on a request after paymentsd stops waiting for it
//     (simulator.Stubborn), and
//   - it learns a key only when a request with it completes
//     (simulator.DedupOnCompletion), so two requests with one key at
//     once make two payments.
//
// Its callers do what paymentsd's answers tell them: retry the same key
// after the RetryInfo's delay, and give a key up only when told
// PAYMENT_NOT_CREATED (after which a real caller may pay again under a new
// key).

// honestProvider is the stubborn, late-deduplicating fake, answering after
// delay(key, n) for the n-th request with a key.
func honestProvider(t *testing.T, delay func(key string, n int) time.Duration) *simulator.Server {
	t.Helper()
	p := fakeProvider(t, "sandbox")
	p.KeepRequests(false)
	p.Stubborn(true)
	p.DedupOnCompletion(true)
	var mu sync.Mutex
	seen := map[string]int{}
	p.SetScript(func(_ int, r simulator.Request) simulator.Reply {
		key := idempotencyKey(r.Body)
		mu.Lock()
		seen[key]++
		n := seen[key]
		mu.Unlock()
		return simulator.Reply{Delay: delay(key, n)}
	})
	return p
}

// randomDelay is a delay function: up to max for every request.
func randomDelay(max time.Duration) func(string, int) time.Duration {
	return func(string, int) time.Duration { return rand.N(max) }
}

// answers tallies what the callers were told.
type answers struct {
	mu         sync.Mutex
	byReason   map[string]int
	notCreated map[string]bool // keys answered PAYMENT_NOT_CREATED
	paid       map[string]int  // keys answered OK and not replayed
	ok         map[string]bool // keys answered OK
	changed    chan struct{}   // closed and replaced on every answer
}

func newAnswers() *answers {
	return &answers{byReason: map[string]int{}, notCreated: map[string]bool{}, paid: map[string]int{}, ok: map[string]bool{}, changed: make(chan struct{})}
}

// count is how many answers had reason ("" for all).
func (a *answers) count(reason string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if reason != "" {
		return a.byReason[reason]
	}
	n := 0
	for _, c := range a.byReason {
		n += c
	}
	return n
}

// waitFor waits until n answers have reason ("" for any); after a minute
// it fails t, saying what it waited for.
func (a *answers) waitFor(t *testing.T, reason string, n int, what string) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		a.mu.Lock()
		changed := a.changed
		a.mu.Unlock()
		if a.count(reason) >= n {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("%s: %d answers %q in a minute, want %d; answers: %s", what, a.count(reason), reason, n, a.String())
		}
	}
}

func (a *answers) String() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return fmt.Sprint(a.byReason)
}

// callUntilSettled calls CreateMultiCardPayment for key with a deadline
// per call, as an honest caller: until OK, until PAYMENT_NOT_CREATED, or
// until ctx ends. It reports whether the key reached an answer.
func (a *answers) callUntilSettled(ctx context.Context, t *testing.T, client paymentsv1.PaymentsServiceClient, key string, deadline func() time.Duration) bool {
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, deadline())
		resp, err := client.CreateMultiCardPayment(cctx, validRequest(key))
		cancel()
		st := status.Convert(err)
		reason := reasonOf(st)
		if err == nil {
			reason = "OK"
		} else if reason == "" {
			reason = "no reason: " + st.Code().String()
		}
		a.mu.Lock()
		a.byReason[reason]++
		switch reason {
		case "OK":
			a.ok[key] = true
			if !resp.GetReplayed() {
				a.paid[key]++
			}
		case "PAYMENT_NOT_CREATED":
			a.notCreated[key] = true
		}
		close(a.changed)
		a.changed = make(chan struct{})
		a.mu.Unlock()
		switch reason {
		case "OK", "PAYMENT_NOT_CREATED":
			return true
		case "IDEMPOTENCY_KEY_REUSED", "IDEMPOTENCY_KEY_EXPIRED":
			t.Errorf("%s: %v (%s): the test never reuses a key", key, st.Code(), reason)
			return true
		}
		wait := min(max(retryDelay(st), 20*time.Millisecond), 5*time.Second)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	return false
}

// checkProvider checks what the provider saw of every key: one request at
// a time, one body, at most one payment; no payment for a key a caller was
// told PAYMENT_NOT_CREATED; exactly one for a key a caller was told OK;
// and at most one answer that was not a replay per key.
func checkProvider(t *testing.T, p *simulator.Server, a *answers) {
	t.Helper()
	// The provider finishes what it is working on first.
	deadline := time.Now().Add(30 * time.Second)
	for p.InFlight() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the provider is still working on %d requests", p.InFlight())
		}
		time.Sleep(50 * time.Millisecond) // the fake has no signal for idle
	}
	stats := p.AllKeyStats()
	a.mu.Lock()
	defer a.mu.Unlock()
	for key, ks := range stats {
		if ks.MaxInFlight > 1 {
			t.Errorf("%s: the provider had %d requests open at once, want 1", key, ks.MaxInFlight)
		}
		if ks.Charges > 1 {
			t.Errorf("%s: the provider made %d payments, want at most 1", key, ks.Charges)
		}
		if ks.Bodies > 1 {
			t.Errorf("%s: the provider saw %d different bodies, want 1", key, ks.Bodies)
		}
	}
	for key := range a.notCreated {
		if n := stats[key].Charges; n != 0 {
			t.Errorf("%s: a caller was told PAYMENT_NOT_CREATED, but the provider made %d payment(s) with it", key, n)
		}
	}
	for key := range a.ok {
		if n := stats[key].Charges; n != 1 {
			t.Errorf("%s: a caller was told OK, and the provider made %d payments with it, want 1", key, n)
		}
	}
	for key, n := range a.paid {
		if n > 1 {
			t.Errorf("%s: %d calls were answered by the provider (replayed=false), want at most 1", key, n)
		}
	}
}

// TestStoreStoppedMidLoad stops PostgreSQL (fast, then as a crash would)
// under a load of callers with short deadlines against a slow provider,
// and restarts it. No answer may say PAYMENT_NOT_CREATED for a key whose
// payment exists, and no key may be at the provider twice at once.
func TestStoreStoppedMidLoad(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the binary against a PostgreSQL server it stops")
	}
	for _, mode := range []string{"fast", "immediate"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			db := storetest.StartCluster(t)
			p := honestProvider(t, randomDelay(600*time.Millisecond))
			proc := startProcess(t, with(sandboxEnv(p),
				"PAYMENTS_DATABASE_URL", db.URL,
				"PAYMENTS_UPSTREAM_TIMEOUT", "1s",
				"PAYMENTS_PROVIDER_QUIET_PERIOD", "2s",
				"PAYMENTS_SETTLEMENT_WINDOW", "2m",
			))
			client := grpcClient(t, proc)
			a := newAnswers()

			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			var stopNew atomic.Bool
			var workers sync.WaitGroup
			var unsettled atomic.Int64
			for w := range 8 {
				workers.Go(func() {
					for i := 0; !stopNew.Load(); i++ {
						key := fmt.Sprintf("%s-w%d-%d", mode, w, i)
						if !a.callUntilSettled(ctx, t, client, key, func() time.Duration { return 300 * time.Millisecond }) {
							unsettled.Add(1)
						}
					}
				})
			}
			// A phase that fails the test stops the callers too.
			defer func() {
				stopNew.Store(true)
				cancel()
				workers.Wait()
			}()
			// Load with the store up, then down, then back: each phase
			// lasts until the callers have had answers enough to show it.
			a.waitFor(t, "OK", 16, "with the store up")
			db.Stop(mode)
			downAt := a.String()
			all, notSent := a.count(""), a.count("REQUEST_NOT_SENT")
			// Once paymentsd sees the store down, it refuses calls with
			// REQUEST_NOT_SENT; the callers carry on past that. The callers
			// above may all be retrying keys whose 2xx this process holds,
			// unwritten (answered PAYMENT_IN_PROGRESS without the store), so
			// a caller arrives now with a key of its own, whose claim must
			// reach the store.
			workers.Go(func() {
				if !a.callUntilSettled(ctx, t, client, mode+"-arrived", func() time.Duration { return 300 * time.Millisecond }) {
					unsettled.Add(1)
				}
			})
			a.waitFor(t, "REQUEST_NOT_SENT", notSent+1, "with the store down")
			a.waitFor(t, "", all+32, "with the store down")
			db.Start()
			a.waitFor(t, "OK", a.count("OK")+16, "with the store back")
			stopNew.Store(true)
			workers.Wait()
			if n := unsettled.Load(); n > 0 {
				t.Errorf("%d keys had no answer within 90s", n)
			}
			t.Logf("answers when the store stopped: %s; in all: %s", downAt, a.String())
			checkProvider(t, p, a)
		})
	}
}

// TestInFlightCapSaysNotSent: the in-flight cap reads no record, so its
// refusal of a key whose payment is at the provider says REQUEST_NOT_SENT,
// never PAYMENT_NOT_CREATED.
func TestInFlightCapSaysNotSent(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the binary")
	}
	p := fakeProvider(t, "sandbox")
	release := make(chan struct{})
	defer close(release)
	arrived := make(chan struct{}, 1)
	p.SetScript(func(int, simulator.Request) simulator.Reply {
		arrived <- struct{}{}
		return simulator.Reply{Wait: release}
	})
	proc := startProcess(t, with(sandboxEnv(p), "PAYMENTS_MAX_IN_FLIGHT", "1"))
	client := grpcClient(t, proc)
	go client.CreateMultiCardPayment(context.Background(), validRequest("capped"))
	<-arrived
	_, err := client.CreateMultiCardPayment(t.Context(), validRequest("capped"))
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || reasonOf(st) != "REQUEST_NOT_SENT" || retryDelay(st) <= 0 {
		t.Errorf("a call over the cap for a key at the provider = %v (%s, retry %v), want ResourceExhausted REQUEST_NOT_SENT with a RetryInfo", st.Code(), reasonOf(st), retryDelay(st))
	}
	r := postREST(t, http.DefaultClient, "http://"+proc.httpAddr, validBody("capped"), nil)
	if r.status != http.StatusTooManyRequests || restReason(r) != "REQUEST_NOT_SENT" {
		t.Errorf("REST over the cap = %d %s, want 429 REQUEST_NOT_SENT", r.status, restReason(r))
	}
}

// TestOneRequestPerKeyAtTheProvider: callers with deadlines far shorter
// than the provider's answers retry as RetryInfo says, and settlement
// re-sends in the background; the provider never has two requests with
// one key open at once, even when it is slower than the lease.
func TestOneRequestPerKeyAtTheProvider(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the binary")
	}
	tests := []struct {
		name  string
		env   []string
		delay func(key string, n int) time.Duration
		keys  int
	}{
		{
			// Answers take up to just under the quiet period.
			name:  "answers within the quiet period",
			env:   []string{"PAYMENTS_UPSTREAM_TIMEOUT", "1s", "PAYMENTS_PROVIDER_QUIET_PERIOD", "2s"},
			delay: randomDelay(1900 * time.Millisecond),
			keys:  12,
		},
		{
			// The first request for each key takes 7s, longer than the
			// lease (the 1s upstream timeout plus 5s): settlement and the
			// callers must wait out the quiet period, not the lease.
			name: "slower than the lease",
			env:  []string{"PAYMENTS_UPSTREAM_TIMEOUT", "1s", "PAYMENTS_PROVIDER_QUIET_PERIOD", "8s"},
			delay: func(_ string, n int) time.Duration {
				if n == 1 {
					return 7 * time.Second
				}
				return rand.N(200 * time.Millisecond)
			},
			keys: 3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := honestProvider(t, tt.delay)
			proc := startProcess(t, with(sandboxEnv(p), tt.env...))
			client := grpcClient(t, proc)
			a := newAnswers()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			var callers sync.WaitGroup
			for k := range tt.keys {
				key := fmt.Sprintf("overlap-%d", k)
				for range 3 {
					callers.Go(func() {
						if !a.callUntilSettled(ctx, t, client, key, func() time.Duration { return 300 * time.Millisecond }) {
							t.Errorf("%s: no answer within 90s", key)
						}
					})
				}
			}
			callers.Wait()
			t.Logf("answers: %s", a.String())
			checkProvider(t, p, a)
			for k := range tt.keys {
				if key := fmt.Sprintf("overlap-%d", k); !a.ok[key] {
					t.Errorf("%s was never paid", key)
				}
			}
		})
	}
}

// TestReplicasWithClocksApart runs two replicas on one PostgreSQL database,
// one with its clock 5s ahead and one 5s behind, calling the same keys
// through both at once; the database server's clock is an hour ahead of
// both, so a decision that read any clock but the server's would be far
// off. Leases go by the database's clock, so the two never both hold a
// key; each replica sees how far off it is, and says so.
func TestReplicasWithClocksApart(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the binary twice against a PostgreSQL server")
	}
	db, serverClock := storetest.PostgresURLWithClock(t)
	serverClock.Set(time.Hour)
	p := honestProvider(t, randomDelay(1500*time.Millisecond))
	env := with(sandboxEnv(p),
		"PAYMENTS_DATABASE_URL", db,
		"PAYMENTS_UPSTREAM_TIMEOUT", "1s",
		"PAYMENTS_PROVIDER_QUIET_PERIOD", "2s",
		"PAYMENTS_LOG_LEVEL", "warn",
	)
	ahead := startBinary(t, paymentsdTestBinary(t), with(env, "PAYMENTSD_TESTHOOK_CLOCK_OFFSET", "5s"))
	behind := startBinary(t, paymentsdTestBinary(t), with(env, "PAYMENTSD_TESTHOOK_CLOCK_OFFSET", "-5s"))
	clients := []paymentsv1.PaymentsServiceClient{grpcClient(t, ahead), grpcClient(t, behind)}

	a := newAnswers()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var callers sync.WaitGroup
	for k := range 10 {
		key := fmt.Sprintf("drift-%d", k)
		for c := range 4 {
			client := clients[c%2]
			callers.Go(func() {
				// Some callers wait long enough to see the other's
				// outcome; most give up quickly and retry.
				deadline := func() time.Duration { return 200*time.Millisecond + rand.N(2*time.Second) }
				if !a.callUntilSettled(ctx, t, client, key, deadline) {
					t.Errorf("%s: no answer within 90s", key)
				}
			})
		}
	}
	callers.Wait()
	t.Logf("answers: %s", a.String())
	checkProvider(t, p, a)

	for _, tt := range []struct {
		name string
		proc *process
		want float64
	}{{"ahead", ahead, 5 - 3600}, {"behind", behind, -5 - 3600}} {
		off := metricOf(t, tt.proc, "paymentsd_clock_offset_seconds")
		if off < tt.want-1 || off > tt.want+1 {
			t.Errorf("%s: paymentsd_clock_offset_seconds = %v, want about %v", tt.name, off, tt.want)
		}
		tt.proc.logs.waitFor(t, "this replica's clock differs from the record store's by more than a second; leases and settlement go by the store's clock, but fix the clock (NTP)", nil)
	}
}

// metricOf scrapes a process's /metrics for an unlabelled gauge or
// counter (the environment label aside).
func metricOf(t *testing.T, p *process, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	v, ok := sample(families, name, nil)
	if !ok {
		t.Fatalf("%s is not exported", name)
	}
	return v
}

// TestKeyAfterRetentionIsRefused lets retention delete records that
// succeeded, certainly created nothing, and were given up on past their
// settlement window; their tombstones then refuse the keys, with the same
// request or another, and nothing reaches the provider.
func TestKeyAfterRetentionIsRefused(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the binary")
	}
	for _, tt := range []struct {
		name string
		db   func(t testing.TB) string
	}{
		{"sqlite", storetest.SQLiteURL},
		{"postgres", storetest.PostgresURL},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := fakeProvider(t, "sandbox")
			p.SetScript(func(_ int, r simulator.Request) simulator.Reply {
				switch idempotencyKey(r.Body) {
				case "refused":
					return simulator.Reply{Status: http.StatusBadRequest, Body: []byte(`{"error":"no"}`)}
				case "lost":
					return simulator.Reply{Fault: simulator.Reset}
				}
				return simulator.Reply{}
			})
			proc := startBinary(t, paymentsdTestBinary(t), with(sandboxEnv(p),
				"PAYMENTS_DATABASE_URL", tt.db(t),
				"PAYMENTS_UPSTREAM_TIMEOUT", "500ms",
				"PAYMENTS_PROVIDER_QUIET_PERIOD", "1s",
				"PAYMENTS_SETTLEMENT_WINDOW", "2s",
				"PAYMENTS_RECORD_RETENTION", "2s",
				"PAYMENTS_UPSTREAM_BREAKER_FAILURES", "1000",
				"PAYMENTSD_TESTHOOK_RETENTION_INTERVAL", "200ms",
			))
			client := grpcClient(t, proc)
			want := map[string]string{
				"paid":    "PAYMENT_STATE_SUCCEEDED",
				"refused": "PAYMENT_STATE_NOT_CREATED",
				"lost":    "PAYMENT_STATE_OUTCOME_UNKNOWN",
			}
			for key := range want {
				client.CreateMultiCardPayment(t.Context(), validRequest(key))
			}

			for key, state := range want {
				info := waitExpired(t, client, key)
				if info.GetMetadata()["state"] != state {
					t.Errorf("%s: expired lookup says state %q, want %q", key, info.GetMetadata()["state"], state)
				}
				for _, field := range []string{"create_time", "update_time", "expire_time"} {
					if _, err := time.Parse(time.RFC3339Nano, info.GetMetadata()[field]); err != nil {
						t.Errorf("%s: expired lookup's %s = %q, want a time", key, field, info.GetMetadata()[field])
					}
				}
			}
			if got := waitExpired(t, client, "lost").GetMetadata()["settlement_gave_up"]; got != "true" {
				t.Errorf("lost: settlement_gave_up = %q, want true", got)
			}

			sent := len(p.Requests())
			for key := range want {
				for _, amount := range []int64{1250, 99999} {
					req := validRequest(key)
					req.AmountMoney.Amount = amount
					_, err := client.CreateMultiCardPayment(t.Context(), req)
					if st := status.Convert(err); st.Code() != codes.FailedPrecondition || reasonOf(st) != "IDEMPOTENCY_KEY_EXPIRED" {
						t.Errorf("%s with amount %d after retention = %v (%s), want FailedPrecondition IDEMPOTENCY_KEY_EXPIRED", key, amount, st.Code(), reasonOf(st))
					}
				}
				r := postREST(t, http.DefaultClient, "http://"+proc.httpAddr, validBody(key), nil)
				if r.status != http.StatusUnprocessableEntity || restReason(r) != "IDEMPOTENCY_KEY_EXPIRED" {
					t.Errorf("REST %s after retention = %d %s, want 422 IDEMPOTENCY_KEY_EXPIRED", key, r.status, restReason(r))
				}
				if r := getPath(t, proc, "/v1/multi-card-payments/"+key); r.status != http.StatusNotFound || restReason(r) != "IDEMPOTENCY_KEY_EXPIRED" {
					t.Errorf("REST lookup of %s after retention = %d %s, want 404 IDEMPOTENCY_KEY_EXPIRED", key, r.status, restReason(r))
				}
			}
			if n := len(p.Requests()) - sent; n != 0 {
				t.Errorf("the provider received %d requests for expired keys, want none", n)
			}
			if v := metricOf(t, proc, "paymentsd_idempotency_key_expired_total"); v != 9 {
				t.Errorf("paymentsd_idempotency_key_expired_total = %v, want 9 (6 calls over gRPC, 3 over REST)", v)
			}
		})
	}
}

// waitExpired polls the lookup of key until it answers NOT_FOUND with
// IDEMPOTENCY_KEY_EXPIRED, and returns that ErrorInfo.
func waitExpired(t *testing.T, client paymentsv1.PaymentsServiceClient, key string) *errdetails.ErrorInfo {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
		st := status.Convert(err)
		if st.Code() == codes.NotFound {
			for _, d := range st.Details() {
				if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == "IDEMPOTENCY_KEY_EXPIRED" {
					return info
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: lookup = %v, want NOT_FOUND IDEMPOTENCY_KEY_EXPIRED within 30s", key, err)
		}
		time.Sleep(100 * time.Millisecond) // retention has no signal
	}
}

// getPath GETs path on a process's HTTP port.
func getPath(t *testing.T, p *process, path string) restResult {
	t.Helper()
	resp, err := http.Get("http://" + p.httpAddr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return restResult{status: resp.StatusCode, header: resp.Header, raw: raw}
}
