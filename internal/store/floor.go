package store

import (
	"context"
	"database/sql"
	"time"
)

// FloorExec runs one statement in the writer's next group commit, as
// Begin's and Finish's statements run (the same connection, driver,
// pragmas, batching and commit), and returns once that commit is
// durable. It is paymentsbench's record floor, the least that any service
// with durable records must do, measured on a table of the floor's own:
// it is not a way into the store's tables. query uses $N placeholders.
func (s *Store) FloorExec(ctx context.Context, query string, args ...any) error {
	query = s.d.q(query)
	if _, err := s.prepared(ctx, s.w, query); err != nil {
		return s.wrap(err)
	}
	return s.wrap(s.batch.run(ctx, func(ctx context.Context, tx *sql.Tx, _ time.Time) error {
		st, err := s.txStmt(ctx, tx, query)
		if err != nil {
			return err
		}
		if _, err = st.ExecContext(ctx, args...); err == nil {
			noteWrote(ctx)
		}
		return err
	}))
}

// FloorExecLater is FloorExec without waiting for the commit: the
// statement is queued for the next group commit, no goroutine waits on
// it, and done gets its result on the goroutine that commits. Close waits
// for it.
func (s *Store) FloorExecLater(done func(error), query string, args ...any) {
	query = s.d.q(query)
	s.later.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), floorLaterTimeout)
	s.batch.submit(&batchOp{ctx: ctx, fn: func(ctx context.Context, tx *sql.Tx, _ time.Time) error {
		st, err := s.txStmt(ctx, tx, query)
		if err != nil {
			return err
		}
		if _, err = st.ExecContext(ctx, args...); err == nil {
			noteWrote(ctx)
		}
		return err
	}, done: func(err error) {
		defer s.later.Done()
		cancel()
		done(s.wrap(err))
	}})
}

// floorLaterTimeout bounds a FloorExecLater.
const floorLaterTimeout = 30 * time.Second
