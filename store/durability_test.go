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
					if err := s.FinishWrite(ctx, fin); !errors.Is(err, store.ErrCommitUnknown) {
						t.Fatalf("FinishWrite() with a %s commit error = %v, want ErrCommitUnknown", name, err)
					}
					wantState := map[bool]store.State{false: store.StateInProgress, true: store.StateSucceeded}[lose]
					if r := get(t, s, "k"); r.State != wantState {
						t.Errorf("record after a %s commit = %v, want %v", name, r.State, wantState)
					}
					// The outbox's retry: it lands once, whichever it was.
					if err := s.FinishWrite(ctx, fin); err != nil {
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
					if err := s.FinishWrite(ctx, fin); !errors.Is(err, store.ErrCommitUnknown) {
						t.Fatalf("FinishWrite() with a %s commit error = %v, want ErrCommitUnknown", name, err)
					}
					if err := s.FinishWrite(ctx, fin); err != nil {
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
					errs[i] = s.FinishWrite(ctx, store.Finish{Key: fmt.Sprintf("k%d", i), Owner: "p/1", State: store.StateSucceeded,
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

// waitHealth waits until ok(WriteHealthyFor()).
func waitHealth(t *testing.T, s *store.Store, what string, ok func(time.Duration) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok(s.WriteHealthyFor()) {
		if time.Now().After(deadline) {
			t.Fatalf("WriteHealthyFor() = %v: never %s", s.WriteHealthyFor(), what)
		}
		time.Sleep(10 * time.Millisecond) // health is polled, as a metric is
	}
}

// TestTakeoverWaitsForHealthyWrites: a record whose holder's lease expired
// is taken over (by Begin, ClaimDue or GiveUp) only once the store's
// writes have been healthy for the takeover grace, counted afresh after
// every outage: the holder, which may have an outcome on its way, gets to
// write it first.
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
				c.Window = lease / 2 // so that c's window closes too
				if k != "c" {
					c.Window = window
				}
				begin(t, s, c, store.Acquired)
			}
			clk.Add(lease)

			waitHealth(t, s, "past the grace", func(d time.Duration) bool { return d >= grace })
			begin(t, s, claim("a", "body", "taker/1"), store.Acquired)

			// An outage: every write fails, and health starts again after.
			f.Down()
			waitHealth(t, s, "0 while the database is down", func(d time.Duration) bool { return d == 0 })
			if _, err := s.Begin(ctx, claim("b", "body", "taker/2")); err == nil {
				t.Errorf("Begin() with the database down error = nil")
			}
			f.Up()
			up := time.Now()
			got, err := s.Begin(ctx, claim("b", "body", "taker/2"))
			settler, errDue := s.ClaimDue(ctx, "settler/1", lease, 0, 10)
			gave, errGave := s.GiveUp(ctx, "settler", 10)
			if time.Since(up) >= grace {
				t.Skipf("the machine took %v, more than the grace, to make three writes after the outage", time.Since(up))
			}
			if err != nil || got.Outcome != store.Busy {
				t.Errorf("Begin(expired lease) just after an outage = %v, %v; want Busy", got.Outcome, err)
			}
			if errDue != nil || len(settler) != 0 {
				t.Errorf("ClaimDue() just after an outage = %v, %v; want nothing", keys(settler), errDue)
			}
			if errGave != nil || len(gave) != 0 {
				t.Errorf("GiveUp() just after an outage = %v, %v; want nothing", keys(gave), errGave)
			}
			if hf := s.WriteHealthyFor(); hf > time.Since(up) {
				t.Errorf("WriteHealthyFor() = %v, %v after the outage ended: health was not counted afresh", hf, time.Since(up))
			}

			waitHealth(t, s, "past the grace again", func(d time.Duration) bool { return d >= grace })
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
	waitHealth(t, s, "past the grace", func(d time.Duration) bool { return d >= grace })

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
	waitHealth(t, s, "0 while another process holds the lock", func(d time.Duration) bool { return d == 0 })
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
	released := time.Now()
	got := <-took
	if time.Since(released) < grace && got != store.Busy {
		t.Errorf("Begin(expired lease) as the lock was released = %v, want Busy", got)
	}
	waitHealth(t, s, "past the grace after the lock", func(d time.Duration) bool { return d >= grace })
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
			if err := s.FinishWrite(ctx, late); err != nil {
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
			if err := s.FinishWrite(ctx, store.Finish{Key: "k", Owner: "q/1", State: store.StateSucceeded, AddAttempts: 1, ProviderStatus: 200, Reply: []byte(`{"id":"second"}`)}); err != nil {
				t.Errorf("FinishWrite(taker's 2xx) error = %v", err)
			}
			// A repeat of the first (its commit's outcome was unknown)
			// writes nothing more.
			if err := s.FinishWrite(ctx, late); err != nil {
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
	if err := s.FinishWrite(ctx, store.Finish{Key: "k", Owner: "p/1", State: store.StateSucceeded, AddAttempts: 1, ProviderStatus: 201, Reply: []byte(`{}`)}); err != nil {
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
