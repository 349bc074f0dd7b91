package service

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"example.com/paymentsd/store"
)

// The tests here make the database go back in time under the service, as
// a failover to an asynchronous standby that lacked the last commits
// does: with the SQLite file's own connection, the record of a key the
// service paid is put back as its claim left it, or removed.

// backInTime is the SQLite file's own connection, to rewrite its past.
type backInTime struct{ db *sql.DB }

func openBackInTime(t *testing.T, path string) *backInTime {
	t.Helper()
	db, err := sql.Open(store.SQLiteDriver, store.SQLiteDSN(path, false, "busy_timeout(10000)"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &backInTime{db: db}
}

func (b *backInTime) exec(t *testing.T, query string, args ...any) {
	t.Helper()
	if _, err := b.db.Exec(query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// paidThenLost pays key through f (its provider holding the request), with
// a copy of the record taken while the request was at the provider, then
// puts that copy back in place of the record, forgetting the attempt: the
// record is back in progress under the call's claim. It returns the
// reply the caller was told.
func paidThenLost(t *testing.T, f fixture, key string) []byte {
	t.Helper()
	arrived, release := held(f.p)
	b := openBackInTime(t, f.path)
	answered := make(chan []byte, 1)
	go func() {
		resp, err := f.svc.CreateMultiCardPayment(context.Background(), payment(key))
		if err != nil {
			t.Errorf("CreateMultiCardPayment(%s) error = %v", key, err)
		}
		answered <- resp.GetPaymentJson()
	}()
	<-arrived
	b.exec(t, `CREATE TABLE snapshot AS SELECT * FROM records WHERE key = ?1`, key)
	close(release)
	told := <-answered
	if r := f.record(t, key); r.State != store.StateSucceeded {
		t.Fatalf("record of %s = %v, want Succeeded before the loss", key, r.State)
	}
	b.exec(t, `DELETE FROM attempts WHERE key = ?1`, key)
	b.exec(t, `DELETE FROM records WHERE key = ?1`, key)
	b.exec(t, `INSERT INTO records SELECT * FROM snapshot`)
	if r := f.record(t, key); r.State != store.StateInProgress || r.LeaseOwner == "" {
		t.Fatalf("record of %s after the loss = %v held by %q, want in progress under the call's claim", key, r.State, r.LeaseOwner)
	}
	return told
}

// TestLostOutcomeWrittenAgainWhenWritesResume: the outcome of a paid key is
// lost, and the store goes down for a moment; when its writes resume, the
// service writes it again from memory, and the record holds the reply the
// caller was told, with its attempt.
func TestLostOutcomeWrittenAgainWhenWritesResume(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10*time.Second, nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		f.svc.watchLost(ctx)
	}()
	defer func() { cancel(); <-watched }()

	told := paidThenLost(t, f, "k")
	f.faults.Down()
	waitHealthy(t, f.svc, false)
	f.faults.Up()

	deadline := time.Now().Add(30 * time.Second)
	for r := f.record(t, "k"); r.State != store.StateSucceeded; r = f.record(t, "k") {
		if time.Now().After(deadline) {
			t.Fatalf("record = %v 30s after the store came back, want Succeeded", r.State)
		}
		time.Sleep(20 * time.Millisecond) // polling the record: nothing else tells
	}
	if r := f.record(t, "k"); string(r.Reply) != string(told) || r.LeaseOwner != "" {
		t.Errorf("record = %s held by %q, want the reply the caller was told (%s), released", r.Reply, r.LeaseOwner, told)
	}
	as, err := f.store.Attempts(t.Context(), f.record(t, "k"))
	if err != nil || len(as) != 1 || as[0].ProviderStatus/100 != 2 || string(as[0].Reply) != string(told) {
		t.Errorf("attempts = %+v, %v; want the one attempt, with the 2xx", as, err)
	}
	if n := f.logs.count(msgLostOutcome); n != 1 {
		t.Errorf("logged %q %d times, want once", msgLostOutcome, n)
	}
	if n := f.p.KeyStats("k").Requests; n != 1 {
		t.Errorf("provider saw %d requests, want 1", n)
	}
}

// waitHealthy waits until the store's writes are healthy (or, !ok, until
// a failed write has made them not).
func waitHealthy(t *testing.T, s *Service, ok bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for (s.store.WriteHealthyFor() > 0) != ok {
		if time.Now().After(deadline) {
			t.Fatalf("store's writes healthy = %v 30s on, want %v", !ok, ok)
		}
		time.Sleep(10 * time.Millisecond) // polling the store's health: the heartbeat sets it
	}
}

// TestOwnRecordHeldByNobodyIsSettled: the outcome of a paid key is lost, and
// this process no longer remembers it. Its record is back in progress
// under a claim of this very process, which never takes its own records
// over, and holds nothing for it: once its lease has expired, the sweep
// gives it up to settlement, which settles it.
func TestOwnRecordHeldByNobodyIsSettled(t *testing.T) {
	t.Parallel()
	c := &clock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
	f := newFixture(t, 10*time.Second, c.Now)
	told := paidThenLost(t, f, "k")
	f.svc.outbox.mu.Lock()
	f.svc.outbox.written = nil // forgotten: older than landedKeep, say
	f.svc.outbox.mu.Unlock()

	// Within its lease, the record is left alone.
	f.svc.sweepOwn(t.Context())
	if r := f.record(t, "k"); r.State != store.StateInProgress {
		t.Fatalf("record within its lease = %v, want in progress", r.State)
	}
	c.add(time.Minute)
	f.svc.sweepOwn(t.Context())
	r := f.record(t, "k")
	if r.State != store.StateOutcomeUnknown || r.LeaseOwner != "" {
		t.Fatalf("record after the sweep = %v held by %q, want OutcomeUnknown, released", r.State, r.LeaseOwner)
	}
	as, err := f.store.Attempts(t.Context(), r)
	if err != nil || len(as) != 1 || !as[0].Abandoned {
		t.Errorf("attempts = %+v, %v; want the call's, abandoned", as, err)
	}
	// Settlement re-sends it: the idempotent fake answers with the same
	// payment.
	f.svc.settleDue(t.Context())
	if r := f.record(t, "k"); r.State != store.StateSucceeded || string(r.Reply) != string(told) {
		t.Errorf("record after settlement = %v %s, want Succeeded with %s", r.State, r.Reply, told)
	}
}
