package main

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/store/storetest"
)

// The failover tests run the paymentsd binary on a two-node Patroni
// cluster (.ci/pgcluster) while callers pay, and kill, switch over and
// restart its nodes. The fake provider charges every request it gets (it
// is not idempotent), so a key sent twice shows as two charges.

// TestFailover: strict synchronous replication (synchronous_mode and
// synchronous_mode_strict), and one paymentsd on each front the cluster
// offers: HAProxy (Patroni's REST /primary), pgx's multi-host URL
// (target_session_attrs=read-write) and PgBouncer in transaction mode in
// front of HAProxy. The primary is SIGKILLed under load and Patroni
// promotes the replica; the old primary rejoins; then a planned
// switchover; then PgBouncer restarts. paymentsd must come back on the new
// primary by itself, answer honestly meanwhile, and settle what was in
// doubt afterwards. The figures (unavailability, answers, latency, time
// to settle) are logged: `go test -v -run TestFailover ./cmd/paymentsd/`.
func TestFailover(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs a Patroni cluster and fails it over")
	}
	c := storetest.StartPatroniCluster(t, false)
	runs := []*payLoad{
		startPayLoad(t, "haproxy", c.Database("pay_haproxy", c.URL), 4),
		startPayLoad(t, "multihost", c.Database("pay_multihost", c.MultiHostURL), 4),
		startPayLoad(t, "pgbouncer", c.Database("pay_pgbouncer", c.PoolerURL), 4),
	}
	for _, r := range runs {
		r.waitOK(t, 20)
	}

	kill := fault{name: "kill-primary", at: time.Now()}
	killed := c.KillPrimary()
	c.WaitLeader()
	// Strict synchronous replication: the promoted node acknowledges no
	// commit until a synchronous standby streams from it, so writes wait
	// for the killed node to rejoin.
	c.RestartNode(killed)
	c.WaitHealthy()
	kill.recovered = time.Now()
	for _, r := range runs {
		// Back on the new primary without a restart.
		r.waitOK(t, 20)
	}

	switchover := fault{name: "switchover", at: time.Now()}
	c.Switchover()
	c.WaitLeader()
	switchover.recovered = time.Now()
	for _, r := range runs {
		r.waitOK(t, 20)
	}

	// PgBouncer restarts: its clients' connections drop (the other fronts
	// don't notice).
	pooler := fault{name: "restart-pooler", at: time.Now()}
	c.RestartPooler()
	pooler.recovered = time.Now()
	for _, r := range runs {
		r.waitOK(t, 20)
	}
	for _, r := range runs {
		r.stop()
	}
	t.Logf("cluster after the faults:\n%s", c.Status())

	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			r.checkHonest(t)
			r.report(t, kill, switchover, pooler)
			r.settle(t, false)
			r.checkIssue23(t)
		})
	}
}

// TestAsyncFailover: asynchronous replication, paymentsd through HAProxy,
// the replica's stream stalled for a moment and the primary SIGKILLed
// under load. The promoted replica lacks the last commits: whole records,
// and outcomes. paymentsd's guarantee needs a store that loses no
// acknowledged commit (docs/durability.md), so here it can't keep it: what
// the test asserts is that paymentsd says so before the failover (its
// replication gauge reads 0, and its start-up log says what a failover can
// lose); what it measures, and logs as figures for the docs, is what the
// failover lost: payments answered OK whose records are gone or back in
// doubt, and keys the provider then charged twice.
func TestAsyncFailover(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs a Patroni cluster and fails it over")
	}
	c := storetest.StartPatroniCluster(t, true)
	r := startPayLoad(t, "async", c.Database("pay_async", c.URL), 16)
	r.waitOK(t, 30)
	if v := metricOf(t, r.proc, "paymentsd_store_synchronous_commit"); v != 0 {
		t.Errorf("paymentsd_store_synchronous_commit = %v on an asynchronous cluster, want 0", v)
	}
	r.proc.logs.waitFor(t, "the record store's primary does not commit synchronously: a failover to a standby may lose commits it acknowledged", nil)
	// The replica falls behind, as over a slow or stalled network: the
	// primary goes on committing without it.
	resume := c.PauseReplication()
	r.waitOK(t, 30)
	kill := fault{name: "kill-primary", at: time.Now()}
	c.KillPrimary()
	resume()
	c.WaitLeader()
	kill.recovered = time.Now()
	r.waitOK(t, 20)
	r.stop()
	r.report(t, kill)
	waitProviderIdle(t, r.p)

	// Which payments answered OK are on record on the new primary, as
	// their callers were told?
	var noRecord, noOutcome []string
	for _, call := range r.calls {
		if call.kind != "OK" {
			continue
		}
		got, err := r.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: call.key})
		switch {
		case err == nil && got.GetState() == paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED:
		case status.Code(err) == codes.NotFound:
			noRecord = append(noRecord, call.key)
		default:
			noOutcome = append(noOutcome, fmt.Sprintf("%s (%v)", call.key, got.GetState()))
		}
	}
	// What a caller coming back for a lost key gets, and what the
	// provider then does: without the record, the key is sent again.
	twice := 0
	for _, key := range noRecord {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		r.client.CreateMultiCardPayment(ctx, validRequest(key))
		cancel()
		if r.p.KeyStats(key).Charges > 1 {
			twice++
		}
	}
	t.Logf("async failover figures: of %d payments answered OK, lost with the old primary: %d records %v and %d outcomes %v; of the lost records' keys, a caller's retry charged %d twice",
		r.count("OK"), len(noRecord), noRecord, len(noOutcome), noOutcome, twice)
}

// fault is a failure injected into the cluster: at when it began, and
// recovered when the script saw a leader take writes through every front.
type fault struct {
	name          string
	at, recovered time.Time
}

// payLoad is a paymentsd process on one database, its fake provider and
// its callers, each paying with keys of its own, one call at a time.
type payLoad struct {
	name   string
	p      *simulator.Server
	proc   *process
	client paymentsv1.PaymentsServiceClient
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	calls    []payCall
	arrived  map[string]time.Time // key → when its first request reached the provider
	changed  chan struct{}        // closed and replaced when a call ends
	okMarked int                  // OK answers when waitOK last returned
}

// payCall is one CreateMultiCardPayment and its answer: "OK", or the
// ErrorInfo reason (REQUEST_NOT_SENT, PAYMENT_OUTCOME_UNKNOWN, …), or the
// gRPC code if it has none.
type payCall struct {
	key        string
	start, end time.Time
	kind       string
	paymentID  string // the payment the caller was told, if OK
}

func startPayLoad(t *testing.T, name, dbURL string, callers int) *payLoad {
	t.Helper()
	r := &payLoad{name: name, p: fakeProvider(t, "sandbox"), arrived: map[string]time.Time{}, changed: make(chan struct{})}
	r.p.SetScript(func(_ int, req simulator.Request) simulator.Reply {
		key := idempotencyKey(req.Body)
		r.mu.Lock()
		if _, ok := r.arrived[key]; !ok {
			r.arrived[key] = time.Now()
		}
		r.mu.Unlock()
		// Calls are at the provider long enough for a fault to catch some
		// of them there.
		return simulator.Reply{Delay: 30 * time.Millisecond}
	})
	proc := startProcess(t, with(sandboxEnv(r.p),
		"PAYMENTS_DATABASE_URL", dbURL,
		"PAYMENTS_UPSTREAM_TIMEOUT", "2s",
		"PAYMENTS_PROVIDER_QUIET_PERIOD", "2s",
		"PAYMENTS_LOG_LEVEL", "warn",
	))
	r.proc = proc
	r.client = grpcClient(t, proc)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	t.Cleanup(r.stop)
	for w := range callers {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				key := fmt.Sprintf("%s-%d-%d", name, w, n)
				cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
				start := time.Now()
				resp, err := r.client.CreateMultiCardPayment(cctx, validRequest(key))
				ccancel()
				if ctx.Err() != nil {
					return // cut off by stop: not an answer
				}
				call := payCall{key: key, start: start, end: time.Now(), kind: "OK", paymentID: paymentID(resp)}
				if err != nil {
					st := status.Convert(err)
					call.kind = reasonOf(st)
					if call.kind == "" {
						call.kind = st.Code().String()
					}
				}
				r.record(call)
				if err != nil {
					// A client backs off a little after a failure.
					select {
					case <-ctx.Done():
					case <-time.After(50 * time.Millisecond):
					}
				}
			}
		}()
	}
	return r
}

func paymentID(resp *paymentsv1.CreateMultiCardPaymentResponse) string {
	return resp.GetPayment().GetFields()["id"].GetStringValue()
}

func (r *payLoad) record(c payCall) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
	close(r.changed)
	r.changed = make(chan struct{})
}

// waitOK waits until n more calls than at the last waitOK have been
// answered OK.
func (r *payLoad) waitOK(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(3 * time.Minute)
	for {
		r.mu.Lock()
		ok := 0
		for _, c := range r.calls {
			if c.kind == "OK" {
				ok++
			}
		}
		changed := r.changed
		if ok >= r.okMarked+n {
			r.okMarked = ok
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("%s: paymentsd answered %d calls OK, want %d more than %d; it did not come back. Answers: %v", r.name, ok, n, r.okMarked, r.kinds(time.Time{}, time.Now()))
		}
	}
}

// stop ends the callers and waits for them.
func (r *payLoad) stop() {
	r.cancel()
	r.wg.Wait()
}

func (r *payLoad) count(kind string) int {
	n := 0
	for _, c := range r.calls {
		if c.kind == kind {
			n++
		}
	}
	return n
}

// kinds counts the answers to the calls that started in [from, to).
func (r *payLoad) kinds(from, to time.Time) map[string]int {
	m := map[string]int{}
	for _, c := range r.calls {
		if !c.start.Before(from) && c.start.Before(to) {
			m[c.kind]++
		}
	}
	return m
}

// checkHonest checks every answer against what the provider saw: no key
// had two requests at the provider at once; REQUEST_NOT_SENT only for a
// key none of whose requests had reached the provider when the caller was
// answered; PAYMENT_NOT_CREATED never for a key the provider charged; and
// no answer but those, OK, PAYMENT_OUTCOME_UNKNOWN, or the caller's own
// bare DeadlineExceeded (nothing told).
func (r *payLoad) checkHonest(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for key, ks := range r.p.AllKeyStats() {
		if ks.MaxInFlight > 1 {
			t.Errorf("%s: key %s had %d requests at the provider at once, want at most 1", r.name, key, ks.MaxInFlight)
		}
	}
	for _, c := range r.calls {
		switch c.kind {
		case "OK", "PAYMENT_OUTCOME_UNKNOWN":
		case "DeadlineExceeded":
			// paymentsd's own answer, sent a margin before the caller's
			// deadline, did not reach the caller in time (a machine kept
			// busy): the caller was told nothing, and retries with the
			// same key. Honest; reported as a figure.
		case "REQUEST_NOT_SENT":
			if at, ok := r.arrived[c.key]; ok && at.Before(c.end) {
				t.Errorf("%s: key %s answered REQUEST_NOT_SENT at %v, but its request reached the provider at %v", r.name, c.key, c.end, at)
			}
		case "PAYMENT_NOT_CREATED":
			if ch := r.p.KeyStats(c.key).Charges; ch > 0 {
				t.Errorf("%s: key %s answered PAYMENT_NOT_CREATED, but the provider charged it %d times", r.name, c.key, ch)
			}
		default:
			t.Errorf("%s: key %s answered %s, want OK, REQUEST_NOT_SENT or PAYMENT_OUTCOME_UNKNOWN", r.name, c.key, c.kind)
		}
	}
}

// report logs, for each fault: the longest time between two payments
// answered OK around it (the unavailability callers saw), the answers to
// the calls that started between the fault and its recovery (+2 s), and
// their latency.
func (r *payLoad) report(t *testing.T, faults ...fault) {
	t.Helper()
	var okEnds []time.Time
	for _, c := range r.calls {
		if c.kind == "OK" {
			okEnds = append(okEnds, c.end)
		}
	}
	slices.SortFunc(okEnds, func(a, b time.Time) int { return a.Compare(b) })
	for _, f := range faults {
		var gap time.Duration
		for i := 1; i < len(okEnds); i++ {
			if okEnds[i].After(f.at) && okEnds[i-1].Before(f.recovered.Add(30*time.Second)) {
				gap = max(gap, okEnds[i].Sub(okEnds[i-1]))
			}
		}
		to := f.recovered.Add(2 * time.Second)
		var lat []time.Duration
		for _, c := range r.calls {
			if !c.start.Before(f.at) && c.start.Before(to) {
				lat = append(lat, c.end.Sub(c.start))
			}
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		t.Logf("failover figures: front=%s fault=%s longest_without_ok=%v script_saw_writes_after=%v calls=%d answers=%v p50=%v p99=%v",
			r.name, f.name, gap.Round(10*time.Millisecond), f.recovered.Sub(f.at).Round(10*time.Millisecond),
			len(lat), r.kinds(f.at, to), quantile(lat, 0.5), quantile(lat, 0.99))
	}
	t.Logf("failover figures: front=%s all calls: %v", r.name, r.kinds(time.Time{}, time.Now()))
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, int(q*float64(len(d))))].Round(time.Millisecond)
}

// settle waits until every key that reached the provider and is on record
// is SUCCEEDED (settlement re-sends those left in doubt), and logs how many
// were in doubt and how long it took. A key that reached the provider with
// no record is an error, unless lostOK (asynchronous replication may lose
// records); it is then returned.
func (r *payLoad) settle(t *testing.T, lostOK bool) (lost []string) {
	t.Helper()
	start := time.Now()
	var keys []string
	for key := range r.p.AllKeyStats() {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	pending := map[string]bool{}
	for _, key := range keys {
		got, err := r.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
		switch {
		case status.Code(err) == codes.NotFound && lostOK:
			lost = append(lost, key)
		case status.Code(err) == codes.NotFound:
			t.Errorf("%s: key %s reached the provider and has no record", r.name, key)
		case err != nil || got.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED:
			pending[key] = true
		}
	}
	inDoubt := len(pending)
	deadline := time.Now().Add(3 * time.Minute)
	for len(pending) > 0 {
		for key := range pending {
			got, err := r.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
			if err == nil && got.GetState() == paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED {
				delete(pending, key)
			}
		}
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: %d records still not settled 3 minutes after the load: %v", r.name, len(pending), pending)
			break
		}
		time.Sleep(100 * time.Millisecond) // polling the records: settlement has no other signal
	}
	t.Logf("failover figures: front=%s keys_at_provider=%d in_doubt_after_load=%d all_settled_after=%v",
		r.name, len(keys), inDoubt, time.Since(start).Round(100*time.Millisecond))
	return lost
}

// checkIssue23 checks that no key was charged twice and that every record
// holds the payment its caller was told (issue 23).
func (r *payLoad) checkIssue23(t *testing.T) {
	t.Helper()
	var twice, other []string
	for key, ks := range r.p.AllKeyStats() {
		if ks.Charges > 1 {
			twice = append(twice, fmt.Sprintf("%s (%d charges)", key, ks.Charges))
		}
	}
	for _, c := range r.calls {
		if c.kind != "OK" {
			continue
		}
		got, err := r.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: c.key})
		if err != nil {
			other = append(other, fmt.Sprintf("%s (told %s; Get: %v)", c.key, c.paymentID, status.Code(err)))
			continue
		}
		if id := got.GetPayment().GetFields()["id"].GetStringValue(); id != c.paymentID {
			other = append(other, fmt.Sprintf("%s (told %s, recorded %s)", c.key, c.paymentID, id))
		}
	}
	sort.Strings(twice)
	sort.Strings(other)
	t.Logf("failover figures: front=%s keys_charged_twice=%d records_not_what_caller_was_told=%d of %d OK", r.name, len(twice), len(other), r.count("OK"))
	for _, k := range twice {
		t.Errorf("%s: key %s charged twice after a failover (issue 23)", r.name, k)
	}
	for _, k := range other {
		t.Errorf("%s: key %s's record does not hold the payment its caller was told (issue 23)", r.name, k)
	}
}
