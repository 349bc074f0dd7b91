package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
)

// A claim whose caller stops waiting for it gets a continuation: Begin
// answers at once, and the claim's outcome, if it may yet commit, goes to
// Begin's late. These tests hold the writer with FloorExec statements that
// hang (the batcher runs them as it runs Begin), so that a claim waits in
// the queue, or has run in a batch that has not committed.

// writerHold holds the batcher at FloorExec statements.
type writerHold struct {
	s *store.Store
	f *storetest.Faults
}

// newWriterHold makes the tables hold's statements run on, and prepares
// the statements (preparing waits for SQLite's one writer connection,
// which a held batch keeps).
func newWriterHold(t *testing.T, s *store.Store, f *storetest.Faults) writerHold {
	t.Helper()
	for _, q := range []string{`CREATE TABLE hold_one (n integer)`, `CREATE TABLE hold_two (n integer)`,
		`UPDATE hold_one SET n = 1`, `UPDATE hold_two SET n = 1`} {
		if err := s.FloorExec(context.Background(), q); err != nil {
			t.Fatal(err)
		}
	}
	return writerHold{s: s, f: f}
}

// hold runs the statement on table (hold_one or hold_two) in the next
// batch, where it hangs until the returned release; done gets its result.
func (h writerHold) hold(t *testing.T, table string) (release func(), done <-chan error) {
	t.Helper()
	release = h.f.HangStatements(`UPDATE ` + table)
	errc := make(chan error, 1)
	go func() { errc <- h.s.FloorExec(context.Background(), `UPDATE `+table+` SET n = 1`) }()
	return release, errc
}

// pendingError is err's ClaimPendingError, or fails the test.
func pendingError(t *testing.T, err error) *store.ClaimPendingError {
	t.Helper()
	var p *store.ClaimPendingError
	if !errors.As(err, &p) {
		t.Fatalf("Begin() error = %v, want a ClaimPendingError", err)
	}
	return p
}

// lateResult is what Begin's late got.
type lateResult struct {
	b   *store.Began
	err error
}

// TestBeginContinuation: a claim whose caller's ctx ends while it is
// queued never runs; one that ran in a batch that has not committed is
// left to it, and its outcome (committed, or its commit's answer lost) goes
// to late, once.
func TestBeginContinuation(t *testing.T) {
	t.Parallel()
	for _, b := range faultBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			t.Run("queued", func(t *testing.T) {
				t.Parallel()
				s, f := openFaulty(t, b.url(t), newClock(t0), store.Options{TakeoverGrace: -1})
				h := newWriterHold(t, s, f)
				release, held := h.hold(t, "hold_one")
				defer release()
				waitFired(t, f, "hang statement")
				ctx, cancel := context.WithCancel(context.Background())
				errc := make(chan error, 1)
				go func() {
					_, err := s.Begin(ctx, claim("k", "body", "p/1"), func(*store.Began, error) {
						t.Errorf("late called for a claim that never ran")
					})
					errc <- err
				}()
				waitQueued(t, s, 1)
				cancel()
				err := <-errc
				if p := pendingError(t, err); p.Ran || !errors.Is(err, context.Canceled) {
					t.Errorf("Begin() cancelled while queued = %+v (%v), want Ran false, context.Canceled", p, err)
				}
				release()
				if err := <-held; err != nil {
					t.Fatal(err)
				}
				if _, err := s.Get(context.Background(), "k"); !errors.Is(err, store.ErrNotFound) {
					t.Errorf("Get(k) error = %v, want ErrNotFound: the claim never runs", err)
				}
			})
			for _, tc := range []struct {
				name     string
				unknown  bool // the key's record is OutcomeUnknown before the claim
				lose     bool // the claim's batch's commit answer is lost
				sawMaybe bool
			}{
				{name: "new key", sawMaybe: false},
				{name: "unknown record", unknown: true, sawMaybe: true},
				{name: "commit lost", lose: true},
			} {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					s, f := openFaulty(t, b.url(t), newClock(t0), store.Options{TakeoverGrace: -1})
					h := newWriterHold(t, s, f)
					if tc.unknown {
						makeUnknown(t, s, claim("k", "body", "a"), 0)
					}
					release1, held1 := h.hold(t, "hold_one")
					defer release1()
					waitFired(t, f, "hang statement")
					ctx, cancel := context.WithCancel(context.Background())
					late := make(chan lateResult, 2)
					errc := make(chan error, 1)
					go func() {
						_, err := s.Begin(ctx, claim("k", "body", "p/1"), func(b *store.Began, err error) { late <- lateResult{b, err} })
						errc <- err
					}()
					waitQueued(t, s, 1)
					// The claim's batch holds a second statement, after it.
					release2, held2 := h.hold(t, "hold_two")
					defer release2()
					waitQueued(t, s, 2)
					if tc.lose {
						f.LoseCommits(`UPDATE hold_two`, 1)
					}
					release1()
					if err := <-held1; err != nil {
						t.Fatal(err)
					}
					waitFired(t, f, "hang statement") // the claim has run
					cancel()
					err := <-errc
					if p := pendingError(t, err); !p.Ran || p.SawMaybe != tc.sawMaybe || !errors.Is(err, context.Canceled) {
						t.Errorf("Begin() cancelled after it ran = %+v (%v), want Ran, SawMaybe %v, context.Canceled", p, err, tc.sawMaybe)
					}
					release2()
					<-held2
					got := <-late
					switch {
					case tc.lose && !errors.Is(got.err, store.ErrCommitUnknown):
						t.Errorf("late() = %+v, %v; want ErrCommitUnknown", got.b, got.err)
					case !tc.lose && (got.err != nil || got.b.Verdict != record.Acquired || got.b.Record.LeaseOwner != "p/1"):
						t.Errorf("late() = %+v, %v; want Acquired by p/1", got.b, got.err)
					}
					select {
					case again := <-late:
						t.Errorf("late() called again with %+v", again)
					default:
					}
					// Committed (a lost commit's answer is lost, not the
					// commit): the claimant releases it.
					if r := get(t, s, "k"); r.State != record.InProgress || r.LeaseOwner != "p/1" {
						t.Errorf("record = %v held by %q, want InProgress held by p/1", r.State, r.LeaseOwner)
					}
					if n, err := s.Release(context.Background(), "p/1", 0); err != nil || n != 1 {
						t.Errorf("Release(p/1) = %d, %v; want 1", n, err)
					}
				})
			}
		})
	}
}

// TestDetachedBeginInFailedBatch: a Begin whose caller stopped waiting for
// its stuck transaction is in a batch that then fails. The batch is rolled
// back and the detached claim is not run again on its own: late hears it
// was not written, nothing of it is, a Finish for its owner is refused, and
// a later claim of the key acquires it; the batch's other operations are
// run again and commit.
func TestDetachedBeginInFailedBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range faultBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			s, f := openFaulty(t, b.url(t), newClock(t0), store.Options{TakeoverGrace: -1})
			h := newWriterHold(t, s, f)
			if err := s.FloorExec(ctx, `UPDATE hold_one SET n = 2`); err != nil { // prepared
				t.Fatal(err)
			}
			release1, held1 := h.hold(t, "hold_one")
			defer release1()
			waitFired(t, f, "hang statement")
			dctx, cancel := context.WithCancel(ctx)
			late := make(chan lateResult, 2)
			detached := make(chan error, 1)
			go func() {
				_, err := s.Begin(dctx, claim("d", "body", "p/1"), func(b *store.Began, err error) { late <- lateResult{b, err} })
				detached <- err
			}()
			waitQueued(t, s, 1)
			release2, held2 := h.hold(t, "hold_two")
			defer release2()
			waitQueued(t, s, 2)
			failing := make(chan error, 1)
			go func() { failing <- s.FloorExec(ctx, `UPDATE hold_one SET n = 2`) }()
			waitQueued(t, s, 3)
			release1()
			if err := <-held1; err != nil {
				t.Fatal(err)
			}
			waitFired(t, f, "hang statement") // the claim has run
			cancel()
			if p := pendingError(t, <-detached); !p.Ran {
				t.Fatalf("detached Begin() = %+v, want Ran", p)
			}
			f.FailStatements(`UPDATE hold_one SET n = 2`, 1)
			release2()
			if err := <-held2; err != nil {
				t.Errorf("FloorExec(hold_two) error = %v, want nil: the batch is run again, one by one", err)
			}
			if err := <-failing; err != nil {
				t.Errorf("FloorExec(hold_one) error = %v, want nil: it failed once, and ran again alone", err)
			}
			waitFired(t, f, "fail statement")
			got := <-late
			if got.err == nil || errors.Is(got.err, store.ErrCommitUnknown) || got.b != nil {
				t.Errorf("late() = %+v, %v; want no result, and an error saying nothing was written", got.b, got.err)
			}
			if _, err := s.Get(ctx, "d"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Get(d) error = %v, want ErrNotFound: the detached claim ran again on its own", err)
			}
			would := begin(t, s, claim("d", "body", "p/2"), record.Acquired).Record
			would.LeaseOwner = "p/1"
			finishAs(t, s, would, record.Outcome{Owner: "p/1", Result: record.Unknown}, record.LeaseLost)
			if r := get(t, s, "d"); r.LeaseOwner != "p/2" {
				t.Errorf("record d held by %q, want p/2", r.LeaseOwner)
			}
		})
	}
}

// TestBeginQueuedPastDeadline: a claim whose deadline passes while it is
// queued behind a stuck writer answers by its deadline, and never runs.
func TestBeginQueuedPastDeadline(t *testing.T) {
	t.Parallel()
	s, f := openFaulty(t, storetest.SQLiteURL(t), newClock(t0), store.Options{TakeoverGrace: -1})
	h := newWriterHold(t, s, f)
	release, held := h.hold(t, "hold_one")
	waitFired(t, f, "hang statement")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := s.Begin(ctx, claim("k", "body", "p/1"), nil)
	if p := pendingError(t, err); p.Ran || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Begin() past its deadline while queued = %+v (%v), want Ran false, DeadlineExceeded", p, err)
	}
	release()
	<-held
	if _, err := s.Get(context.Background(), "k"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get(k) error = %v, want ErrNotFound", err)
	}
}

// lockedStatement is the read that locks a key's record (lockedRecord),
// as the seam matches it: not Get's, which skips tombstoned records.
const lockedStatement = `FROM records WHERE key(_hash)? = (\$1|\?1) *(FOR UPDATE)? *$`

// TestBeginReadPastDeadline: a claim's transaction begins while its caller
// waits, but its read of the key's record comes back only after the
// caller's deadline (the connection stalled: a partition, a frozen
// backend, a lock held by a stuck transaction), by which time another
// call may have told the caller that no payment exists. Step decides at
// the store's clock as the record was read, not as the transaction began:
// the claim is Left, writes nothing, and nothing may be sent.
func TestBeginReadPastDeadline(t *testing.T) {
	t.Parallel()
	for _, b := range faultBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock(t0)
			s, f := openFaulty(t, b.url(t), clk, store.Options{TakeoverGrace: -1})
			begin(t, s, claim("k", "body", "p/1"), record.Acquired)
			if r := finish(t, s, "k", record.Outcome{Result: record.NothingSent}); r.State != record.NotCreated {
				t.Fatalf("record after nothing was sent = %v, want NotCreated", r.State)
			}

			release := f.HangStatements(lockedStatement)
			defer release()
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			late := make(chan lateResult, 1)
			began := make(chan error, 1)
			go func() {
				_, err := s.Begin(ctx, claim("k", "body", "p/2"), func(b *store.Began, err error) { late <- lateResult{b, err} })
				began <- err
			}()
			waitFired(t, f, "hang statement")
			if p := pendingError(t, <-began); !p.Ran {
				t.Fatalf("Begin() past its deadline = %+v, want Ran: its transaction had begun", p)
			}
			clk.Add(time.Second) // the store's clock as the read comes back
			release()
			got := <-late
			if got.err != nil || got.b.Verdict != record.Left {
				t.Errorf("late() = %+v, %v; want Left: the record was read after the caller's deadline", got.b, got.err)
			}
			if r := get(t, s, "k"); r.State != record.NotCreated || r.LeaseOwner != "" {
				t.Errorf("record = %v held by %q, want NotCreated, held by no one", r.State, r.LeaseOwner)
			}
		})
	}
}
