package store_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"example.com/paymentsd/store"
	"example.com/paymentsd/store/storetest"
)

// The tests here inject failures beneath the store's own code, through
// storetest.Faults, on both backends: commits that fail or whose outcome
// is lost, statements that fail or hang, and a database that is down.

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
// clk (if not nil) deciding leases.
func openFaulty(t *testing.T, url string, clk *clock, opts store.Options) (*store.Store, *storetest.Faults) {
	t.Helper()
	f := storetest.NewFaults()
	opts.WrapConnector = f.Wrap
	if clk != nil {
		opts.Now = clk.Now
	}
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
	finishStatement   = `settle_attempts = settle_attempts \+`
	claimStatement    = `INSERT INTO records`
	claimDueStatement = `attempt_request_id = ''`
	auditStatement    = `INSERT INTO audit_entries`
	attemptStatement  = `INSERT INTO attempts`
)

func attemptsOf(t *testing.T, s *store.Store, key string) []store.Attempt {
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

// ignoreAttemptTimes compares attempts without their times and owners'
// replicas, which the tests check apart.
var ignoreAttemptTimes = cmpopts.IgnoreFields(store.Attempt{}, "StartedAt", "EndedAt")

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
					clk := newClock(t0)
					s, f := openFaulty(t, b.url(t), clk, store.Options{TakeoverGrace: -1})
					begin(t, s, claim("k", "body", "p/1"), store.Acquired)
					fin := store.Finish{Key: "k", Owner: "p/1", State: store.StateSucceeded, AddAttempts: 1,
						ProviderStatus: 201, Reply: []byte(`{"id":"p1"}`)}
					inject(f, finishStatement)
					if _, err := s.FinishWrite(ctx, fin); !errors.Is(err, store.ErrCommitUnknown) {
						t.Fatalf("FinishWrite() with a %s commit error = %v, want ErrCommitUnknown", name, err)
					}
					wantState := map[bool]store.State{false: store.StateInProgress, true: store.StateSucceeded}[lose]
					if r := get(t, s, "k"); r.State != wantState {
						t.Errorf("record after a %s commit = %v, want %v", name, r.State, wantState)
					}
					// The outbox's retry: it lands once, whichever it was.
					if _, err := s.FinishWrite(ctx, fin); err != nil {
						t.Fatalf("FinishWrite() again error = %v", err)
					}
					r := get(t, s, "k")
					if r.State != store.StateSucceeded || string(r.Reply) != `{"id":"p1"}` || r.Attempts != 1 {
						t.Errorf("record after the retry = %v %s, %d attempts; want Succeeded with the reply, 1 attempt", r.State, r.Reply, r.Attempts)
					}
					want := []store.Attempt{{Number: 1, Kind: store.AttemptCall, Owner: "p/1", Replica: "p", RequestID: "req-p/1",
						ProviderStatus: 201, HTTPRequests: 1, Reply: []byte(`{"id":"p1"}`), State: store.StateSucceeded}}
					if diff := cmp.Diff(want, attemptsOf(t, s, "k"), ignoreAttemptTimes); diff != "" {
						t.Errorf("attempts after the retry (-want +got):\n%s", diff)
					}
				})
				t.Run(name+" not created", func(t *testing.T) {
					t.Parallel()
					clk := newClock(t0)
					s, f := openFaulty(t, b.url(t), clk, store.Options{TakeoverGrace: -1})
					begin(t, s, claim("k", "body", "p/1"), store.Acquired)
					fin := store.Finish{Key: "k", Owner: "p/1", State: store.StateNotCreated, AddAttempts: 1,
						ProviderStatus: 400, Reply: []byte(`{"error":"no"}`), LastError: "refused", Code: 3}
					inject(f, finishStatement)
					if _, err := s.FinishWrite(ctx, fin); !errors.Is(err, store.ErrCommitUnknown) {
						t.Fatalf("FinishWrite() with a %s commit error = %v, want ErrCommitUnknown", name, err)
					}
					if _, err := s.FinishWrite(ctx, fin); err != nil {
						t.Fatalf("FinishWrite() again error = %v", err)
					}
					if r := get(t, s, "k"); r.State != store.StateNotCreated || r.LeaseOwner != "" {
						t.Errorf("record after the retry = %v held by %q, want NotCreated, released", r.State, r.LeaseOwner)
					}
					if as := attemptsOf(t, s, "k"); len(as) != 1 || as[0].ProviderStatus != 400 {
						t.Errorf("attempts after the retry = %+v, want the one 400", as)
					}
				})
				t.Run(name+" claim", func(t *testing.T) {
					t.Parallel()
					clk := newClock(t0)
					s, f := openFaulty(t, b.url(t), clk, store.Options{TakeoverGrace: -1})
					inject(f, claimStatement)
					_, err := s.Begin(ctx, claim("k", "body", "p/1"))
					if !errors.Is(err, store.ErrCommitUnknown) {
						t.Fatalf("Begin() with a %s commit error = %v, want ErrCommitUnknown", name, err)
					}
					r, err := s.Get(ctx, "k")
					switch {
					case lose && (err != nil || r.State != store.StateInProgress || r.LeaseOwner != "p/1"):
						t.Errorf("record after a lost claim = %+v, %v; want it InProgress, held by p/1", r, err)
					case !lose && !errors.Is(err, store.ErrNotFound):
						t.Errorf("record after a failed claim = %+v, %v; want none", r, err)
					}
				})
				t.Run(name+" settlement claim", func(t *testing.T) {
					t.Parallel()
					clk := newClock(t0)
					s, f := openFaulty(t, b.url(t), clk, store.Options{TakeoverGrace: -1})
					makeUnknown(t, s, claim("k", "body", "p/1"), 0)
					inject(f, claimDueStatement)
					if _, err := s.ClaimDue(ctx, "q/1", lease, 0, 1); !errors.Is(err, store.ErrCommitUnknown) {
						t.Fatalf("ClaimDue() with a %s commit error = %v, want ErrCommitUnknown", name, err)
					}
					r := get(t, s, "k")
					if lose && (r.State != store.StateInProgress || r.LeaseOwner != "q/1") {
						t.Errorf("record after a lost settlement claim = %v held by %q, want InProgress held by q/1", r.State, r.LeaseOwner)
					}
					if !lose && (r.State != store.StateOutcomeUnknown || r.LeaseOwner != "") {
						t.Errorf("record after a failed settlement claim = %v held by %q, want OutcomeUnknown, unheld", r.State, r.LeaseOwner)
					}
					// The claimant releases what its claim may hold: its
					// own process would never take it over.
					n, err := s.Release(ctx, "q/1", 0)
					if want := map[bool]int{false: 0, true: 1}[lose]; err != nil || n != want {
						t.Errorf("Release(q/1) = %d, %v; want %d", n, err, want)
					}
					if r := get(t, s, "k"); r.State != store.StateOutcomeUnknown || r.LeaseOwner != "" {
						t.Errorf("record after Release = %v held by %q, want OutcomeUnknown, unheld", r.State, r.LeaseOwner)
					}
					if got := claimDue(t, s, "q/2", 0, 1); len(got) != 1 || got[0].LeaseOwner != "q/2" {
						t.Errorf("next ClaimDue() = %v, want k claimed by q/2", keys(got))
					}
					as := attemptsOf(t, s, "k")
					if want := map[bool]int{false: 2, true: 3}[lose]; len(as) != want || (lose && (as[1].Owner != "q/1" || as[1].HTTPRequests != 0)) {
						t.Errorf("attempts = %+v; want the first call's, the released claim's (if it committed), the new claim's", as)
					}
				})
				t.Run(name+" resolution", func(t *testing.T) {
					t.Parallel()
					clk := newClock(t0)
					s, f := openFaulty(t, b.url(t), clk, store.Options{TakeoverGrace: -1})
					makeUnknown(t, s, claim("k", "body", "p/1"), 0)
					inject(f, auditStatement)
					_, err := s.Resolve(ctx, store.Resolution{Key: "k", To: store.StateNotCreated, Evidence: "e", Actor: "a"})
					if !errors.Is(err, store.ErrCommitUnknown) {
						t.Fatalf("Resolve() with a %s commit error = %v, want ErrCommitUnknown", name, err)
					}
					r := get(t, s, "k")
					es, err := s.AuditEntries(ctx, r)
					if err != nil {
						t.Fatal(err)
					}
					want, wantEntries := store.StateOutcomeUnknown, 0
					if lose {
						want, wantEntries = store.StateNotCreated, 1
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
			clk := newClock(t0)
			s, f := openFaulty(t, b.url(t), clk, store.Options{TakeoverGrace: -1})
			const n = 4
			for i := range n {
				begin(t, s, claim(fmt.Sprintf("k%d", i), "body", "p/1"), store.Acquired)
			}
			// A claim whose statement hangs holds the writer, so that the
			// finishes queue up behind it and go into one batch.
			release := f.HangStatements(claimStatement)
			held := make(chan error, 1)
			go func() {
				_, err := s.Begin(ctx, claim("held", "body", "p/2"))
				held <- err
			}()
			waitFired(t, f, "hang statement")
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					_, errs[i] = s.FinishWrite(ctx, store.Finish{Key: fmt.Sprintf("k%d", i), Owner: "p/1", State: store.StateSucceeded,
						AddAttempts: 1, ProviderStatus: 200, Reply: []byte(`{}`)})
				})
			}
			for store.QueuedOps(s) < n {
				time.Sleep(time.Millisecond) // polling the batcher's queue: it has no signal
			}
			f.FailStatements(attemptStatement, 1)
			release()
			wg.Wait()
			if err := <-held; err != nil {
				t.Errorf("held Begin() error = %v", err)
			}
			waitFired(t, f, "fail statement")
			for i, err := range errs {
				if err != nil {
					t.Errorf("FinishWrite(k%d) error = %v, want nil: the batch is run again, one by one", i, err)
				}
				key := fmt.Sprintf("k%d", i)
				if r := get(t, s, key); r.State != store.StateSucceeded {
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
	timeout := time.After(30 * time.Second)
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
// is taken over (by Begin, ClaimDue or GiveUp) only once the store's
// writes have been healthy for the takeover grace, counted afresh after
// every outage: the holder, which may have an outcome on its way, gets to
// write it first. The writes' health goes by the store's clock, which the
// test moves: it never waits for it.
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
				begin(t, s, c, store.Acquired)
			}
			clk.Add(lease)
			heal(t, s, clk, grace)
			begin(t, s, claim("a", "body", "taker/1"), store.Acquired)

			// An outage: every write fails, and health starts again after.
			f.Down()
			if _, err := s.Begin(ctx, claim("b", "body", "taker/2")); err == nil {
				t.Errorf("Begin() with the database down error = nil")
			}
			if hf := s.WriteHealthyFor(); hf != 0 {
				t.Errorf("WriteHealthyFor() = %v after a failed write, want 0", hf)
			}
			resumed := s.WritesResumed()
			f.Up()
			begin(t, s, claim("b", "body", "taker/2"), store.Busy)
			if got, err := s.ClaimDue(ctx, "settler/1", lease, 0, 10); err != nil || len(got) != 0 {
				t.Errorf("ClaimDue() just after an outage = %v, %v; want nothing", keys(got), err)
			}
			if gave, err := s.GiveUp(ctx, "settler", 10); err != nil || len(gave) != 0 {
				t.Errorf("GiveUp() just after an outage = %v, %v; want nothing", keys(gave), err)
			}
			select {
			case <-resumed:
			default:
				t.Errorf("WritesResumed() was not closed once writes committed again")
			}
			heal(t, s, clk, grace)
			begin(t, s, claim("b", "body", "taker/2"), store.Acquired)
			if gave, err := s.GiveUp(ctx, "settler", 10); err != nil || len(gave) != 1 || gave[0].Key != "c" {
				t.Errorf("GiveUp() once healthy = %v, %v; want c", keys(gave), err)
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
	begin(t, s, claim("k", "body", "holder/1"), store.Acquired)
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
	took := make(chan store.Outcome, 1)
	go func() {
		b, err := s.Begin(ctx, claim("k", "body", "taker/1"))
		if err != nil {
			t.Errorf("Begin() error = %v", err)
		}
		took <- b.Outcome
	}()
	if _, err := conn.ExecContext(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
	if got := <-took; got != store.Busy {
		t.Errorf("Begin(expired lease) as the lock was released = %v, want Busy", got)
	}
	heal(t, s, clk, grace)
	begin(t, s, claim("k", "body", "taker/1"), store.Acquired)
}

// TestNoTakeoverOfOwnProcess: a claim never takes over a record whose
// expired lease is held by a claim of its own process (whose outcome is
// in that process's outbox); another process's may.
func TestNoTakeoverOfOwnProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range faultBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock(t0)
			s, _ := openFaulty(t, b.url(t), clk, store.Options{TakeoverGrace: -1})
			c := claim("k", "body", "p/1")
			c.Window = lease / 2
			begin(t, s, c, store.Acquired)
			clk.Add(lease)
			begin(t, s, claim("k", "body", "p/2"), store.Busy)
			if got := claimDue(t, s, "p/3", 0, 10); len(got) != 0 {
				t.Errorf("ClaimDue(own process) = %v, want nothing", keys(got))
			}
			if gave, err := s.GiveUp(ctx, "p", 10); err != nil || len(gave) != 0 {
				t.Errorf("GiveUp(own process) = %v, %v; want nothing", keys(gave), err)
			}
			// A process whose name another's begins with is another.
			if gave, err := s.GiveUp(ctx, "pp", 10); err != nil || len(gave) != 1 {
				t.Errorf("GiveUp(another process) = %v, %v; want k", keys(gave), err)
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
			begin(t, s, claim("k", "body", "p/1"), store.Acquired)
			clk.Add(lease)
			begin(t, s, claim("k", "body", "q/1"), store.Acquired)

			late := store.Finish{Key: "k", Owner: "p/1", State: store.StateSucceeded, AddAttempts: 1, ProviderStatus: 201, Reply: []byte(`{"id":"first"}`)}
			if _, err := s.FinishWrite(ctx, late); err != nil {
				t.Fatalf("FinishWrite(late 2xx) error = %v", err)
			}
			r := get(t, s, "k")
			if r.State != store.StateSucceeded || string(r.Reply) != `{"id":"first"}` || r.LeaseOwner != "" || r.ProviderStatus != 201 {
				t.Errorf("record after the late 2xx = %v %s held by %q, want Succeeded with it, released", r.State, r.Reply, r.LeaseOwner)
			}
			// The taker hears a refusal: the record stays as it is.
			if _, err := s.Finish(ctx, store.Finish{Key: "k", Owner: "q/1", State: store.StateNotCreated, ProviderStatus: 400}); !errors.Is(err, store.ErrLeaseLost) {
				t.Errorf("Finish(taker's refusal) error = %v, want ErrLeaseLost", err)
			}
			// Or a 2xx of its own: recorded as its attempt, the record
			// keeps the first.
			if _, err := s.FinishWrite(ctx, store.Finish{Key: "k", Owner: "q/1", State: store.StateSucceeded, AddAttempts: 1, ProviderStatus: 200, Reply: []byte(`{"id":"second"}`)}); err != nil {
				t.Errorf("FinishWrite(taker's 2xx) error = %v", err)
			}
			// A repeat of the first (its commit's outcome was unknown)
			// writes nothing more.
			if _, err := s.FinishWrite(ctx, late); err != nil {
				t.Errorf("FinishWrite(late 2xx again) error = %v", err)
			}
			r = get(t, s, "k")
			if r.State != store.StateSucceeded || string(r.Reply) != `{"id":"first"}` || r.Attempts != 2 {
				t.Errorf("record at the end = %v %s, %d attempts; want Succeeded with the first reply, 2 attempts", r.State, r.Reply, r.Attempts)
			}
			want := []store.Attempt{
				{Number: 1, Kind: store.AttemptCall, Owner: "p/1", Replica: "p", RequestID: "req-p/1", ProviderStatus: 201, HTTPRequests: 1,
					Reply: []byte(`{"id":"first"}`), State: store.StateSucceeded},
				{Number: 2, Kind: store.AttemptCall, Owner: "q/1", Replica: "q", RequestID: "req-q/1", ProviderStatus: 200, HTTPRequests: 1,
					Reply: []byte(`{"id":"second"}`), State: store.StateSucceeded},
			}
			if diff := cmp.Diff(want, attemptsOf(t, s, "k"), ignoreAttemptTimes); diff != "" {
				t.Errorf("attempts (-want +got):\n%s", diff)
			}
			if _, err := s.Resolve(ctx, store.Resolution{Key: "k", To: store.StateNotCreated, Evidence: "e", Actor: "a"}); !errors.Is(err, store.ErrNotUnknown) {
				t.Errorf("Resolve(NotCreated) error = %v, want ErrNotUnknown", err)
			}
		})
	}
}

// TestLateSuccessOverridesAResolution: a person resolved NotCreated after
// the holder was taken over and the taker's attempt left the outcome
// unknown; the holder's 2xx then lands. The record says Succeeded (what
// the provider said), no longer the person's resolution.
func TestLateSuccessOverridesAResolution(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := newClock(t0)
	s, _ := openFaulty(t, storetest.SQLiteURL(t), clk, store.Options{TakeoverGrace: -1})
	begin(t, s, claim("k", "body", "p/1"), store.Acquired)
	clk.Add(lease)
	begin(t, s, claim("k", "body", "q/1"), store.Acquired)
	finish(t, s, store.Finish{Key: "k", Owner: "q/1", State: store.StateOutcomeUnknown, AddAttempts: 1})
	if _, err := s.Resolve(ctx, store.Resolution{Key: "k", To: store.StateNotCreated, Evidence: "e", Actor: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FinishWrite(ctx, store.Finish{Key: "k", Owner: "p/1", State: store.StateSucceeded, AddAttempts: 1, ProviderStatus: 201, Reply: []byte(`{}`)}); err != nil {
		t.Fatalf("FinishWrite(late 2xx) error = %v", err)
	}
	if r := get(t, s, "k"); r.State != store.StateSucceeded || r.StateResolved() || r.ProviderStatus != 201 {
		t.Errorf("record = %v, resolved %v, provider status %d; want Succeeded by the provider's 201", r.State, r.StateResolved(), r.ProviderStatus)
	}
}

// TestAttemptsKept follows a key through a call, settlement, a takeover
// and giving up: each attempt gets its row when it ends, whoever ends it,
// and the one in flight is shown from the record.
func TestAttemptsKept(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range faultBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock(t0)
			s, _ := openFaulty(t, b.url(t), clk, store.Options{TakeoverGrace: -1})
			c := claim("k", "body", "p/1")
			c.Window = 3 * lease
			begin(t, s, c, store.Acquired)
			finish(t, s, store.Finish{Key: "k", Owner: "p/1", State: store.StateOutcomeUnknown, AddAttempts: 2,
				ProviderStatus: 502, Reply: []byte(`bad gateway`), LastError: "502", Code: 14})
			if got := claimDue(t, s, "settler/1", 0, 1); len(got) != 1 {
				t.Fatalf("ClaimDue() = %v, want k", keys(got))
			}
			as := attemptsOf(t, s, "k")
			if len(as) != 2 || !as[1].InFlight || as[1].Kind != store.AttemptSettlement || as[1].Owner != "settler/1" || as[1].Number != 2 {
				t.Errorf("attempts with settlement in flight = %+v, want the call's, then settlement's in flight", as)
			}
			clk.Add(lease)
			begin(t, s, claim("k", "body", "q/1"), store.Acquired) // the settler died
			clk.Add(2 * lease)                                     // and so did q/1; the window closes
			if gave, err := s.GiveUp(ctx, "r", 10); err != nil || len(gave) != 1 {
				t.Fatalf("GiveUp() = %v, %v; want k", keys(gave), err)
			}
			want := []store.Attempt{
				{Number: 1, Kind: store.AttemptCall, Owner: "p/1", Replica: "p", RequestID: "req-p/1", ProviderStatus: 502, HTTPRequests: 2,
					Reply: []byte(`bad gateway`), State: store.StateOutcomeUnknown, Code: 14, Error: "502"},
				{Number: 2, Kind: store.AttemptSettlement, Owner: "settler/1", Replica: "settler", State: store.StateOutcomeUnknown,
					Error: "abandoned: no answer recorded", Abandoned: true},
				{Number: 3, Kind: store.AttemptCall, Owner: "q/1", Replica: "q", RequestID: "req-q/1", State: store.StateOutcomeUnknown,
					Error: "abandoned: no answer recorded", Abandoned: true},
			}
			got := attemptsOf(t, s, "k")
			if diff := cmp.Diff(want, got, ignoreAttemptTimes); diff != "" {
				t.Errorf("attempts (-want +got):\n%s", diff)
			}
			if len(got) == 3 && (!got[0].StartedAt.Equal(us(t0)) || !got[2].EndedAt.Equal(us(t0.Add(3*lease)))) {
				t.Errorf("attempt times: first started %v, last ended %v; want %v, %v", got[0].StartedAt, got[2].EndedAt, us(t0), us(t0.Add(3*lease)))
			}
		})
	}
}

// TestResolveNotCreatedRefusedAfterA2xx: a record whose attempt got a 2xx
// is never resolved NotCreated. (The store keeps such a record Succeeded;
// the row is written by hand here, as a person with database access
// could.)
func TestResolveNotCreatedRefusedAfterA2xx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range faultBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock(t0)
			s, _ := openFaulty(t, b.url(t), clk, store.Options{TakeoverGrace: -1})
			makeUnknown(t, s, claim("k", "body", "p/1"), 0)
			keyCol := map[string]string{"sqlite": "key", "postgres": "key_hash"}[b.name]
			if err := store.Exec(ctx, s, `INSERT INTO attempts (`+keyCol+`, attempt, kind, owner, replica, request_id, started_at, ended_at,
				provider_status, http_requests, reply, state, code, error, abandoned)
				SELECT `+keyCol+`, 9, 1, 'x/1', 'x', '', created_at, created_at, 201, 1, NULL, 2, 0, '', false
				FROM records WHERE key = 'k'`); err != nil {
				t.Fatal(err)
			}
			before := get(t, s, "k")
			if _, err := s.Resolve(ctx, store.Resolution{Key: "k", To: store.StateNotCreated, Evidence: "e", Actor: "a"}); !errors.Is(err, store.ErrAttemptSucceeded) {
				t.Errorf("Resolve(NotCreated) error = %v, want ErrAttemptSucceeded", err)
			}
			if diff := cmp.Diff(before, get(t, s, "k"), cmpopts.IgnoreFields(store.Record{}, "ReadAt")); diff != "" {
				t.Errorf("refused resolution changed the record (-before +after):\n%s", diff)
			}
			if _, err := s.Resolve(ctx, store.Resolution{Key: "k", To: store.StateSucceeded, Evidence: "e", Actor: "a"}); err != nil {
				t.Errorf("Resolve(Succeeded) error = %v", err)
			}
		})
	}
}

// lostCommits is a database's own view of a store's records, to make it
// go back in time as a failover to an asynchronous standby that lacked
// the last commits does: rows the store committed vanish, or return to
// what they were before.
type lostCommits struct {
	db      *sql.DB
	backend string
}

func openLostCommits(t *testing.T, backend, url string) *lostCommits {
	t.Helper()
	driver, dsn := "pgx", url
	if backend == "sqlite" {
		driver, dsn = store.SQLiteDriver, store.SQLiteDSN(strings.TrimPrefix(url, "sqlite:"), false, "busy_timeout(10000)")
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &lostCommits{db: db, backend: backend}
}

// exec runs query, with $1 bound to key, on the records or attempts of
// key (the column {k} names it).
func (l *lostCommits) exec(t *testing.T, query, key string) {
	t.Helper()
	col, arg := "key", any(key)
	if l.backend == "postgres" {
		sum := sha256.Sum256([]byte(key))
		col, arg = "key_hash", sum[:]
	} else {
		query = strings.ReplaceAll(query, "$1", "?1")
	}
	if _, err := l.db.Exec(strings.ReplaceAll(query, "{k}", col), arg); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// snapshot copies key's record and attempts as they are now into tables
// of their own (one key per database).
func (l *lostCommits) snapshot(t *testing.T, key string) {
	t.Helper()
	l.exec(t, `CREATE TABLE snapshot AS SELECT * FROM records WHERE {k} = $1`, key)
	l.exec(t, `CREATE TABLE snapshot_attempts AS SELECT * FROM attempts WHERE {k} = $1`, key)
}

// goBack forgets everything written to key's record and attempts since
// its snapshot, or, without one, the whole record.
func (l *lostCommits) goBack(t *testing.T, key string, toSnapshot bool) {
	t.Helper()
	l.exec(t, `DELETE FROM attempts WHERE {k} = $1`, key)
	l.exec(t, `DELETE FROM records WHERE {k} = $1`, key)
	if toSnapshot {
		l.exec(t, `INSERT INTO records SELECT * FROM snapshot WHERE {k} = $1`, key)
		overriding := ""
		if l.backend == "postgres" {
			overriding = "OVERRIDING SYSTEM VALUE "
		}
		l.exec(t, `INSERT INTO attempts `+overriding+`SELECT * FROM snapshot_attempts WHERE {k} = $1`, key)
	}
}

// TestLostCommitsWrittenAgain: the database loses what a claim's outcome
// wrote (its record goes back to the claim, or to before it), and the
// outcome's writer, which still holds it, writes it again. Lost finds
// those outcomes; FinishWrite with Claimed writes each as it was: a
// vanished record is written again whatever the outcome, and a 2xx is
// recorded whatever the record has gone back to.
func TestLostCommitsWrittenAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range faultBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			url := b.url(t)
			clk := newClock(t0)
			s, _ := openFaulty(t, url, clk, store.Options{TakeoverGrace: -1})
			db := openLostCommits(t, b.name, url)

			// Four keys, each with its outcome written.
			kept := begin(t, s, claim("kept", "body", "p/1"), store.Acquired).Record
			outcome := begin(t, s, claim("lost-outcome", "body", "p/2"), store.Acquired).Record
			db.snapshot(t, "lost-outcome")
			record := begin(t, s, claim("lost-record", "body", "p/3"), store.Acquired).Record
			unknown := begin(t, s, claim("lost-unknown", "body", "p/4"), store.Acquired).Record
			clk.Add(time.Second)
			fins := []store.Finish{
				{Key: "kept", Owner: "p/1", State: store.StateSucceeded, AddAttempts: 1, ProviderStatus: 201, Reply: []byte(`{"id":"kept"}`), Claimed: kept.Claimed()},
				{Key: "lost-outcome", Owner: "p/2", State: store.StateSucceeded, AddAttempts: 1, ProviderStatus: 201, Reply: []byte(`{"id":"outcome"}`), Claimed: outcome.Claimed()},
				{Key: "lost-record", Owner: "p/3", State: store.StateSucceeded, AddAttempts: 1, ProviderStatus: 200, Reply: []byte(`{"id":"record"}`), Claimed: record.Claimed()},
				{Key: "lost-unknown", Owner: "p/4", State: store.StateOutcomeUnknown, AddAttempts: 1, LastError: "timeout",
					QuietFor: time.Minute, SettleAfter: time.Second, Claimed: unknown.Claimed()},
			}
			written := make([]store.Written, len(fins))
			for i, f := range fins {
				if l, err := s.FinishWrite(ctx, f); err != nil || l != store.Landed {
					t.Fatalf("FinishWrite(%s) = %v, %v; want Landed", f.Key, l, err)
				}
				written[i] = store.Written{Key: f.Key, Owner: f.Owner}
			}
			if lost, err := s.Lost(ctx, written); err != nil || len(lost) != 0 {
				t.Fatalf("Lost() before any loss = %v, %v; want none", lost, err)
			}

			db.goBack(t, "lost-outcome", true)
			db.goBack(t, "lost-record", false)
			db.goBack(t, "lost-unknown", false)
			if r := get(t, s, "lost-outcome"); r.State != store.StateInProgress || r.LeaseOwner != "p/2" {
				t.Fatalf("lost-outcome after the loss = %v held by %q, want back in progress under p/2", r.State, r.LeaseOwner)
			}
			lost, err := s.Lost(ctx, written)
			if err != nil {
				t.Fatalf("Lost() error = %v", err)
			}
			if diff := cmp.Diff([]int{1, 2, 3}, lost); diff != "" {
				t.Errorf("Lost() (-want +got):\n%s", diff)
			}
			clk.Add(time.Second)
			for _, i := range lost {
				if _, err := s.FinishWrite(ctx, fins[i]); err != nil {
					t.Errorf("FinishWrite(%s) again error = %v", fins[i].Key, err)
				}
			}
			if lost, err := s.Lost(ctx, written); err != nil || len(lost) != 0 {
				t.Errorf("Lost() after writing again = %v, %v; want none", lost, err)
			}
			for _, f := range fins[:3] {
				r := get(t, s, f.Key)
				if r.State != store.StateSucceeded || string(r.Reply) != string(f.Reply) || r.ProviderStatus != f.ProviderStatus || r.LeaseOwner != "" || r.Attempts != 1 {
					t.Errorf("record %s = %v %s (%d), held by %q, %d attempts; want Succeeded with its reply, released, 1 attempt",
						f.Key, r.State, r.Reply, r.ProviderStatus, r.LeaseOwner, r.Attempts)
				}
				if !r.CreatedAt.Equal(us(t0)) || r.RequestID != "req-"+f.Owner || r.Caller != "caller-"+f.Owner || r.Amount != 1234 || r.Currency != "EUR" {
					t.Errorf("record %s = created %v by %q for %q, %d %s; want the claim's", f.Key, r.CreatedAt, r.RequestID, r.Caller, r.Amount, r.Currency)
				}
				want := []store.Attempt{{Number: 1, Kind: store.AttemptCall, Owner: f.Owner, Replica: "p", RequestID: "req-" + f.Owner,
					ProviderStatus: f.ProviderStatus, HTTPRequests: 1, Reply: f.Reply, State: store.StateSucceeded}}
				if diff := cmp.Diff(want, attemptsOf(t, s, f.Key), ignoreAttemptTimes); diff != "" {
					t.Errorf("attempts of %s (-want +got):\n%s", f.Key, diff)
				}
			}
			// An unknown outcome's record comes back unknown, quiet, due for
			// settlement: as it was written.
			r := get(t, s, "lost-unknown")
			if r.State != store.StateOutcomeUnknown || !r.QuietUntil.Equal(us(clk.Now().Add(time.Minute))) || !r.SettleBy.Equal(unknown.SettleBy) {
				t.Errorf("lost-unknown = %v, quiet until %v, settle by %v; want OutcomeUnknown, quiet for a minute, its window", r.State, r.QuietUntil, r.SettleBy)
			}
			begin(t, s, claim("lost-unknown", "body", "q/1"), store.Quiet)
			// A caller's retry replays the payments written again.
			begin(t, s, claim("lost-record", "body", "q/2"), store.Replay)
		})
	}
}

// TestLost2xxOverATakeover: the database went back to before a claim whose
// 2xx was written, and another claim has since taken the record (it went
// back to unknown, and settlement claimed it). The 2xx is written again
// all the same: the record is Succeeded with it, and the taker's attempt
// is abandoned. Anything but a 2xx is refused so.
func TestLost2xxOverATakeover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range faultBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			url := b.url(t)
			clk := newClock(t0)
			s, _ := openFaulty(t, url, clk, store.Options{TakeoverGrace: -1})
			db := openLostCommits(t, b.name, url)
			makeUnknown(t, s, claim("k", "body", "p/1"), 0)
			db.snapshot(t, "k")
			settling := claimDue(t, s, "p/2", 0, 1)
			if len(settling) != 1 {
				t.Fatalf("ClaimDue() = %v, want k", keys(settling))
			}
			ok := store.Finish{Key: "k", Owner: "p/2", State: store.StateSucceeded, AddAttempts: 1, ProviderStatus: 201, Reply: []byte(`{"id":"ok"}`),
				Settlement: true, Claimed: settling[0].Claimed()}
			finish(t, s, ok)
			db.goBack(t, "k", true)
			// The record is unknown again: another replica's settlement
			// claims it.
			if again := claimDue(t, s, "q/1", 0, 1); len(again) != 1 {
				t.Fatalf("ClaimDue(q) = %v, want k", keys(again))
			}
			refusal := store.Finish{Key: "k", Owner: "p/9", State: store.StateNotCreated, ProviderStatus: 400, Claimed: settling[0].Claimed()}
			if _, err := s.FinishWrite(ctx, refusal); !errors.Is(err, store.ErrLeaseLost) {
				t.Errorf("FinishWrite(a refusal without its claim) error = %v, want ErrLeaseLost", err)
			}
			if l, err := s.FinishWrite(ctx, ok); err != nil || l != store.Restored {
				t.Fatalf("FinishWrite(the lost 2xx) = %v, %v; want Restored", l, err)
			}
			r := get(t, s, "k")
			if r.State != store.StateSucceeded || string(r.Reply) != `{"id":"ok"}` || r.LeaseOwner != "" {
				t.Errorf("record = %v %s held by %q, want Succeeded with the 2xx, released", r.State, r.Reply, r.LeaseOwner)
			}
			var got []string
			for _, a := range attemptsOf(t, s, "k") {
				got = append(got, fmt.Sprintf("%d %s %v abandoned=%v", a.Number, a.Owner, a.State, a.Abandoned))
			}
			// Both took attempt number 2: the database forgot the first.
			want := []string{
				"1 p/1 outcome_unknown abandoned=false",
				"2 p/2 succeeded abandoned=false",
				"2 q/1 outcome_unknown abandoned=true",
			}
			if diff := cmp.Diff(want, got, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
				t.Errorf("attempts (-want +got):\n%s", diff)
			}
			// q's own outcome now finds the record Succeeded.
			if _, err := s.Finish(ctx, store.Finish{Key: "k", Owner: "q/1", State: store.StateOutcomeUnknown, AddAttempts: 1}); !errors.Is(err, store.ErrLeaseLost) {
				t.Errorf("Finish(q's unknown) error = %v, want ErrLeaseLost", err)
			}
		})
	}
}

// TestAbandonOwn: a process ends its own claims whose leases expired and
// that it no longer keeps: the record becomes unknown, due for settlement,
// with its quiet period and its attempt's row (abandoned). Claims it keeps,
// leases that have not expired and other processes' claims are left.
func TestAbandonOwn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range faultBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock(t0)
			s, _ := openFaulty(t, b.url(t), clk, store.Options{TakeoverGrace: -1})
			begin(t, s, quiet(claim("orphan", "body", "p/1"), time.Hour), store.Acquired)
			begin(t, s, claim("kept", "body", "p/2"), store.Acquired)
			begin(t, s, claim("other", "body", "pp/1"), store.Acquired)
			keep := func(r store.Record) bool { return r.LeaseOwner == "p/2" }
			if got, err := s.AbandonOwn(ctx, "p", keep, 10); err != nil || len(got) != 0 {
				t.Fatalf("AbandonOwn() within the leases = %v, %v; want nothing", keys(got), err)
			}
			begin(t, s, claim("fresh", "body", "p/3"), store.Acquired)
			clk.Add(lease)
			got, err := s.AbandonOwn(ctx, "p", func(r store.Record) bool { return keep(r) || r.Key == "fresh" }, 10)
			if err != nil {
				t.Fatalf("AbandonOwn() error = %v", err)
			}
			if diff := cmp.Diff(map[string]int{"orphan": 1}, keys(got)); diff != "" {
				t.Errorf("AbandonOwn() (-want +got):\n%s", diff)
			}
			r := get(t, s, "orphan")
			if r.State != store.StateOutcomeUnknown || r.LeaseOwner != "" || !r.NextSettleAt.Equal(us(clk.Now())) || !r.QuietUntil.Equal(us(t0.Add(lease+time.Hour))) {
				t.Errorf("orphan = %v held by %q, next settle %v, quiet until %v; want unknown, released, due now, its quiet period kept",
					r.State, r.LeaseOwner, r.NextSettleAt, r.QuietUntil)
			}
			as := attemptsOf(t, s, "orphan")
			if len(as) != 1 || !as[0].Abandoned || as[0].Owner != "p/1" {
				t.Errorf("orphan's attempts = %+v, want p/1's, abandoned", as)
			}
			for _, k := range []string{"kept", "other", "fresh"} {
				if r := get(t, s, k); r.State != store.StateInProgress {
					t.Errorf("%s = %v, want in progress", k, r.State)
				}
			}
		})
	}
}

// TestAbandonOwnWaitsForHealthyWrites: a process abandons nothing of its
// own until its writes have been healthy for the takeover grace, as a
// takeover waits: after an outage, its outbox lands first.
func TestAbandonOwnWaitsForHealthyWrites(t *testing.T) {
	t.Parallel()
	clk := newClock(t0)
	s, _ := openFaulty(t, storetest.SQLiteURL(t), clk, store.Options{TakeoverGrace: time.Hour})
	begin(t, s, claim("orphan", "body", "p/1"), store.Acquired)
	clk.Add(lease)
	if got, err := s.AbandonOwn(context.Background(), "p", func(store.Record) bool { return false }, 10); err != nil || len(got) != 0 {
		t.Errorf("AbandonOwn() within the grace = %v, %v; want nothing", keys(got), err)
	}
}

// TestLostIgnoresExpiredRecords: a record retention deleted (it left a
// tombstone) was not lost: its outcome is not written again.
func TestLostIgnoresExpiredRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range faultBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock(t0)
			s, _ := openFaulty(t, b.url(t), clk, store.Options{TakeoverGrace: -1})
			rec := begin(t, s, claim("k", "body", "p/1"), store.Acquired).Record
			fin := store.Finish{Key: "k", Owner: "p/1", State: store.StateSucceeded, AddAttempts: 1, ProviderStatus: 200, Reply: []byte(`{}`), Claimed: rec.Claimed()}
			finish(t, s, fin)
			clk.Add(48 * time.Hour)
			deleteAll(t, s, store.Retention{Records: time.Hour}, 10)
			clk.Add(time.Hour)
			deleteAll(t, s, store.Retention{Records: time.Hour}, 10)
			if _, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("Get() after retention error = %v, want ErrNotFound", err)
			}
			if lost, err := s.Lost(ctx, []store.Written{{Key: "k", Owner: "p/1"}}); err != nil || len(lost) != 0 {
				t.Errorf("Lost() = %v, %v; want nothing: retention deleted it", lost, err)
			}
			if _, err := s.FinishWrite(ctx, fin); !errors.Is(err, store.ErrLeaseLost) {
				t.Errorf("FinishWrite() of the deleted record's outcome error = %v, want ErrLeaseLost", err)
			}
		})
	}
}

// TestDetachedBeginInFailedBatch: a Begin whose caller stopped waiting for
// its stuck transaction (ErrCommitUnknown) is in a batch that then fails.
// The batch is rolled back and the detached claim is not run again on its
// own: nothing of it is written, a Finish for its owner is refused, and a
// later claim of the key acquires it; the batch's other operation is run
// again and commits.
func TestDetachedBeginInFailedBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range faultBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			s, f := openFaulty(t, b.url(t), newClock(t0), store.Options{TakeoverGrace: -1})
			begin(t, s, claim("k0", "body", "p/0"), store.Acquired)
			begin(t, s, claim("k1", "body", "p/0"), store.Acquired)
			fin := func(key string) error {
				_, err := s.FinishWrite(ctx, store.Finish{Key: key, Owner: "p/0", State: store.StateSucceeded,
					AddAttempts: 1, ProviderStatus: 200, Reply: []byte(`{}`)})
				return err
			}
			// A finish whose statement hangs holds the writer, so that the
			// claim and a finish queue up behind it and go into one batch.
			releaseFinish := f.HangStatements(finishStatement)
			defer releaseFinish()
			held := make(chan error, 1)
			go func() { held <- fin("k0") }()
			waitFired(t, f, "hang statement")
			releaseClaim := f.HangStatements(claimStatement)
			defer releaseClaim()
			dctx, cancel := context.WithCancel(ctx)
			detached := make(chan error, 1)
			go func() {
				_, err := s.Begin(dctx, claim("d", "body", "p/1"))
				detached <- err
			}()
			for store.QueuedOps(s) < 1 {
				time.Sleep(time.Millisecond) // polling the batcher's queue: it has no signal
			}
			other := make(chan error, 1)
			go func() { other <- fin("k1") }()
			for store.QueuedOps(s) < 2 {
				time.Sleep(time.Millisecond)
			}
			releaseFinish()
			if err := <-held; err != nil {
				t.Fatalf("held FinishWrite(k0) error = %v", err)
			}
			waitFired(t, f, "hang statement") // the claim's, in the second batch
			cancel()
			if err := <-detached; !errors.Is(err, store.ErrCommitUnknown) {
				t.Fatalf("detached Begin() error = %v, want ErrCommitUnknown", err)
			}
			f.FailStatements(attemptStatement, 1)
			releaseClaim()
			if err := <-other; err != nil {
				t.Errorf("FinishWrite(k1) error = %v, want nil: the batch is run again, one by one", err)
			}
			waitFired(t, f, "fail statement")
			if _, err := s.Get(ctx, "d"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Get(d) error = %v, want ErrNotFound: the detached claim ran again on its own", err)
			}
			if _, err := s.FinishWrite(ctx, store.Finish{Key: "d", Owner: "p/1", State: store.StateOutcomeUnknown}); err == nil {
				t.Errorf("FinishWrite(d, p/1) = nil error, want refused: nothing of the claim is written")
			}
			begin(t, s, claim("d", "body", "p/2"), store.Acquired)
			if r := get(t, s, "k1"); r.State != store.StateSucceeded {
				t.Errorf("record k1 = %v, want Succeeded", r.State)
			}
		})
	}
}
