package store_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
)

// The tests here run the store on a PostgreSQL server of their own whose
// commits wait for a synchronous standby that does not exist
// (synchronous_standby_names = 'nosuch'). Each COMMIT is then written
// locally and waits, invisible to every other session, until a standby
// confirms it. If that wait is cancelled, PostgreSQL ends it with a
// WARNING and the commit becomes visible although no standby has it: a
// failover would lose it. So the store never cancels a COMMIT it has sent,
// and reports one whose wait someone else cancelled as ErrCommitUnknown.

// syncRepServer is a private PostgreSQL server whose commits may be made to
// wait for a standby, and a session of its own (another replica's view).
type syncRepServer struct {
	url   string
	admin *sql.DB
}

func startSyncRepServer(t *testing.T) *syncRepServer {
	t.Helper()
	c := storetest.StartCluster(t)
	return &syncRepServer{url: c.URL, admin: openAdmin(t, c.URL)}
}

// waitForStandby makes every commit from now on wait for a standby that
// never comes, until t's cleanup, which releases them (before the stores
// opened earlier close).
func (p *syncRepServer) waitForStandby(t *testing.T) {
	t.Helper()
	p.setStandbyNames(t, "nosuch")
	t.Cleanup(func() { p.setStandbyNames(t, "") })
}

// setStandbyNames sets synchronous_standby_names and reloads. Once a new
// session reads the new value, the postmaster has signalled every session,
// and each takes it before its next statement.
func (p *syncRepServer) setStandbyNames(t *testing.T, names string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := p.admin.ExecContext(ctx, `ALTER SYSTEM SET synchronous_standby_names = '`+names+`'`); err != nil {
		t.Fatal(err)
	}
	if _, err := p.admin.ExecContext(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	p.waitFor(t, "synchronous_standby_names = "+names, func() bool {
		var got string
		if err := p.admin.QueryRowContext(ctx, `SHOW synchronous_standby_names`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		return got == names
	})
}

// waiters are the sessions whose COMMIT waits for the standby.
func (p *syncRepServer) waiters(t *testing.T) []int {
	t.Helper()
	rows, err := p.admin.QueryContext(t.Context(), `SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' ORDER BY pid`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var pids []int
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return pids
}

// counter returns a count that query reads through db, as another session
// sees the database.
func (p *syncRepServer) counter(t *testing.T, db *sql.DB, query string, args ...any) func() int {
	return func() int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(t.Context(), query, args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		return n
	}
}

// database creates an empty database, and returns its URL and a pool of
// fresh sessions on it.
func (p *syncRepServer) database(t *testing.T, name string) (string, *sql.DB) {
	t.Helper()
	if _, err := p.admin.ExecContext(t.Context(), `CREATE DATABASE `+name); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(p.url)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	db := openAdmin(t, u.String())
	return u.String(), db
}

// openAdmin opens a pool on dbURL whose every statement runs in a fresh
// session (see setStandbyNames).
func openAdmin(t *testing.T, dbURL string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dbURL)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxIdleConns(0)
	t.Cleanup(func() { db.Close() })
	return db
}

// waitFor polls cond: the server has no signal for a session's state.
func (p *syncRepServer) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still not %s after a minute", what)
		}
		time.Sleep(10 * time.Millisecond) // pg_stat_activity has no signal to wait on
	}
}

// TestCommitWaitNeverCancelled: each kind of write, its caller's context
// ending while its COMMIT waits for a standby that is not there, is
// reported as maybe committed, and stays invisible to every other session
// while no standby has it (its wait was not cancelled); once commits no
// longer wait for a standby, each lands.
func TestCommitWaitNeverCancelled(t *testing.T) {
	t.Parallel()
	p := startSyncRepServer(t)
	clk := newClock(t0)
	s := openStore(t, p.url, "sandbox", clk)
	ctx := context.Background()

	// What the writes need, committed before commits wait.
	makeUnknown(t, s, claim("resolved", "body", "p/1"), time.Hour) // not due for settlement
	makeUnknown(t, s, claim("settled", "body", "p/1"), 0)          // due
	// The clock stands still from here on, a microsecond apart, so the
	// heartbeat (after half a second without a commit) never runs.
	if err := s.CheckWrite(ctx); err != nil {
		t.Fatal(err)
	}
	checked := clk.Add(time.Microsecond).UTC().Format(time.RFC3339Nano)
	// An empty database for a store opened (and migrated) while commits
	// wait.
	fresh, freshAdmin := p.database(t, "fresh")
	p.waitForStandby(t)

	type began struct {
		b   *store.Began
		err error
	}
	lateBegan := make(chan began, 1)
	cases := []struct {
		name  string
		write func(context.Context) error
		// wantErr checks the write's error when its context ended.
		wantErr func(error) bool
		// visible counts what the write wrote, as another session sees it.
		visible func() int
	}{{
		name:    "CheckWrite",
		write:   s.CheckWrite,
		wantErr: isCommitUnknown,
		visible: p.counter(t, p.admin, `SELECT count(*) FROM meta WHERE name = 'write_check' AND value = $1`, checked),
	}, {
		name: "Resolve",
		write: func(ctx context.Context) error {
			_, err := s.Resolve(ctx, "resolved", record.Resolve{To: record.NotCreated}, store.AuditInfo{Evidence: "e", Actor: "a"})
			return err
		},
		wantErr: isCommitUnknown,
		visible: p.counter(t, p.admin, `SELECT count(*) FROM audit_entries`),
	}, {
		name: "SettleDue",
		write: func(ctx context.Context) error {
			_, _, err := s.SettleDue(ctx, record.Settle{Owner: "q/1", LeaseTTL: lease}, nil, 1)
			return err
		},
		wantErr: isCommitUnknown,
		visible: p.counter(t, p.admin, `SELECT count(*) FROM records WHERE key = 'settled' AND lease_owner = 'q/1'`),
	}, {
		name: "AppendEvent",
		write: func(ctx context.Context) error {
			_, err := s.AppendEvent(ctx, store.Event{ReceivedAt: clk.Now(), Body: []byte("{}")})
			return err
		},
		wantErr: isCommitUnknown,
		visible: p.counter(t, p.admin, `SELECT count(*) FROM events`),
	}, {
		// The batcher's transaction: its caller detaches, and late gets
		// what the claim did once its commit's answer comes.
		name: "Begin",
		write: func(ctx context.Context) error {
			_, err := s.Begin(ctx, claim("begun", "body", "p/2"), func(b *store.Began, err error) { lateBegan <- began{b, err} })
			return err
		},
		wantErr: func(err error) bool {
			var pending *store.ClaimPendingError
			return errors.As(err, &pending) && pending.Ran
		},
		visible: p.counter(t, p.admin, `SELECT count(*) FROM records WHERE key = 'begun'`),
	}, {
		// Open's migrations, in one transaction; Open fails.
		name: "Open",
		write: func(ctx context.Context) error {
			s, err := store.Open(ctx, fresh, "sandbox", store.Options{Now: clk.Now})
			if err == nil {
				s.Close()
			}
			return err
		},
		wantErr: isCommitUnknown,
		visible: p.counter(t, freshAdmin, `SELECT count(*) FROM pg_tables WHERE tablename = 'schema_migrations'`),
	}}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errcs := make([]chan error, len(cases))
	for i, tc := range cases {
		errcs[i] = make(chan error, 1)
		go func() { errcs[i] <- tc.write(wctx) }()
	}
	var waiting []int
	p.waitFor(t, "every write's COMMIT waiting for the standby", func() bool {
		waiting = p.waiters(t)
		return len(waiting) == len(cases)
	})
	cancel()
	for i, tc := range cases {
		if err := <-errcs[i]; !tc.wantErr(err) {
			t.Errorf("%s() whose context ended while its COMMIT waited for the standby: error = %v, want it maybe committed", tc.name, err)
		}
	}
	if got := p.waiters(t); fmt.Sprint(got) != fmt.Sprint(waiting) {
		t.Errorf("sessions whose COMMIT waits for the standby after the writes' callers left = %v, want %v still waiting", got, waiting)
	}
	for _, tc := range cases {
		if n := tc.visible(); n != 0 {
			t.Errorf("%s: another session sees what it wrote (%d rows) while no standby has it: its COMMIT's wait was cancelled", tc.name, n)
		}
	}

	// Commits no longer wait for a standby: the ones waiting land.
	p.setStandbyNames(t, "")
	for _, tc := range cases {
		p.waitFor(t, tc.name+"'s write visible", func() bool { return tc.visible() > 0 })
	}
	if got := <-lateBegan; got.err != nil || got.b.Verdict != record.Acquired {
		t.Errorf("Begin's late = %+v, %v; want Acquired", got.b, got.err)
	}
	if err := s.CheckWrite(ctx); err != nil {
		t.Errorf("CheckWrite() once commits land = %v, want nil", err)
	}
}

// TestCancelledStandbyWaitIsUnknown: a COMMIT whose wait for the standby
// someone else cancels (pg_cancel_backend: PostgreSQL answers it with a
// WARNING, and the commit is visible although no standby has it) is
// reported as maybe committed, never as written: the transaction's own
// (CheckWrite) and the batcher's (Begin).
func TestCancelledStandbyWaitIsUnknown(t *testing.T) {
	t.Parallel()
	p := startSyncRepServer(t)
	clk := newClock(t0)
	s := openStore(t, p.url, "sandbox", clk)
	ctx := context.Background()
	if err := s.CheckWrite(ctx); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Microsecond) // and stands still: no heartbeat
	p.waitForStandby(t)

	checked := make(chan error, 1)
	go func() { checked <- s.CheckWrite(ctx) }()
	began := make(chan error, 1)
	go func() {
		b, err := s.Begin(ctx, claim("k", "body", "p/1"), nil)
		if err == nil {
			err = fmt.Errorf("verdict %v", b.Verdict)
		}
		began <- err
	}()
	var waiting []int
	p.waitFor(t, "both COMMITs waiting for the standby", func() bool {
		waiting = p.waiters(t)
		return len(waiting) == 2
	})
	for _, pid := range waiting {
		var ok bool
		if err := p.admin.QueryRowContext(ctx, `SELECT pg_cancel_backend($1)`, pid).Scan(&ok); err != nil || !ok {
			t.Fatalf("pg_cancel_backend(%d) = %v, %v", pid, ok, err)
		}
	}
	if err := <-checked; !isCommitUnknown(err) {
		t.Errorf("CheckWrite() whose COMMIT's wait was cancelled = %v, want ErrCommitUnknown", err)
	}
	if err := <-began; !isCommitUnknown(err) {
		t.Errorf("Begin() whose COMMIT's wait was cancelled = %v, want ErrCommitUnknown", err)
	}
}

func isCommitUnknown(err error) bool { return errors.Is(err, store.ErrCommitUnknown) }

// TestWriteHealthNeedsDurableWrites: while every COMMIT that writes waits
// for a standby that never comes, settlement's passes go on every second,
// and those that find nothing to claim write nothing: PostgreSQL commits a
// transaction without a write at once, without waiting for the standby.
// They are no evidence that a durable write can land, and add nothing to
// the store's write health: after the takeover grace, the store has seen
// no write commit, and no lease may be taken over (a holder's outcome,
// its write waiting for the same standby, would land after the takeover:
// the chaos run on a strict Patroni cluster that found this saw a replica
// re-send a key 3 ms before the other's 2xx for it landed).
func TestWriteHealthNeedsDurableWrites(t *testing.T) {
	t.Parallel()
	p := startSyncRepServer(t)
	dbURL, _ := p.database(t, "health")
	clk := newClock(t0)
	s, err := store.Open(context.Background(), dbURL, "sandbox", store.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// A write that commits: the store is healthy from here.
	begin(t, s, claim("held", "body", "p/1"), record.Acquired)

	p.waitForStandby(t)
	// Once a commit is seen waiting, every commit that writes waits (the
	// setting reaches the committing sessions through shared memory a
	// moment after SHOW reads it).
	go p.admin.ExecContext(context.WithoutCancel(t.Context()), `CREATE TABLE waits ()`)
	p.waitFor(t, "a commit waiting for the standby", func() bool { return len(p.waiters(t)) > 0 })
	for range 8 {
		clk.Add(time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		acquired, gaveUp, err := s.SettleDue(ctx, record.Settle{Owner: "q/1", LeaseTTL: time.Minute}, nil, 1)
		cancel()
		if err != nil || len(acquired)+len(gaveUp) != 0 {
			t.Fatalf("SettleDue() = %d acquired, %d given up, %v; want nothing to do", len(acquired), len(gaveUp), err)
		}
		// A caller's retry of the held key: answered from the record,
		// it writes nothing, and its batch is no evidence either (a
		// batch of such claims kept a replica "healthy" through a
		// failover in a chaos run, and it took a lease over while the
		// holder's outcome waited).
		ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
		b, err := s.Begin(ctx, claim("held", "body", "r/1"), nil)
		cancel()
		if err != nil || b.Verdict == record.Acquired {
			t.Fatalf("Begin(held) by another process = %v, %v; want it answered from the record", b.Verdict, err)
		}
	}
	if got := s.WriteHealthyFor(); got != 0 {
		t.Errorf("WriteHealthyFor() = %v after 8s in which no write could commit, want 0", got)
	}
	// Nor is the heartbeat, which commits when nothing else does: a
	// heartbeat that only took a transaction ID committed at once with no
	// standby, and a replica took a lease over in a chaos run while the
	// holder's outcome waited.
	for range 3 {
		clk.Add(time.Second)
		store.Beat(s, 200*time.Millisecond)
	}
	if got := s.WriteHealthyFor(); got != 0 {
		t.Errorf("WriteHealthyFor() = %v after heartbeats while no write could commit, want 0", got)
	}
}
