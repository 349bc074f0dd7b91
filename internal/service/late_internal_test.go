package service

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/upstream"
)

// replicaOf is a second replica beside f's: its own Service and store on
// f's SQLite file, calling f's provider, on the same clock; its store has
// no faults.
func replicaOf(t *testing.T, f fixture, lease time.Duration, now func() time.Time) *Service {
	t.Helper()
	client, err := upstream.New(upstream.Config{
		BaseURL: f.p.URL, APIKey: internalKey, HTTPClient: &http.Client{},
		MaxRequests: 1, Timeout: 5 * time.Second,
		Metrics: upstream.NewMetrics(prometheus.NewRegistry()),
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(t.Context(), "sqlite:"+f.path, "sandbox", store.Options{Now: now, TakeoverGrace: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	svc := New(Config{Client: client, Store: st, Environment: paymentsv1.Environment_ENVIRONMENT_SANDBOX,
		LeaseTTL: lease, Now: now, Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		svc.Shutdown(ctx)
	})
	return svc
}

// TestLateSuccessToldAsRecorded: a caller with no deadline waits for its
// 2xx to be committed while its replica's store refuses the write for
// longer than the lease and quiet period. The other replica takes the key
// over and re-sends it (the provider answers 409: unknown), and a person
// resolves it SUCCEEDED with the payment they found. When the first
// replica's 2xx lands at last (late: the record is Succeeded already, and
// keeps the person's reply), its caller is told OK with the reply the
// record holds, not its own: what a caller is told OK with is what the
// record says (I2).
func TestLateSuccessToldAsRecorded(t *testing.T) {
	t.Parallel()
	c := &clock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
	f := newFixture(t, 10*time.Second, c.Now)
	other := replicaOf(t, f, 10*time.Second, c.Now)

	release := make(chan struct{})
	arrived := make(chan int, 4)
	f.p.SetScript(func(n int, r simulator.Request) simulator.Reply {
		arrived <- n
		if n == 1 {
			return simulator.Reply{Wait: release}
		}
		return simulator.Reply{Status: http.StatusConflict, Body: []byte(`{"errors":[{"code":"IDEMPOTENCY_KEY_REUSED"}]}`)}
	})
	type answer struct {
		resp *paymentsv1.CreateMultiCardPaymentResponse
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := f.svc.CreateMultiCardPayment(context.Background(), payment("k"))
		answered <- answer{resp, err}
	}()
	<-arrived
	f.faults.FailCommits(finishSQL, -1)
	close(release)
	waitFired(t, f.faults, "fail commit")

	// Past the lease and quiet period: the other replica takes the key over
	// and re-sends it; the provider's 409 leaves it unknown.
	c.add(2 * time.Minute)
	other.engine.Settle(t.Context())
	<-arrived
	other.engine.Await(t.Context(), "k")
	if r := f.record(t, "k"); r.State != record.OutcomeUnknown {
		t.Fatalf("record after the other replica's re-send = %v, want OutcomeUnknown", r.State)
	}
	c.add(time.Minute) // past the re-send's quiet period
	found := []byte(`{"id":"pay_found_on_the_dashboard"}`)
	if _, err := f.store.Resolve(t.Context(), "k", record.Resolve{To: record.Succeeded, Reply: found}, store.AuditInfo{Actor: "person"}); err != nil {
		t.Fatalf("Resolve(k, succeeded) = %v", err)
	}

	f.faults.Clear()
	told := <-answered
	if told.err != nil {
		t.Fatalf("call = %v, want OK", told.err)
	}
	r := f.record(t, "k")
	if r.State != record.Succeeded || string(told.resp.GetPaymentJson()) != string(r.Reply) {
		t.Errorf("caller told OK with %s; the record is %v with %s: want the reply the record holds", told.resp.GetPaymentJson(), r.State, r.Reply)
	}
}

// TestShutdownLogsOutcomeStuckInTheStore: the write of a call's 2xx is
// taken into a transaction that then stops answering (a frozen database
// server: neither commit nor failure comes), and paymentsd is told to
// stop. Shutdown still returns at its deadline, and logs the outcome it
// could not record, with the key and the provider's status (the on-call
// person's only evidence, once the process is gone, that the payment
// exists), rather than waiting for the store for ever, until Kubernetes
// SIGKILLs it with nothing logged.
func TestShutdownLogsOutcomeStuckInTheStore(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10*time.Second, nil)
	release := f.faults.HangStatements(finishSQL)
	defer release()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	if _, err := f.svc.CreateMultiCardPayment(ctx, payment("k")); reasonOf(err) != ReasonOutcomeUnknown {
		t.Fatalf("call = %v (%s), want %s when its deadline came with its 2xx's write hung", err, reasonOf(err), ReasonOutcomeUnknown)
	}
	stop, cancelStop := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancelStop()
	done := make(chan struct{})
	go func() {
		f.svc.Shutdown(stop)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Shutdown has not returned 20s after its deadline, with a write hung in the store")
	}
	if n := f.logs.count("paymentsd stopped with a payment's outcome not recorded: the record stays in progress, and settlement sends the key again once its lease and quiet period have passed"); n != 1 {
		t.Errorf("logged %d lines for the outcome hung in the store at shutdown, want 1", n)
	}
}
