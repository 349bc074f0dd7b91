package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"example.com/paymentsd/internal/record"
)

// Began is Begin's result.
type Began struct {
	// Verdict is record.Step's: Acquired, Replay, Reused, NotOwned,
	// Expired, Busy, Quiet, PastWindow, or Left (the claim ran only once
	// its caller's deadline had come, and wrote nothing).
	Verdict record.Verdict
	// Record is the record as Begin found it, or as it acquired it; empty
	// for NotOwned, so that nothing of another caller's record leaks.
	Record record.Record
	// Tombstone is the key's tombstone, for Expired.
	Tombstone Tombstone
}

// ClaimPendingError is Begin's error when its caller can't know the
// claim's outcome: ctx ended before it was known (Err is ctx's error), or
// the commit was sent and its answer never came (Err wraps
// ErrCommitUnknown: the claim may hold the record, and late is not called).
type ClaimPendingError struct {
	// Ran: the claim was taken into a transaction that may yet commit;
	// Begin's late gets its outcome. Otherwise it never ran, and never
	// will.
	Ran bool
	// SawMaybe, when Ran: the claim read a record on which an earlier
	// attempt may have created a payment (InProgress, OutcomeUnknown or
	// Succeeded, or a tombstone of one), or had read nothing yet.
	SawMaybe bool
	// Err is ctx's error, or ErrCommitUnknown's.
	Err error
}

func (e *ClaimPendingError) Error() string {
	if errors.Is(e.Err, ErrCommitUnknown) {
		return e.Err.Error()
	}
	if e.Ran {
		return fmt.Sprintf("the claim's transaction had not committed when its caller stopped waiting: %v", e.Err)
	}
	return fmt.Sprintf("the claim was still queued when its caller stopped waiting, and will not run: %v", e.Err)
}

func (e *ClaimPendingError) Unwrap() error { return e.Err }

// What a claim has read, for ClaimPendingError.SawMaybe.
const (
	sawNothingYet int32 = iota
	sawNone             // no record, or one on which no payment can exist
	sawMaybe
)

// Begin asks, in one transaction of the writer's next group commit, by
// the store's clock, whether c's call may send its request with c.Key:
// record.Step decides, on the key's record (read and locked), and the
// store writes what it decided. A new key is one INSERT (WriteInsert). A
// key with a tombstone and no record is Expired (NotOwned, with
// c.OwnKeysOnly, if the tombstone names another caller). The store sets
// c.Settled (its writes have been healthy for the takeover grace, see
// WriteHealthyFor); c.Pending is the caller's.
//
// If ctx ends before the claim's outcome is known, Begin returns at once
// a *ClaimPendingError wrapping ctx's error: Ran false if the claim never
// ran (it never will, and late is never called); Ran true if it ran in a
// transaction not yet committed: late is then called exactly once, on the
// store's goroutine, with what Begin would have returned once the
// transaction commits or fails (ErrCommitUnknown if the commit's answer
// never came: the claim may hold the record). A result already in when
// ctx ends is returned. A claim its caller left in a batch that fails is
// not run again: late gets an error, and nothing of it was written.
//
// It returns ErrKeyNotStorable for a key the backend can't hold exactly,
// and ErrCommitUnknown when the commit was sent and no answer came.
func (s *Store) Begin(ctx context.Context, c record.Claim, late func(*Began, error)) (*Began, error) {
	if !s.d.storable(c.Key) {
		return nil, fmt.Errorf("begin %.64q: %w", c.Key, ErrKeyNotStorable)
	}
	var saw atomic.Int32
	// On the heap, as the operation that fills it is: the caller's frame
	// holds a pointer, not the 700 bytes of a record and a tombstone.
	b := new(Began)
	op := &batchOp{ctx: ctx, errc: make(chan error, 1)}
	deadline, hasDeadline := ctx.Deadline()
	op.fn = func(ctx context.Context, tx *sql.Tx, now time.Time) error {
		ran := time.Now()
		if hasDeadline {
			// A claim that runs once its caller has stopped waiting (a
			// pooler queued its transaction past the deadline, or its read
			// came back after it) writes nothing: record.Claim.AnswerBy,
			// on the store's clock as begin reads it (readNow).
			c.AnswerBy = s.readNow(now, ran).Add(time.Until(deadline))
		}
		var err error
		*b, err = s.begin(ctx, tx, c, now, ran, &saw)
		return err
	}
	op.late = func(err error) {
		if late == nil {
			return
		}
		if err != nil {
			late(nil, s.wrap(fmt.Errorf("begin %.64q: %w", c.Key, err)))
			return
		}
		late(b, nil)
	}
	err, state := s.batch.wait(ctx, op)
	switch {
	case state == opAbandoned:
		return nil, fmt.Errorf("begin %.64q: %w", c.Key, &ClaimPendingError{Err: err})
	case state == opDetached:
		pending := &ClaimPendingError{Ran: true, SawMaybe: saw.Load() != sawNone, Err: err}
		return nil, fmt.Errorf("begin %.64q: %w", c.Key, pending)
	case errors.Is(err, ErrCommitUnknown):
		// The claim may hold the record; what it read says what the
		// caller may be told.
		pending := &ClaimPendingError{Ran: true, SawMaybe: saw.Load() != sawNone, Err: err}
		return nil, s.wrap(fmt.Errorf("begin %.64q: %w", c.Key, pending))
	case err != nil:
		return nil, s.wrap(fmt.Errorf("begin %.64q: %w", c.Key, err))
	}
	return b, nil
}

// begin is Begin's operation in tx, which began at now, run from ran (this
// process's clock); it notes in saw what it read. Step decides on a record
// read at the store's clock as it was read (readNow): the read may come
// back long after the transaction began (a stalled connection, a lock
// held by a stuck transaction), and a claim whose caller stopped waiting
// meanwhile must find it so (Claim.AnswerBy), for another call may have
// told the caller since that no payment exists.
func (s *Store) begin(ctx context.Context, tx *sql.Tx, c record.Claim, now, ran time.Time, saw *atomic.Int32) (Began, error) {
	c.Settled = s.writesSettled()
	n, eff := record.Step(nil, c, s.readNow(now, ran))
	if eff.Verdict == record.Left {
		saw.Store(sawNone)
		return Began{Verdict: record.Left}, nil
	}
	// The INSERT waits for a concurrent transaction inserting the same key
	// (PostgreSQL) and does nothing once it has committed; the SELECT then
	// locks the committed row. A row deleted in between (retention) sends
	// us round again, to find its tombstone.
	for range 3 {
		ins, err := s.txStmt(ctx, tx, s.stmts.insert)
		if err != nil {
			return Began{}, err
		}
		res, err := ins.ExecContext(ctx, s.insertArgs(&n)...)
		if err != nil {
			return Began{}, err
		}
		inserted, err := res.RowsAffected()
		if err != nil {
			return Began{}, err
		}
		if inserted == 1 {
			noteWrote(ctx)
			saw.Store(sawNone)
			return Began{Verdict: record.Acquired, Record: n}, nil
		}
		r, err := s.lockedRecord(ctx, tx, c.Key, now)
		if errors.Is(err, ErrNotFound) {
			ts, err := s.tombstoneTx(ctx, tx, keySHA256(c.Key))
			if errors.Is(err, ErrNotFound) {
				continue
			}
			if err != nil {
				return Began{}, err
			}
			saw.Store(sawOf(ts.State))
			if c.OwnKeysOnly && ts.CallerKnown && ts.Caller != c.Caller {
				return Began{Verdict: record.NotOwned}, nil
			}
			return Began{Verdict: record.Expired, Tombstone: ts}, nil
		}
		if err != nil {
			return Began{}, err
		}
		at := s.readNow(now, ran)
		r.ReadAt = at
		saw.Store(sawOf(r.State))
		n, eff := record.Step(&r, c, at)
		b := Began{Verdict: eff.Verdict, Record: n}
		switch eff.Verdict {
		case record.NotOwned:
			// Nothing of another caller's record, not even what it holds.
			saw.Store(sawMaybe)
		case record.Expired:
			if b.Tombstone, err = s.tombstoneOf(ctx, tx, &r); err != nil {
				return Began{}, err
			}
		}
		return b, s.apply(ctx, tx, &r, &n, eff, 0)
	}
	return Began{}, errors.New("record deleted and recreated repeatedly while beginning; retry")
}

// sawOf is what reading a record (or tombstone) in state st tells a claim.
func sawOf(st record.State) int32 {
	switch st {
	case record.InProgress, record.OutcomeUnknown, record.Succeeded:
		return sawMaybe
	}
	return sawNone
}

// tombstoneOf is the tombstone of r, a record retention has tombstoned.
func (s *Store) tombstoneOf(ctx context.Context, tx *sql.Tx, r *record.Record) (Tombstone, error) {
	ts, err := s.tombstoneTx(ctx, tx, keySHA256(r.Key))
	if errors.Is(err, ErrNotFound) {
		// The tombstone has expired already (a tombstone retention
		// shorter than the grace period): the record says the same.
		return Tombstone{KeySHA256: keySHA256(r.Key), BodySHA256: r.BodySHA256, State: r.State, GaveUp: r.GaveUp,
			CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, ExpiredAt: r.TombstonedAt, Caller: r.Caller, CallerKnown: true}, nil
	}
	if err != nil {
		return Tombstone{}, fmt.Errorf("tombstone of a tombstoned record: %w", err)
	}
	return ts, nil
}

// apply writes the change Step made to was, a record read and locked in
// tx: n, with the statement eff.Write names (none for WriteNone), and the
// journal rows eff says (rowID is the row eff.Rewritten rewrites).
func (s *Store) apply(ctx context.Context, tx *sql.Tx, was, n *record.Record, eff record.Effect, rowID int64) error {
	var q string
	switch eff.Write {
	case record.WriteNone:
		return nil
	case record.WriteAcquire, record.WriteTakeOver:
		q = s.stmts.acquire
	case record.WriteAbandon:
		q = s.stmts.abandon
	case record.WriteGiveUp:
		q = s.stmts.giveUp
	case record.WriteLate:
		q = s.stmts.late
	case record.WriteResolve:
		q = s.stmts.resolve
	default:
		return fmt.Errorf("%v is not a write of a record read", eff.Write)
	}
	st, err := s.txStmt(ctx, tx, q)
	if err != nil {
		return err
	}
	res, err := st.ExecContext(ctx, guardedArgs(s.d, writeCols[eff.Write], was, n)...)
	if err != nil {
		return fmt.Errorf("%v: %w", eff.Write, err)
	}
	if err := oneRow(res, eff.Write.String()); err != nil {
		return err
	}
	noteWrote(ctx)
	if eff.Ended != nil {
		if err := s.journal(ctx, tx, was.Key, eff.Ended); err != nil {
			return err
		}
	}
	if eff.Rewritten != nil {
		return s.rewrite(ctx, tx, rowID, eff.Rewritten)
	}
	return nil
}
