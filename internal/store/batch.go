package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Group commit. In SQLite every write goes through one connection and every
// commit is an fsync of the WAL, so payments that arrive together would
// otherwise queue for a commit each; in PostgreSQL each would take a
// connection and several round trips for a transaction of its own. The batcher runs the Begins and
// Finishes waiting for the writer in one transaction, each as it would run
// alone and in arrival order (so a later one sees an earlier one's write,
// exactly as if they had run one after the other), and commits them with
// one fsync. Nobody is told an outcome before the commit that makes it
// durable: a Begin's caller learns Acquired only once its record is on
// disk. There is no added wait: a batch is whatever arrived while the
// previous commit was in flight.
//
// Every batch runs on the batcher's goroutine, also when an operation finds
// the writer idle. Running it there on the caller's goroutine instead saves
// two goroutine switches, but measured 10% more CPU and 100 µs more latency
// per payment at c=1 with SQLite on disk (the commit's fsync blocks the
// caller's thread, and SQLite's deep frames grow a fresh goroutine's
// stack); see docs/performance.md.
//
// In PostgreSQL a batch holds the row locks of its records until it
// commits, which is soon, since no batch waits on the provider. Two
// replicas whose batches lock the same keys in opposite orders deadlock;
// PostgreSQL aborts one, and its operations run again one by one.

// maxBatch bounds the operations in one transaction.
const maxBatch = 256

// batchOp is one operation for the batcher.
type batchOp struct {
	// ctx, if it has ended before the operation runs, cancels it: it gets
	// ctx's error and writes nothing. Once it has run, it is committed or
	// fails with the batch, whatever ctx does.
	ctx context.Context
	// fn runs the operation in the batch's transaction, given the store's
	// clock as the transaction began. It must write nothing when it
	// returns an error that clean accepts.
	fn func(context.Context, *sql.Tx, time.Time) error
	// done, if set, gets the operation's result, after the batch has
	// committed or failed; otherwise errc does.
	done func(error)
	errc chan error
	// late, if set, makes the operation detachable: once taken, its
	// caller may stop waiting for it (wait), and late then gets its
	// result instead, on the batcher's goroutine.
	late func(error)
	// state says where the operation is (opQueued…).
	state atomic.Int32
}

const (
	// opQueued: waiting for the batcher.
	opQueued int32 = iota
	// opTaken: the batcher took it into a batch (or runs it again alone
	// after its batch failed).
	opTaken
	// opAbandoned: its caller gave up waiting before the batcher took it:
	// it never runs.
	opAbandoned
	// opDetached: taken, and then its caller stopped waiting; late gets
	// its result.
	opDetached
	// opRetaken: taken again, to run alone after its batch failed, while
	// its caller still waited.
	opRetaken
	// opDone: its result was handed to its caller.
	opDone
)

// finish hands op its result: to late if its caller detached, else to
// its caller.
func (op *batchOp) finish(err error) {
	for {
		switch st := op.state.Load(); st {
		case opDetached:
			op.late(err)
			return
		case opAbandoned:
			op.deliver(err)
			return
		default:
			if op.state.CompareAndSwap(st, opDone) {
				op.deliver(err)
				return
			}
		}
	}
}

func (op *batchOp) deliver(err error) {
	if op.done != nil {
		op.done(err)
		return
	}
	op.errc <- err
}

// take reports whether the batcher may run op: its caller has not given
// up on it. Once taken, the caller waits for its result, or detaches.
func (op *batchOp) take() bool {
	if op.ctx != nil && op.ctx.Err() != nil {
		op.state.CompareAndSwap(opQueued, opAbandoned)
	}
	return op.state.CompareAndSwap(opQueued, opTaken)
}

// abandoned is the error of an operation its caller gave up on.
func (op *batchOp) abandoned() error {
	if op.ctx != nil && op.ctx.Err() != nil {
		return op.ctx.Err()
	}
	return context.Canceled
}

// clean reports whether an operation's error leaves the transaction as it
// was, so the rest of the batch may go on.
func clean(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// batcher queues operations for the writer and runs them in batches, on
// one goroutine, until closed.
type batcher struct {
	s *Store

	mu     sync.Mutex
	queue  []*batchOp
	closed bool
	wake   chan struct{} // has a token when the queue may be non-empty
	exited chan struct{}
}

func newBatcher(s *Store) *batcher {
	b := &batcher{s: s, wake: make(chan struct{}, 1), exited: make(chan struct{})}
	go b.loop()
	return b
}

// submit queues op; op.done will be called exactly once.
func (b *batcher) submit(op *batchOp) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		op.finish(ErrClosed)
		return
	}
	b.queue = append(b.queue, op)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// run submits fn and waits for its result. If ctx ends while fn is still
// queued (a busy writer: another process holding SQLite's lock, a slow
// commit), it gives up at once and fn never runs; once fn has been taken
// into a batch, it waits even if ctx ends: an operation that has run must
// learn whether it committed.
func (b *batcher) run(ctx context.Context, fn func(context.Context, *sql.Tx, time.Time) error) error {
	err, _ := b.wait(ctx, &batchOp{ctx: ctx, fn: fn, errc: make(chan error, 1)})
	return err
}

// wait submits op and waits for its result, or until ctx ends: then an
// op still queued never runs (state opAbandoned), and a detachable op
// that was taken is left to finish without its caller (opDetached),
// unless its result is already in. It returns the op's result, if its
// caller got it, and the op's state when wait returned.
func (b *batcher) wait(ctx context.Context, op *batchOp) (error, int32) {
	b.submit(op)
	return b.await(ctx, op)
}

// await is wait for an op submitted.
func (b *batcher) await(ctx context.Context, op *batchOp) (error, int32) {
	select {
	case err := <-op.errc:
		return err, opDone
	case <-ctx.Done():
	}
	if op.state.CompareAndSwap(opQueued, opAbandoned) {
		return ctx.Err(), opAbandoned
	}
	if op.late != nil && (op.state.CompareAndSwap(opTaken, opDetached) || op.state.CompareAndSwap(opRetaken, opDetached)) {
		return ctx.Err(), opDetached
	}
	// Its result is in or on its way (opDone), or the batcher found ctx
	// ended before it took it (opAbandoned).
	err := <-op.errc
	return err, op.state.Load()
}

// close runs what is queued, then stops the batcher.
func (b *batcher) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
	<-b.exited
}

func (b *batcher) loop() {
	defer close(b.exited)
	for range b.wake {
		for {
			b.mu.Lock()
			n := min(len(b.queue), maxBatch)
			ops := b.queue[:n:n]
			b.queue = b.queue[n:]
			if len(b.queue) == 0 {
				b.queue = nil
			}
			closed := b.closed && n == 0
			b.mu.Unlock()
			if closed {
				return
			}
			if n == 0 {
				break
			}
			b.s.runBatch(ops)
		}
	}
}

// runBatch runs ops in one transaction and commits it. If an operation
// fails in a way that may have left the transaction half-written, the
// batch is rolled back and each operation runs again in a transaction of
// its own, so that one bad operation fails only itself; but one whose
// caller has stopped waiting for it (detached) is not run again: it fails.
//
// A batch runs with a context that never ends, whatever its operations'
// callers do: its COMMIT, once sent, waits for its answer however long a
// synchronous standby takes (commit.go), and the next batch waits behind
// it. Its operations' callers stop waiting at their deadlines (run, wait).
func (s *Store) runBatch(ops []*batchOp) {
	errs := make([]error, len(ops))
	var failed error
	var wrote atomic.Bool
	ctx := context.WithValue(context.Background(), wroteKey{}, &wrote)
	err := s.transact(ctx, func(tx *sql.Tx, now time.Time) error {
		for i, op := range ops {
			if !op.take() {
				errs[i] = op.abandoned()
				continue
			}
			if err := op.fn(ctx, tx, now); err != nil {
				if !clean(err) {
					failed = err
					return errBatchFailed
				}
				errs[i] = err
			}
		}
		if !wrote.Load() {
			return errNoWrite
		}
		return nil
	})
	if errors.Is(err, errBatchFailed) {
		for _, op := range ops {
			// Taken, and its caller still waits: run it again (its caller
			// may still detach while it runs: late then gets what it did).
			if op.state.CompareAndSwap(opTaken, opRetaken) || op.take() {
				var wrote atomic.Bool
				ctx := context.WithValue(context.Background(), wroteKey{}, &wrote)
				op.finish(s.transact(ctx, func(tx *sql.Tx, now time.Time) error {
					if err := op.fn(ctx, tx, now); err != nil {
						return err
					}
					if !wrote.Load() {
						return errNoWrite
					}
					return nil
				}))
				continue
			}
			if op.state.Load() == opDetached {
				op.finish(fmt.Errorf("%w: %w", errRolledBack, failed))
				continue
			}
			op.finish(op.abandoned())
		}
		return
	}
	for i, op := range ops {
		if err != nil && errs[i] == nil {
			// The transaction could not begin or commit: nothing is
			// written, or (ErrCommitUnknown) maybe everything.
			errs[i] = err
		}
		op.finish(errs[i])
	}
}

var (
	errBatchFailed = errors.New("an operation of the batch failed")
	// errRolledBack: a detached operation's batch failed, and was rolled
	// back; the operation was not run again, and wrote nothing.
	errRolledBack = errors.New("the batch was rolled back; nothing of the operation was written")
)

// wroteKey is the context key under which a batch's transaction keeps
// whether any of its operations' statements wrote a row (noteWrote).
type wroteKey struct{}

// noteWrote notes, in the batch whose operation ctx is, that a statement
// wrote a row. A batch that wrote none (claims answered from their
// records: replays, keys in progress, quiet periods; outcomes whose
// claims had lost their records) is rolled back as errNoWrite: on
// PostgreSQL it would commit at once, without waiting for a synchronous
// standby, and counted in the write health it would let this replica take
// a lease over while every write, the holder's outcome among them, waits.
func noteWrote(ctx context.Context) {
	if w, ok := ctx.Value(wroteKey{}).(*atomic.Bool); ok {
		w.Store(true)
	}
}
