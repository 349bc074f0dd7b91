package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A COMMIT, once sent, is never cancelled.
//
// PostgreSQL with synchronous replication writes a commit locally, then
// waits until a synchronous standby confirms it; until then no other
// session sees it. If that wait is cancelled (by a cancel request: when
// the context of a statement ends, and a COMMIT is one, pgx drops the
// connection and sends one), PostgreSQL stops waiting, answers the COMMIT
// with a WARNING and success, and the commit becomes visible to every
// session although no standby has it: a failover then loses a commit that
// callers, and other replicas, have acted on (docs/durability.md's
// guarantee assumes none is ever lost). statement_timeout does not apply
// to the wait, and a connection closed by the client leaves it waiting,
// invisible.
//
// So a transaction begins with a context of its own (transactionContext):
// it ends with its caller's context until the COMMIT is about to be sent,
// and never after. database/sql rolls a transaction back, and pgx commits
// it, with that context. The transaction's statements run with the
// caller's context, so a caller who leaves before the COMMIT still stops
// them, and the transaction rolls back.
//
// A COMMIT that is sent waits for its answer however long it takes. The
// caller waits for it until its context ends; it is then told
// ErrCommitUnknown (with its context's error), and a goroutine of the
// store waits on for the answer and notes it in the write health. A COMMIT
// whose standby never returns keeps that goroutine and its connection for
// as long; meanwhile the store counts no commit from it, so the write
// health sees a gap, then none (WriteHealthyFor stays 0 and no lease is
// taken over), which is right: the database takes no durable write.
//
// While a COMMIT whose caller left is unanswered, a new transaction of a
// caller who can leave waits for that answer (with its context) before it
// begins: each would add another commit that waits, and another
// connection held, until the pool, which reads share in PostgreSQL, had
// none left. What that means for each caller:
//   - the batcher (Begin, Finish, FloorExec) runs with a context that never
//     ends: its COMMIT was never cancelled, and it waits; every Begin and
//     Finish queues behind it. A caller whose deadline comes while its
//     claim is queued is answered at once, its claim never runs; a claim
//     already taken is left to late (batch.go).
//   - CheckWrite (readiness, 1 s per check) is told ErrCommitUnknown, and
//     the checks after it fail at the gate: three make the replica
//     NOT_SERVING, as they should while no write is durable.
//   - the heartbeat gives up after heartbeatTimeout, and the next ones wait
//     at the gate: no commit piles up.
//   - Resolve: the person is told the resolution may or may not have been
//     recorded (ErrCommitUnknown), at their call's deadline.
//   - SettleDue: the engine's context lasts until shutdown, so settlement
//     waits for the answer; at shutdown it gets ErrCommitUnknown and has
//     its outbox release the record it may hold.
//   - AppendEvent: the delivery is refused when the inbox's store timeout
//     comes (the sender sends it again; if the first lands too, the second
//     is its duplicate, DuplicateOf).
//   - DeleteExpired: that step fails and is tried again next pass.
//   - migrations: Open fails with ErrMigrateTimeout and ErrCommitUnknown;
//     the migrations land once a standby confirms them, and until then the
//     next Open waits for their advisory lock.
//
// A COMMIT's wait can still be cancelled by someone else: a person's
// pg_cancel_backend, or pg_terminate_backend and a fast shutdown (the
// session then ends without an answer: ErrCommitUnknown). PostgreSQL
// answers a cancelled wait with a WARNING before the COMMIT's success; the
// store watches each COMMIT for a WARNING (commitTracer, onNotice) and
// reports ErrCommitUnknown, never success, when one comes.

// transactionContext is the context a transaction begins with, for a
// caller with ctx: it ends when ctx does, until hold is called.
type transactionContext struct {
	ctx    context.Context
	cancel context.CancelFunc // nil: ctx never ends
	stop   func() bool
}

func newTransactionContext(ctx context.Context) transactionContext {
	if ctx.Done() == nil {
		// The batcher's: it never ends, and nothing is allocated.
		return transactionContext{ctx: ctx}
	}
	tctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	return transactionContext{ctx: tctx, cancel: cancel, stop: context.AfterFunc(ctx, cancel)}
}

// hold makes the context never end from now on, and reports whether it
// had not ended: if false, the caller left, and the transaction is being
// rolled back.
func (c transactionContext) hold() bool { return c.cancel == nil || c.stop() }

// end releases the context, once the transaction has ended.
func (c transactionContext) end() {
	if c.cancel != nil {
		c.stop()
		c.cancel()
	}
}

// commit commits tx, which began with tc for a caller with ctx, and notes
// nothing in the write health (transact does, or, for a commit its caller
// stopped waiting for, the goroutine that gets its answer).
func (s *Store) commit(ctx context.Context, tx *sql.Tx, tc transactionContext, watch *pgTx) error {
	if !tc.hold() {
		tx.Rollback()
		tc.end()
		return fmt.Errorf("commit not sent: %w", ctx.Err())
	}
	if ctx.Done() == nil {
		defer tc.end()
		return s.sendCommit(tx, watch)
	}
	answer := make(chan error, 1)
	go func() {
		defer tc.end()
		answer <- s.sendCommit(tx, watch)
	}()
	select {
	case err := <-answer:
		return err
	case <-ctx.Done():
	}
	select {
	case err := <-answer:
		return err
	default:
	}
	s.unanswered.add()
	go func() {
		defer s.unanswered.done()
		s.noteWrite(<-answer)
	}()
	return fmt.Errorf("commit: %w: its caller stopped waiting for the database's answer: %w", ErrCommitUnknown, ctx.Err())
}

// sendCommit sends tx's COMMIT and waits for its answer.
func (s *Store) sendCommit(tx *sql.Tx, watch *pgTx) error {
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w: %w", ErrCommitUnknown, err)
	}
	if watch != nil && watch.warning != "" {
		return fmt.Errorf("commit: %w: %w (%s)", ErrCommitUnknown, errCommitWarned, watch.warning)
	}
	s.commits.Add(1)
	return nil
}

// errCommitWarned: PostgreSQL answered a COMMIT with success after a
// WARNING. The one a COMMIT gets is for its wait for a synchronous standby
// cancelled: it is committed locally, visible, and not on a standby, so a
// failover may lose it.
var errCommitWarned = errors.New("the database warned while committing (a cancelled wait for the synchronous standby: committed locally, and maybe on no standby)")

// unansweredCommits counts the COMMITs whose callers stopped waiting before
// their answer came.
type unansweredCommits struct {
	mu sync.Mutex
	n  int
	// answered is closed when n drops to 0; nil while it is 0.
	answered chan struct{}
}

func (u *unansweredCommits) add() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n == 0 {
		u.answered = make(chan struct{})
	}
	u.n++
}

func (u *unansweredCommits) done() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.n--
	if u.n == 0 {
		close(u.answered)
		u.answered = nil
	}
}

// wait returns nil once every COMMIT whose caller left has its answer, or
// at once for a caller whose ctx never ends (which can't leave its own);
// or ctx's error if it ends first.
func (u *unansweredCommits) wait(ctx context.Context) error {
	if ctx.Done() == nil {
		return nil
	}
	u.mu.Lock()
	answered := u.answered
	u.mu.Unlock()
	if answered == nil {
		return nil
	}
	select {
	case <-answered:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("a commit whose caller left still waits for the database's answer: %w", ctx.Err())
	}
}

// commitWatchData is the connection's pgconn.CustomData key of the pgTx
// whose COMMIT it is running.
const commitWatchData = "paymentsd.commitWatch"

// commitTracer lends a COMMIT's pgTx to its connection while it runs, for
// onNotice. The store's transactions commit with the context they began
// with, which carries it (pgtx.go).
type commitTracer struct{}

func (commitTracer) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL == "commit" {
		if w, ok := ctx.Value(pgTxKey{}).(*pgTx); ok {
			c.PgConn().CustomData()[commitWatchData] = w
		}
	}
	return ctx
}

func (commitTracer) TraceQueryEnd(_ context.Context, c *pgx.Conn, _ pgx.TraceQueryEndData) {
	delete(c.PgConn().CustomData(), commitWatchData)
}

// onNotice notes a WARNING that comes while a watched COMMIT runs.
func onNotice(c *pgconn.PgConn, n *pgconn.Notice) {
	w, ok := c.CustomData()[commitWatchData].(*pgTx)
	if ok && w.warning == "" && n.SeverityUnlocalized == "WARNING" {
		w.warning = n.Message
	}
}
