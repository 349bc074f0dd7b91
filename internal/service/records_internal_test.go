package service

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
	"example.com/paymentsd/internal/upstream"
)

// Tests of the record paths' edges, from inside the package: settlement
// rounds run by hand, and a clock the test moves.

const internalKey = "sk_internal_test_0123456789"

// clock is a settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type fixture struct {
	svc   *Service
	reg   *prometheus.Registry
	store *store.Store
	p     *simulator.Server
	path  string // the SQLite file
	// faults is the store's failure seam (storetest.Faults).
	faults *storetest.Faults
	logs   *logBuffer
}

// newFixture returns a Service on a fresh SQLite file, calling the fake
// provider, with the given lease and clock (nil: the real one), which the
// store decides by.
func newFixture(t *testing.T, lease time.Duration, now func() time.Time) fixture {
	t.Helper()
	return newFixtureWith(t, lease, now, 0)
}

// newFixtureWith is newFixture with at most maxSends provider requests
// waited on at once (0: the default).
func newFixtureWith(t *testing.T, lease time.Duration, now func() time.Time, maxSends int) fixture {
	t.Helper()
	p := simulator.NewServer()
	t.Cleanup(p.Close)
	p.AllowKey(internalKey)
	p.Idempotent(true)
	client, err := upstream.New(upstream.Config{
		BaseURL: p.URL, APIKey: internalKey, HTTPClient: &http.Client{},
		MaxRequests: 1, Timeout: 5 * time.Second,
		Metrics: upstream.NewMetrics(prometheus.NewRegistry()),
	})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "records.db")
	faults := storetest.NewFaults()
	opts := store.Options{Now: now, WrapConnector: faults.Wrap}
	if now != nil {
		// The test moves the clock past leases at once: takeovers don't
		// wait for the store's writes to have been healthy for long.
		opts.TakeoverGrace = -1
	}
	st, err := store.Open(t.Context(), "sqlite:"+path, "sandbox", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		faults.Clear()
		st.Close()
	})
	logs := &logBuffer{}
	reg := prometheus.NewRegistry()
	svc := New(Config{Client: client, Store: st, Environment: paymentsv1.Environment_ENVIRONMENT_SANDBOX,
		LeaseTTL: lease, Now: now, Registerer: reg, MaxSends: maxSends,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	t.Cleanup(func() {
		// A test that failed midway may leave faults that would hold
		// the outbox.
		faults.Clear()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		svc.Shutdown(ctx)
	})
	return fixture{svc: svc, reg: reg, store: st, p: p, path: path, faults: faults, logs: logs}
}

func payment(key string) *paymentsv1.CreateMultiCardPaymentRequest {
	return &paymentsv1.CreateMultiCardPaymentRequest{AmountMoney: &paymentsv1.Money{Currency: "USD", Amount: 1250}, IdempotencyKey: key}
}

// metric is the value of the counter or gauge name (without labels) in
// the fixture's registry.
func (f fixture) metric(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func keyOf(body []byte) string {
	var v struct{ IdempotencyKey string }
	json.Unmarshal(body, &v)
	return v.IdempotencyKey
}

func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			return ei.Reason
		}
	}
	return ""
}

// makeUnknown leaves each key's record OutcomeUnknown (the provider resets
// the connection after reading the request).
func (f fixture) makeUnknown(t *testing.T, keys ...string) {
	t.Helper()
	f.p.SetScript(simulator.Always(simulator.Reply{Fault: simulator.Reset}))
	for _, k := range keys {
		_, err := f.svc.CreateMultiCardPayment(t.Context(), payment(k))
		if reasonOf(err) != ReasonOutcomeUnknown {
			t.Fatalf("first call for %s = %v, want %s", k, err, ReasonOutcomeUnknown)
		}
		// The outcome is answered before its record commits; the test's
		// clock must not move before it has.
		f.svc.engine.Await(t.Context(), k)
	}
}

// Settlement claims one record at a time, just before sending it. Were it
// to claim a batch under one lease and send them one after another, a slow
// provider would outlive the lease of the records not yet sent, and a
// caller's retry could then send a key that settlement sends too.
func TestSettlementClaimsOneRecordAtATime(t *testing.T) {
	t.Parallel()
	c := &clock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
	f := newFixture(t, 10*time.Second, c.Now)
	keys := []string{"settle-a", "settle-b", "settle-c"}
	f.makeUnknown(t, keys...)
	c.add(time.Minute) // past every record's next settlement time

	// Settlement's first re-send waits for releaseFirst, every later
	// request for releaseRest.
	releaseFirst, releaseRest := make(chan struct{}), make(chan struct{})
	arrived := make(chan string, 8)
	var firstSeen atomic.Bool
	f.p.SetScript(func(_ int, r simulator.Request) simulator.Reply {
		arrived <- keyOf(r.Body)
		if firstSeen.CompareAndSwap(false, true) {
			return simulator.Reply{Wait: releaseFirst}
		}
		return simulator.Reply{Wait: releaseRest}
	})
	done := make(chan struct{})
	go func() { defer close(done); f.svc.engine.Settle(context.Background()) }()
	first := <-arrived

	// Past the lease settlement would have taken on the whole batch, the
	// callers retry the other keys; their requests are held.
	c.add(11 * time.Second)
	retried := make(chan error, len(keys))
	for _, k := range keys {
		if k == first {
			continue
		}
		go func() {
			_, err := f.svc.CreateMultiCardPayment(context.Background(), payment(k))
			retried <- err
		}()
		if got := <-arrived; got != k {
			t.Fatalf("provider saw %s, want the caller's retry of %s", got, k)
		}
	}
	// Settlement finishes its first record and looks for the next: the
	// others are the callers' now.
	close(releaseFirst)
	select {
	case <-done:
	case k := <-arrived:
		t.Errorf("settlement re-sent %s while a caller's request for it was in flight", k)
	}
	close(releaseRest)
	for range len(keys) - 1 {
		if err := <-retried; err != nil {
			t.Errorf("caller's retry = %v, want OK", err)
		}
	}
	<-done
	for _, k := range keys {
		if n := f.p.MaxInFlight(k); n != 1 {
			t.Errorf("provider had %d requests for %s in flight at once, want 1", n, k)
		}
	}
}

// A call whose record was committed so late that too little of its lease
// is left sends nothing, records NotCreated and says so. The store is
// slowed for real: another connection holds SQLite's write lock.
func TestSendWithinLease(t *testing.T) {
	t.Parallel()
	f := newFixture(t, time.Second, nil)
	db, err := sql.Open(store.SQLiteDriver, f.path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(t.Context(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	// With a 1 s lease (a 200 ms margin at each end), a claim that takes
	// 700 ms to commit leaves too little to send in.
	time.AfterFunc(700*time.Millisecond, func() { conn.ExecContext(context.Background(), "COMMIT") })
	_, err = f.svc.CreateMultiCardPayment(t.Context(), payment("late"))
	if status.Code(err) != codes.Unavailable || reasonOf(err) != ReasonNotCreated {
		t.Errorf("call = %v (%s), want UNAVAILABLE %s", err, reasonOf(err), ReasonNotCreated)
	}
	if n := len(f.p.Requests()); n != 0 {
		t.Errorf("provider saw %d requests, want none", n)
	}
	rec, err := f.store.Get(t.Context(), "late")
	if err != nil || rec.State != record.NotCreated {
		t.Errorf("record = %v, %v; want NotCreated", rec.State, err)
	}
}

// A call waiting on a key another call holds at the provider, whose store
// then fails, is told the payment is in progress, never that nothing was
// created.
func TestWaiterOnStoreFailureHearsInProgress(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10*time.Second, nil)
	release := make(chan struct{})
	defer close(release)
	arrived := make(chan struct{}, 1)
	f.p.SetScript(func(int, simulator.Request) simulator.Reply {
		arrived <- struct{}{}
		return simulator.Reply{Wait: release}
	})
	go f.svc.CreateMultiCardPayment(context.Background(), payment("held"))
	<-arrived

	waited := make(chan error, 1)
	go func() {
		_, err := f.svc.CreateMultiCardPayment(context.Background(), payment("held"))
		waited <- err
	}()
	// Once the second call is waiting, the store goes away. The wait
	// counter is the only signal that it is.
	deadline := time.After(30 * time.Second)
	for f.metric(t, "paymentsd_in_progress_waits_total") < 1 {
		select {
		case err := <-waited:
			t.Fatalf("second call ended before it waited: %v", err)
		case <-deadline:
			t.Fatal("second call did not wait within 30s")
		case <-time.After(time.Millisecond):
		}
	}
	f.store.Close()
	err := <-waited
	if status.Code(err) != codes.Aborted || reasonOf(err) != ReasonInProgress {
		t.Errorf("waiting call = %v (%s), want ABORTED %s", err, reasonOf(err), ReasonInProgress)
	}
}

// A call whose deadline has passed before its claim could run read
// nothing, wrote nothing and sent nothing: it says REQUEST_NOT_SENT,
// whatever earlier calls with the key did, never PAYMENT_NOT_CREATED (a
// claim that ran and read a record that may hold a payment says
// PAYMENT_OUTCOME_UNKNOWN: TestClaimStuckOverUnknownRecordReleased).
func TestClaimFailureAfterUnknownStaysUnknown(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10*time.Second, nil)
	f.makeUnknown(t, "was-unknown")
	before := f.record(t, "was-unknown")
	sent := len(f.p.Requests())
	expired, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer cancel()
	for _, key := range []string{"was-unknown", "fresh"} {
		_, err := f.svc.CreateMultiCardPayment(expired, payment(key))
		if reasonOf(err) != ReasonNotSent {
			t.Errorf("call for %s with its deadline gone = %v (%s), want %s", key, err, reasonOf(err), ReasonNotSent)
		}
	}
	if r := f.record(t, "was-unknown"); !r.UpdatedAt.Equal(before.UpdatedAt) || r.State != record.OutcomeUnknown {
		t.Errorf("record was-unknown = %v (updated %v), want unchanged OutcomeUnknown (updated %v)", r.State, r.UpdatedAt, before.UpdatedAt)
	}
	if _, err := f.store.Get(t.Context(), "fresh"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get(fresh) = %v, want no record", err)
	}
	if n := len(f.p.Requests()) - sent; n != 0 {
		t.Errorf("provider saw %d requests, want none", n)
	}
}

// A lookup that can't read the record never says PAYMENT_NOT_CREATED.
func TestLookupStoreFailureIsUnknown(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10*time.Second, nil)
	if _, err := f.svc.CreateMultiCardPayment(t.Context(), payment("looked-up")); err != nil {
		t.Fatal(err)
	}
	f.store.Close()
	_, err := f.svc.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "looked-up"})
	if status.Code(err) != codes.Unavailable || reasonOf(err) != ReasonOutcomeUnknown {
		t.Errorf("lookup = %v (%s), want UNAVAILABLE %s", err, reasonOf(err), ReasonOutcomeUnknown)
	}
}

// claimFor is the claim CreateMultiCardPayment would make for key, with
// the fixture's lease (10s), window and quiet period.
func claimFor(key, owner string) record.Claim {
	body, _ := upstream.EncodeRequest(upstream.Payment{Currency: "USD", Amount: 1250, IdempotencyKey: key})
	return record.Claim{Request: record.Request{Key: key, Body: body, BodySHA256: sha256.Sum256(body), Currency: "USD", Amount: 1250},
		Owner: owner, LeaseTTL: 10 * time.Second, Window: 10 * time.Minute, Quiet: 30 * time.Second}
}

// A caller's retry of an unknown key near the end of its settlement window
// sends nothing that could reach the provider after the window: the
// provider may have forgotten the key by then.
func TestCallerSendEndsWithTheWindow(t *testing.T) {
	t.Parallel()
	c := &clock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
	f := newFixture(t, 10*time.Second, c.Now)
	f.makeUnknown(t, "closing")
	rec, err := f.store.Get(t.Context(), "closing")
	if err != nil {
		t.Fatal(err)
	}
	c.add(rec.SettleBy.Sub(c.Now()) - time.Second) // a second of the window left
	sent := len(f.p.Requests())
	f.p.SetScript(nil)
	_, err = f.svc.CreateMultiCardPayment(t.Context(), payment("closing"))
	if reasonOf(err) != ReasonOutcomeUnknown {
		t.Errorf("retry = %v (%s), want %s", err, reasonOf(err), ReasonOutcomeUnknown)
	}
	if n := len(f.p.Requests()) - sent; n != 0 {
		t.Errorf("retry sent %d requests with a second of the window left, want none", n)
	}
}

// TestExpiredUntoldSaysNothingOfTheRecord: the refusal of a key whose
// tombstone may be another caller's carries the reason and nothing of
// the record.
func TestExpiredUntoldSaysNothingOfTheRecord(t *testing.T) {
	s := &Service{env: paymentsv1.Environment_ENVIRONMENT_SANDBOX}
	st := status.Convert(s.expiredUntoldError("k"))
	if st.Code() != codes.FailedPrecondition {
		t.Fatalf("code = %v, want FAILED_PRECONDITION", st.Code())
	}
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok {
			continue
		}
		if info.GetReason() != ReasonKeyExpired {
			t.Errorf("reason = %q, want %s", info.GetReason(), ReasonKeyExpired)
		}
		for k := range info.GetMetadata() {
			if k != "environment" {
				t.Errorf("metadata %q tells of the record", k)
			}
		}
	}
	if strings.Contains(st.Message(), "STATE") {
		t.Errorf("message %q tells the record's state", st.Message())
	}
}

// logBuffer is a bytes.Buffer safe for a logger and a test to share.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// count is how many lines logged msg.
func (b *logBuffer) count(msg string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), `"msg":"`+msg+`"`)
}
