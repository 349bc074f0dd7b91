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
	// state is opQueued until the batcher takes the operation (opTaken)
	// or its caller gives up waiting for it first (opAbandoned).
	state atomic.Int32
}

// finish hands op its result.
func (op *batchOp) finish(err error) {
	switch {
	case op.done != nil:
		op.done(err)
	default:
		op.errc <- err
	}
}

const (
	opQueued int32 = iota
	opTaken
	opAbandoned
	// opDetached: taken, and then its caller stopped waiting
	// (runDetachable).
	opDetached
)

// take reports whether the batcher may run op: its caller has not given
// up on it. Once taken, the caller waits for its result.
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
	return errors.Is(err, ErrLeaseLost) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
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
	return b.wait(ctx, fn, false)
}

// runDetachable is run for an operation whose caller must answer by its
// deadline even if the batch that took fn is stuck (a database that stopped
// answering mid-transaction, a pooler queueing it): once ctx ends it
// returns ErrCommitUnknown at once, and the batch may yet commit fn, or
// not. If the batch fails, fn is not tried again on its own.
func (b *batcher) runDetachable(ctx context.Context, fn func(context.Context, *sql.Tx, time.Time) error) error {
	return b.wait(ctx, fn, true)
}

func (b *batcher) wait(ctx context.Context, fn func(context.Context, *sql.Tx, time.Time) error, detachable bool) error {
	op := &batchOp{ctx: ctx, fn: fn, errc: make(chan error, 1)}
	b.submit(op)
	select {
	case err := <-op.errc:
		return err
	case <-ctx.Done():
		if op.state.CompareAndSwap(opQueued, opAbandoned) {
			return ctx.Err()
		}
		if detachable {
			// A result already here is the caller's, deadline or not.
			select {
			case err := <-op.errc:
				return err
			default:
			}
		}
		if detachable && op.state.CompareAndSwap(opTaken, opDetached) {
			return fmt.Errorf("%w: its caller stopped waiting for the transaction that holds it: %w", ErrCommitUnknown, ctx.Err())
		}
		return <-op.errc
	}
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
// its own, so that one bad operation fails only itself.
func (s *Store) runBatch(ops []*batchOp) {
	ctx := context.Background()
	errs := make([]error, len(ops))
	err := s.transact(ctx, func(tx *sql.Tx) error {
		now, err := s.txNow(ctx, tx)
		if err != nil {
			return err
		}
		for i, op := range ops {
			if !op.take() {
				errs[i] = op.abandoned()
				continue
			}
			if err := op.fn(ctx, tx, now); err != nil {
				if !clean(err) {
					return errBatchFailed
				}
				errs[i] = err
			}
		}
		return nil
	})
	if errors.Is(err, errBatchFailed) {
		for _, op := range ops {
			if op.state.Load() != opTaken && !op.take() {
				op.finish(op.abandoned())
				continue
			}
			op.finish(s.transact(ctx, func(tx *sql.Tx) error {
				now, err := s.txNow(ctx, tx)
				if err != nil {
					return err
				}
				return op.fn(ctx, tx, now)
			}))
		}
		return
	}
	for i, op := range ops {
		if err != nil && errs[i] == nil {
			// The transaction could not begin or commit: nothing is
			// written.
			errs[i] = err
		}
		op.finish(errs[i])
	}
}

var errBatchFailed = errors.New("an operation of the batch failed")
