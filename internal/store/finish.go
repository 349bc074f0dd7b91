package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"example.com/paymentsd/internal/record"
)

// Finish writes o, the outcome of the attempt that claimed acquired
// (Began.Record, or a record SettleDue acquired), in the writer's next
// group commit, by the store's clock, and returns record.Step's verdict:
//   - Written: the outcome is on the record, with its attempt's journal
//     row (none for NothingSent), in one statement guarded by o.Owner's
//     lease; or it was already (a Finish repeated after a commit whose
//     outcome was unknown), and nothing more was written;
//   - Late: o.Owner no longer held the record and o is a 2xx: its
//     attempt's abandoned row gets the answer, and the record is
//     Succeeded (a holder in flight has its attempt ended, abandoned);
//   - LeaseLost: o.Owner no longer holds the record, and o is not a 2xx
//     (or left no trace): nothing was written.
//
// It returns an error only when the database failed: ErrCommitUnknown if
// the commit was sent and no answer came (a retry finds it Written, or
// writes it).
func (s *Store) Finish(ctx context.Context, claimed *record.Record, o record.Outcome) (record.Verdict, error) {
	if claimed == nil {
		return 0, errors.New("finish: no claimed record")
	}
	if o.Result < record.Paid || o.Result > record.NothingSent {
		return 0, fmt.Errorf("finish %.64q: result %d is not an outcome", claimed.Key, o.Result)
	}
	if !s.d.storable(claimed.Key) {
		return record.LeaseLost, nil
	}
	var v record.Verdict
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx, now time.Time) error {
		var err error
		v, err = s.finish(ctx, tx, claimed, o, now)
		return err
	})
	if err != nil {
		return 0, s.wrap(fmt.Errorf("finish %.64q: %w", claimed.Key, err))
	}
	return v, nil
}

// write runs fn in a write transaction, the batcher's next one, with the
// store's clock as it began.
func (s *Store) write(ctx context.Context, fn func(context.Context, *sql.Tx, time.Time) error) error {
	return s.batch.run(ctx, fn)
}

// finish is Finish's operation in tx, at now.
func (s *Store) finish(ctx context.Context, tx *sql.Tx, claimed *record.Record, o record.Outcome, now time.Time) (record.Verdict, error) {
	n, eff := record.Step(claimed, o, now)
	if eff.Write == record.WriteFinish {
		held, err := s.finishHeld(ctx, tx, o.Owner, &n, eff.Ended)
		if err != nil || held {
			return eff.Verdict, err
		}
	}
	// Not held by o.Owner (any more): Step decides on the record as it
	// is, and the author's journal row.
	r, err := s.lockedRecord(ctx, tx, claimed.Key, now)
	if errors.Is(err, ErrNotFound) {
		return record.LeaseLost, nil
	}
	if err != nil {
		return 0, err
	}
	row, id, err := s.ownRow(ctx, tx, r.Key, o.Owner)
	if err != nil {
		return 0, err
	}
	o.Row = row
	n, eff = record.Step(&r, o, now)
	if eff.Write == record.WriteFinish {
		// Held after all: claimed was not the record as acquired.
		if _, err := s.finishHeld(ctx, tx, o.Owner, &n, eff.Ended); err != nil {
			return 0, err
		}
		return eff.Verdict, nil
	}
	return eff.Verdict, s.apply(ctx, tx, &r, &n, eff, id)
}

// finishHeld runs the finish statement (WriteFinish): n, the record
// after owner's outcome, and ended, its journal row, if owner still
// holds the record. It reports whether it did.
func (s *Store) finishHeld(ctx context.Context, tx *sql.Tx, owner string, n *record.Record, ended *record.Attempt) (bool, error) {
	st, err := s.txStmt(ctx, tx, s.stmts.finish)
	if err != nil {
		return false, err
	}
	args := finishArgs(s.d, owner, n, ended)
	if s.d.name == "sqlite" {
		res, err := st.ExecContext(ctx, args...)
		if err != nil {
			return false, err
		}
		changed, err := res.RowsAffected()
		if changed == 1 {
			noteWrote(ctx)
		}
		return changed == 1, err
	}
	var changed int64
	err = st.QueryRowContext(ctx, args...).Scan(&changed)
	if changed == 1 {
		noteWrote(ctx)
	}
	return changed == 1, err
}

// Release ends owner's claims, which may have committed without their
// claimant learning it (Begin's or SettleDue's ErrCommitUnknown, or a
// detached claim): every record InProgress under owner's lease gets
// owner's outcome NothingSent (record.Step: NotCreated if the attempt
// started the key afresh, else OutcomeUnknown due for settlement after
// settleAfter), with the finish statement. It returns how many it
// released: none when the claim never committed. (A claimant never takes
// over its own process's records, so without this a lost claim would
// wait for another replica.)
func (s *Store) Release(ctx context.Context, owner string, settleAfter time.Duration) (int, error) {
	var n int
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx, now time.Time) error {
		n = 0
		st, err := s.txStmt(ctx, tx, s.stmts.held)
		if err != nil {
			return err
		}
		rows, err := st.QueryContext(ctx, owner)
		if err != nil {
			return err
		}
		held, err := scanRecords(rows, now)
		if err != nil {
			return err
		}
		for _, r := range held {
			o := record.Outcome{Owner: owner, Result: record.NothingSent, SettleAfter: max(settleAfter, 0)}
			nr, eff := record.Step(&r, o, now)
			if eff.Write != record.WriteFinish {
				return fmt.Errorf("release %.64q: %v", r.Key, eff.Verdict)
			}
			ok, err := s.finishHeld(ctx, tx, owner, &nr, eff.Ended)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("release %.64q: %w", r.Key, errChanged)
			}
			n++
		}
		return nil
	})
	if err != nil {
		return 0, s.wrap(fmt.Errorf("release claims: %w", err))
	}
	return n, nil
}
