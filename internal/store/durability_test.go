package store_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
)

// The tests here inject failures beneath the store's own code, through
// storetest.Faults, on both backends: commits that fail or whose outcome
// is lost, statements that fail or hang, and a database that is down. The
// writes' health goes by the suite's clock: the tests move it, and never
// wait for it.

// faultBackends are the backends, each as a fresh database's URL.
func faultBackends(t *testing.T) []struct {
	name string
	url  func(*testing.T) string
} {
	return []struct {
		name string
		url  func(*testing.T) string
	}{
		{"sqlite", func(t *testing.T) string { return storetest.SQLiteURL(t) }},
		{"postgres", func(t *testing.T) string { return storetest.PostgresURL(t) }},
	}
}

// openFaulty opens url through a fault seam with opts, the suite's clock
// clk deciding leases and the writes' health.
func openFaulty(t *testing.T, url string, clk *clock, opts store.Options) (*store.Store, *storetest.Faults) {
	t.Helper()
	f := storetest.NewFaults()
	opts.WrapConnector = f.Wrap
	opts.Now = clk.Now
	s, err := store.Open(context.Background(), url, "sandbox", opts)
	if err != nil {
		t.Fatalf("Open() error = %v", err)
	}
	t.Cleanup(func() {
		f.Clear()
		s.Close()
	})
	return s, f
}

// Patterns of the store's statements, as the seam matches them.
const (
	// finishStatement is the finish (WriteFinish): SQLite's UPDATE, or
	// PostgreSQL's CTE.
	finishStatement = `outcomes = outcomes \+|WITH fin AS`
	claimStatement  = `INSERT INTO records`
	// acquireStatement is WriteAcquire's (and WriteTakeOver's) UPDATE.
	acquireStatement = `SET state = .{2,3}, prior_state`
	auditStatement   = `INSERT INTO audit_entries`
)

func attemptsOf(t *testing.T, s *store.Store, key string) []record.Attempt {
	t.Helper()
	r, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%q) error = %v", key, err)
	}
	as, err := s.Attempts(context.Background(), r)
	if err != nil {
		t.Fatalf("Attempts(%q) error = %v", key, err)
	}
	return as
}

// ignoreAttemptTimes compares attempts without their times, which the
// tests check apart.
var ignoreAttemptTimes = cmpopts.IgnoreFields(record.Attempt{}, "StartedAt", "EndedAt")

// TestCommitFaults makes the commits of each kind of write fail (nothing
// written) or be lost (written, and the store can't tell): the store
// reports ErrCommitUnknown for both, and a retry of the write does what is
// right in each case.
func TestCommitFaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range faultBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, lose := range []bool{false, true} {
				name := map[bool]string{false: "failed", true: "lost"}[lose]
				inject := func(f *storetest.Faults, pattern string) {
					if lose {
						f.LoseCommits(pattern, 1)
					} else {
						f.FailCommits(pattern, 1)
					}
				}
				t.Run(name+" finish", func(t *testing.T) {
					t.Parallel()
					s, f := openFaulty(t, b.url(t), newClock(t0), store.Options{TakeoverGrace: -1})
					claimed := begin(t, s, claim("k", "body", "p/1"), record.Acquired).Record
					o := paid(201, `{"id":"p1"}`)
					o.Owner = "p/1"
					inject(f, finishStatement)
					if _, err := s.Finish(ctx, &claimed, o); !errors.Is(err, store.ErrCommitUnknown) {
						t.Fatalf("Finish() with a %s commit error = %v, want ErrCommitUnknown", name, err)
					}
					wantState := map[bool]record.State{false: record.InProgress, true: record.Succeeded}[lose]
					if r := get(t, s, "k"); r.State != wantState {
						t.Errorf("record after a %s commit = %v, want %v", name, r.State, wantState)
					}
					// The outbox's retry: it lands once, whichever it was.
					finishAs(t, s, claimed, o, record.Written)
					r := get(t, s, "k")
					if r.State != record.Succeeded || string(r.Reply) != `{"id":"p1"}` || r.Requests != 1 {
						t.Errorf("record after the retry = %v %s, %d attempts; want Succeeded with the reply, 1 attempt", r.State, r.Reply, r.Requests)
					}
					want := []record.Attempt{{Number: 1, Kind: record.ByCall, Owner: "p/1", RequestID: "req-p/1",
						ProviderStatus: 201, HTTPRequests: 1, Reply: []byte(`{"id":"p1"}`), State: record.Succeeded}}
					if diff := cmp.Diff(want, attemptsOf(t, s, "k"), ignoreAttemptTimes); diff != "" {
						t.Errorf("attempts after the retry (-want +got):\n%s", diff)
					}
				})
				t.Run(name+" not created", func(t *testing.T) {
					t.Parallel()
					s, f := openFaulty(t, b.url(t), newClock(t0), store.Options{TakeoverGrace: -1})
					claimed := begin(t, s, claim("k", "body", "p/1"), record.Acquired).Record
					o := refused(400)
					o.Owner = "p/1"
					inject(f, finishStatement)
					if _, err := s.Finish(ctx, &claimed, o); !errors.Is(err, store.ErrCommitUnknown) {
						t.Fatalf("Finish() with a %s commit error = %v, want ErrCommitUnknown", name, err)
					}
					finishAs(t, s, claimed, o, record.Written)
					if r := get(t, s, "k"); r.State != record.NotCreated || r.LeaseOwner != "" {
						t.Errorf("record after the retry = %v held by %q, want NotCreated, released", r.State, r.LeaseOwner)
					}
					if as := attemptsOf(t, s, "k"); len(as) != 1 || as[0].ProviderStatus != 400 {
						t.Errorf("attempts after the retry = %+v, want the one 400", as)
					}
				})
				t.Run(name+" claim", func(t *testing.T) {
					t.Parallel()
					s, f := openFaulty(t, b.url(t), newClock(t0), store.Options{TakeoverGrace: -1})
					inject(f, claimStatement)
					_, err := s.Begin(ctx, claim("k", "body", "p/1"), nil)
					if !errors.Is(err, store.ErrCommitUnknown) {
						t.Fatalf("Begin() with a %s commit error = %v, want ErrCommitUnknown", name, err)
					}
					r, err := s.Get(ctx, "k")
					switch {
					case lose && (err != nil || r.State != record.InProgress || r.LeaseOwner != "p/1"):
						t.Errorf("record after a lost claim = %+v, %v; want it InProgress, held by p/1", r, err)
					case !lose && !errors.Is(err, store.ErrNotFound):
						t.Errorf("record after a failed claim = %+v, %v; want none", r, err)
					}
					// The claimant releases what its claim may hold.
					n, err := s.Release(ctx, "p/1", 0)
					if want := map[bool]int{false: 0, true: 1}[lose]; err != nil || n != want {
						t.Errorf("Release(p/1) = %d, %v; want %d", n, err, want)
					}
				})
				t.Run(name+" settlement claim", func(t *testing.T) {
					t.Parallel()
					s, f := openFaulty(t, b.url(t), newClock(t0), store.Options{TakeoverGrace: -1})
					makeUnknown(t, s, claim("k", "body", "p/1"), 0)
					inject(f, acquireStatement)
					if _, _, err := s.SettleDue(ctx, record.Settle{Owner: "q/1", LeaseTTL: lease}, nil, 1); !errors.Is(err, store.ErrCommitUnknown) {
						t.Fatalf("SettleDue() with a %s commit error = %v, want ErrCommitUnknown", name, err)
					}
					r := get(t, s, "k")
					if lose && (r.State != record.InProgress || r.LeaseOwner != "q/1") {
						t.Errorf("record after a lost settlement claim = %v held by %q, want InProgress held by q/1", r.State, r.LeaseOwner)
					}
					if !lose && (r.State != record.OutcomeUnknown || r.LeaseOwner != "") {
						t.Errorf("record after a failed settlement claim = %v held by %q, want OutcomeUnknown, unheld", r.State, r.LeaseOwner)
					}
					// The claimant releases what its claim may hold: its
					// own process would never take it over.
					n, err := s.Release(ctx, "q/1", 0)
					if want := map[bool]int{false: 0, true: 1}[lose]; err != nil || n != want {
						t.Errorf("Release(q/1) = %d, %v; want %d", n, err, want)
					}
					if r := get(t, s, "k"); r.State != record.OutcomeUnknown || r.LeaseOwner != "" {
						t.Errorf("record after Release = %v held by %q, want OutcomeUnknown, unheld", r.State, r.LeaseOwner)
					}
					if got := claimDue(t, s, "q/2", 0, 1); len(got) != 1 || got[0].LeaseOwner != "q/2" {
						t.Errorf("next SettleDue() = %v, want k acquired by q/2", keys(got))
					}
					// The released claim sent nothing: it left no row, and
					// the next attempt takes its number.
					as := attemptsOf(t, s, "k")
					if len(as) != 2 || as[0].Owner != "p/1" || as[1].Owner != "q/2" || as[1].Number != 2 {
						t.Errorf("attempts = %+v; want the first call's, then q/2's in flight, number 2", as)
					}
				})
				t.Run(name+" resolution", func(t *testing.T) {
					t.Parallel()
					s, f := openFaulty(t, b.url(t), newClock(t0), store.Options{TakeoverGrace: -1})
					makeUnknown(t, s, claim("k", "body", "p/1"), 0)
					inject(f, auditStatement)
					_, err := s.Resolve(ctx, "k", record.Resolve{To: record.NotCreated}, store.AuditInfo{Evidence: "e", Actor: "a"})
					if !errors.Is(err, store.ErrCommitUnknown) {
						t.Fatalf("Resolve() with a %s commit error = %v, want ErrCommitUnknown", name, err)
					}
					r := get(t, s, "k")
					es, err := s.AuditEntries(ctx, r)
					if err != nil {
						t.Fatal(err)
					}
					want, wantEntries := record.OutcomeUnknown, 0
					if lose {
						want, wantEntries = record.NotCreated, 1
					}
					if r.State != want || len(es) != wantEntries {
						t.Errorf("after a %s resolution commit: record %v with %d audit entries, want %v with %d", name, r.State, len(es), want, wantEntries)
					}
				})
			}
		})
	}
}

// TestBatchRollbackAndRerun: when one operation of a group commit fails
// in a way that may have left the transaction half-written, the batch is
// rolled back and each operation runs again in a transaction of its own,
// so that the failure fails only its own operation (here, none: it fails
// once).
func TestBatchRollbackAndRerun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range faultBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			s, f := openFaulty(t, b.url(t), newClock(t0), store.Options{TakeoverGrace: -1})
			const n = 4
			claimed := make([]record.Record, n)
			for i := range n {
				claimed[i] = begin(t, s, claim(fmt.Sprintf("k%d", i), "body", "p/1"), record.Acquired).Record
			}
			// A claim whose statement hangs holds the writer, so that the
			// finishes queue up behind it and go into one batch.
			release := f.HangStatements(claimStatement)
			held := make(chan error, 1)
			go func() {
				_, err := s.Begin(ctx, claim("held", "body", "p/2"), nil)
				held <- err
			}()
			waitFired(t, f, "hang statement")
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					o := paid(200, `{}`)
					o.Owner = "p/1"
					var v record.Verdict
					if v, errs[i] = s.Finish(ctx, &claimed[i], o); errs[i] == nil && v != record.Written {
						errs[i] = fmt.Errorf("verdict %v, want Written", v)
					}
				})
			}
			waitQueued(t, s, n)
			f.FailStatements(finishStatement, 1)
			release()
			wg.Wait()
			if err := <-held; err != nil {
				t.Errorf("held Begin() error = %v", err)
			}
			waitFired(t, f, "fail statement")
			for i, err := range errs {
				if err != nil {
					t.Errorf("Finish(k%d) error = %v, want nil: the batch is run again, one by one", i, err)
				}
				key := fmt.Sprintf("k%d", i)
				if r := get(t, s, key); r.State != record.Succeeded {
					t.Errorf("record %s = %v, want Succeeded", key, r.State)
				}
				if as := attemptsOf(t, s, key); len(as) != 1 {
					t.Errorf("attempts of %s = %d, want 1", key, len(as))
				}
			}
		})
	}
}

// waitFired waits for the seam to apply a fault of kind.
func waitFired(t *testing.T, f *storetest.Faults, kind string) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case got := <-f.Fired():
			if got.Fault == kind {
				return
			}
		case <-timeout:
			t.Fatalf("no %q fault was applied", kind)
		}
	}
}

// waitQueued waits until n operations wait for the batcher.
func waitQueued(t *testing.T, s *store.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for store.QueuedOps(s) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d operations queued, want %d", store.QueuedOps(s), n)
		}
		time.Sleep(time.Millisecond) // polling the batcher's queue: it has no signal
	}
}

// heal moves the clock on by d in steps shorter than the longest gap
// between commits that counts as health, committing a write at each: the
// store's writes have then been healthy for d.
func heal(t *testing.T, s *store.Store, clk *clock, d time.Duration) {
	t.Helper()
	const step = time.Second
	for moved := time.Duration(-1); moved < d; moved += step {
		if moved >= 0 {
			clk.Add(step)
		}
		if err := s.CheckWrite(context.Background()); err != nil {
			t.Fatalf("CheckWrite() error = %v", err)
		}
	}
	if got := s.WriteHealthyFor(); got < d {
		t.Fatalf("WriteHealthyFor() = %v after healthy writes for %v", got, d)
	}
}

// TestTakeoverWaitsForHealthyWrites: a record whose holder's lease expired
// is taken over (by Begin or SettleDue, to send it or to give it up) only
// once the store's writes have been healthy for the takeover grace,
// counted afresh after every outage: the holder, which may have an outcome
// on its way, gets to write it first.
func TestTakeoverWaitsForHealthyWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const grace = 3 * time.Second
	for _, b := range faultBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock(t0)
			s, f := openFaulty(t, b.url(t), clk, store.Options{TakeoverGrace: grace})
			for _, k := range []string{"a", "b", "c"} {
				c := claim(k, "body", "holder/1")
				if k == "c" {
					c.Window = lease / 2 // so that c's window closes too
				}
				begin(t, s, c, record.Acquired)
			}
			clk.Add(lease)
			heal(t, s, clk, grace)
			begin(t, s, claim("a", "body", "taker/1"), record.Acquired)

			// An outage: every write fails, and health starts again after.
			f.Down()
			if _, err := s.Begin(ctx, claim("b", "body", "taker/2"), nil); err == nil {
				t.Errorf("Begin() with the database down error = nil")
			}
			if hf := s.WriteHealthyFor(); hf != 0 {
				t.Errorf("WriteHealthyFor() = %v after a failed write, want 0", hf)
			}
			resumed := s.WritesResumed()
			f.Up()
			begin(t, s, claim("b", "body", "taker/2"), record.Busy)
			if got, gave := settleDue(t, s, "settler/1", 0, 10); len(got)+len(gave) != 0 {
				t.Errorf("SettleDue() just after an outage = %v, %v; want nothing", keys(got), keys(gave))
			}
			// Neither wrote anything, which on PostgreSQL proves nothing of
			// writes (noteWrote); a new key's claim does.
			begin(t, s, claim("d", "body", "taker/3"), record.Acquired)
			select {
			case <-resumed:
			default:
				t.Errorf("WritesResumed() was not closed once writes committed again")
			}
			heal(t, s, clk, grace)
			begin(t, s, claim("b", "body", "taker/2"), record.Acquired)
			if gave := giveUp(t, s, "settler/1"); len(gave) != 1 || gave[0].Key != "c" {
				t.Errorf("give-up pass once healthy = %v; want c", keys(gave))
			}
		})
	}
}

// TestHeldSQLiteLockStopsTakeovers: another process holding the SQLite
// database's write lock stops this store's writes, heartbeat included,
// and its health starts again only when the lock is released.
func TestHeldSQLiteLockStopsTakeovers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := storetest.SQLiteURL(t)
	clk := newClock(t0)
	const grace = 2 * time.Second
	s, _ := openFaulty(t, url, clk, store.Options{TakeoverGrace: grace})
	begin(t, s, claim("k", "body", "holder/1"), record.Acquired)
	clk.Add(lease)
	heal(t, s, clk, grace)

	other, err := sql.Open(store.SQLiteDriver, store.SQLiteDSN(strings.TrimPrefix(url, "sqlite:"), false, "busy_timeout(10000)"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	// No write commits while the lock is held: by the time a gap longer
	// than the longest counted has passed, health is 0.
	clk.Add(2 * time.Second)
	if hf := s.WriteHealthyFor(); hf != 0 {
		t.Errorf("WriteHealthyFor() = %v with no commit for 2s, want 0", hf)
	}
	took := make(chan record.Verdict, 1)
	go func() {
		b, err := s.Begin(ctx, claim("k", "body", "taker/1"), nil)
		if err != nil {
			t.Errorf("Begin() error = %v", err)
		}
		took <- b.Verdict
	}()
	if _, err := conn.ExecContext(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
	if got := <-took; got != record.Busy {
		t.Errorf("Begin(expired lease) as the lock was released = %v, want Busy", got)
	}
	heal(t, s, clk, grace)
	begin(t, s, claim("k", "body", "taker/1"), record.Acquired)
}

// TestNoTakeoverOfOwnProcess: a claim never takes over a record whose
// expired lease is held by a claim of its own process (whose outcome is
// in that process's outbox); another process's may.
func TestNoTakeoverOfOwnProcess(t *testing.T) {
	t.Parallel()
	for _, b := range faultBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock(t0)
			s, _ := openFaulty(t, b.url(t), clk, store.Options{TakeoverGrace: -1})
			c := claim("k", "body", "p/1")
			c.Window = lease / 2
			begin(t, s, c, record.Acquired)
			clk.Add(lease)
			begin(t, s, claim("k", "body", "p/2"), record.Busy)
			if got, gave := settleDue(t, s, "p/3", 0, 10); len(got)+len(gave) != 0 {
				t.Errorf("SettleDue(own process) = %v, %v; want nothing", keys(got), keys(gave))
			}
			// A process whose name another's begins with is another.
			if gave := giveUp(t, s, "pp/1"); len(gave) != 1 {
				t.Errorf("give-up pass (another process) = %v; want k", keys(gave))
			}
		})
	}
}

// TestLateSuccessIsNeverLost: a 2xx whose holder lost its lease (it was
// cut off from the database, and another process took the record over) is
// still recorded, as its attempt and as the record's state; what the
// taker learns after it never makes the record forget it.
func TestLateSuccessIsNeverLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range faultBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock(t0)
			s, _ := openFaulty(t, b.url(t), clk, store.Options{TakeoverGrace: -1})
			first := begin(t, s, claim("k", "body", "p/1"), record.Acquired).Record
			clk.Add(lease)
			taker := begin(t, s, claim("k", "body", "q/1"), record.Acquired).Record

			late := paid(201, `{"id":"first"}`)
			late.Owner = "p/1"
			finishAs(t, s, first, late, record.Late)
			r := get(t, s, "k")
			if r.State != record.Succeeded || string(r.Reply) != `{"id":"first"}` || r.LeaseOwner != "" || r.ProviderStatus != 201 {
				t.Errorf("record after the late 2xx = %v %s held by %q, want Succeeded with it, released", r.State, r.Reply, r.LeaseOwner)
			}
			// The taker hears a refusal: the record stays as it is.
			finishAs(t, s, taker, record.Outcome{Owner: "q/1", Result: record.Refused, ProviderStatus: 400}, record.LeaseLost)
			// Or a 2xx of its own: recorded as its attempt, the record
			// keeps the first.
			second := paid(200, `{"id":"second"}`)
			second.Owner = "q/1"
			finishAs(t, s, taker, second, record.Late)
			// A repeat of the first (its commit's outcome was unknown)
			// writes nothing more.
			finishAs(t, s, first, late, record.Written)
			r = get(t, s, "k")
			if r.State != record.Succeeded || string(r.Reply) != `{"id":"first"}` || r.Requests != 2 {
				t.Errorf("record at the end = %v %s, %d attempts; want Succeeded with the first reply, 2 attempts", r.State, r.Reply, r.Requests)
			}
			want := []record.Attempt{
				{Number: 1, Kind: record.ByCall, Owner: "p/1", RequestID: "req-p/1", ProviderStatus: 201, HTTPRequests: 1,
					Reply: []byte(`{"id":"first"}`), State: record.Succeeded},
				{Number: 2, Kind: record.ByCall, Owner: "q/1", RequestID: "req-q/1", ProviderStatus: 200, HTTPRequests: 1,
					Reply: []byte(`{"id":"second"}`), State: record.Succeeded},
			}
			if diff := cmp.Diff(want, attemptsOf(t, s, "k"), ignoreAttemptTimes); diff != "" {
				t.Errorf("attempts (-want +got):\n%s", diff)
			}
			if _, err := s.Resolve(ctx, "k", record.Resolve{To: record.NotCreated}, store.AuditInfo{Evidence: "e", Actor: "a"}); !errors.Is(err, store.ErrNotUnknown) {
				t.Errorf("Resolve(NotCreated) error = %v, want ErrNotUnknown", err)
			}
		})
	}
}

// TestLateSuccessOverridesAResolution: a person resolved NotCreated after
// the holder was taken over and the taker's attempt left the outcome
// unknown; the holder's 2xx then lands. The record says Succeeded, with
// the provider's answer.
func TestLateSuccessOverridesAResolution(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := newClock(t0)
	s, _ := openFaulty(t, storetest.SQLiteURL(t), clk, store.Options{TakeoverGrace: -1})
	first := begin(t, s, claim("k", "body", "p/1"), record.Acquired).Record
	clk.Add(lease)
	begin(t, s, claim("k", "body", "q/1"), record.Acquired)
	finish(t, s, "k", record.Outcome{Result: record.Unknown, HTTPRequests: 1})
	if _, err := s.Resolve(ctx, "k", record.Resolve{To: record.NotCreated}, store.AuditInfo{Evidence: "e", Actor: "a"}); err != nil {
		t.Fatal(err)
	}
	late := paid(201, `{}`)
	late.Owner = "p/1"
	finishAs(t, s, first, late, record.Late)
	if r := get(t, s, "k"); r.State != record.Succeeded || r.ProviderStatus != 201 || string(r.Reply) != `{}` {
		t.Errorf("record = %v, provider status %d, reply %s; want Succeeded by the provider's 201", r.State, r.ProviderStatus, r.Reply)
	}
}

// TestAttemptsKept follows a key through a call, settlement, a takeover
// and giving up: each attempt gets its row when it ends, whoever ends it,
// and the one in flight is shown from the record.
func TestAttemptsKept(t *testing.T) {
	t.Parallel()
	for _, b := range faultBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock(t0)
			s, _ := openFaulty(t, b.url(t), clk, store.Options{TakeoverGrace: -1})
			c := claim("k", "body", "p/1")
			c.Window = 3 * lease
			begin(t, s, c, record.Acquired)
			finish(t, s, "k", record.Outcome{Result: record.Unknown, HTTPRequests: 2, ProviderStatus: 502, Reply: []byte(`bad gateway`),
				Error: "502", Code: 14})
			if got := claimDue(t, s, "settler/1", 0, 1); len(got) != 1 {
				t.Fatalf("SettleDue() = %v, want k", keys(got))
			}
			as := attemptsOf(t, s, "k")
			if len(as) != 2 || !as[1].InFlight || as[1].Kind != record.BySettlement || as[1].Owner != "settler/1" || as[1].Number != 2 {
				t.Errorf("attempts with settlement in flight = %+v, want the call's, then settlement's in flight", as)
			}
			clk.Add(lease)
			begin(t, s, claim("k", "body", "q/1"), record.Acquired) // the settler died
			clk.Add(2 * lease)                                      // and so did q/1; the window closes
			if gave := giveUp(t, s, "r/1"); len(gave) != 1 {
				t.Fatalf("give-up pass = %v; want k", keys(gave))
			}
			want := []record.Attempt{
				{Number: 1, Kind: record.ByCall, Owner: "p/1", RequestID: "req-p/1", ProviderStatus: 502, HTTPRequests: 2,
					Reply: []byte(`bad gateway`), State: record.OutcomeUnknown, Code: 14, Error: "502"},
				{Number: 2, Kind: record.BySettlement, Owner: "settler/1", State: record.OutcomeUnknown,
					Error: record.AbandonedError, Abandoned: true},
				{Number: 3, Kind: record.ByCall, Owner: "q/1", RequestID: "req-q/1", State: record.OutcomeUnknown,
					Error: record.AbandonedError, Abandoned: true},
			}
			got := attemptsOf(t, s, "k")
			if diff := cmp.Diff(want, got, ignoreAttemptTimes); diff != "" {
				t.Errorf("attempts (-want +got):\n%s", diff)
			}
			if len(got) == 3 && (!got[0].StartedAt.Equal(us(t0)) || !got[2].EndedAt.Equal(us(t0.Add(3*lease)))) {
				t.Errorf("attempt times: first started %v, last ended %v; want %v, %v", got[0].StartedAt, got[2].EndedAt, us(t0), us(t0.Add(3*lease)))
			}
			for _, a := range got {
				if want := strings.Split(a.Owner, "/")[0]; a.Replica() != want {
					t.Errorf("attempt %d: Replica() = %q, want %q", a.Number, a.Replica(), want)
				}
			}
		})
	}
}
