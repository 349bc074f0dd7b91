package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// DeleteBefore deletes up to limit records last updated before t (never
// InProgress ones) and up to limit events received before t, and returns
// how many rows it deleted in all. Call it repeatedly for small batches.
func (s *Store) DeleteBefore(ctx context.Context, t time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	d := s.d
	var total int64
	err := s.transact(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, d.q(`
			DELETE FROM records WHERE `+d.keyCol+` IN (
				SELECT `+d.keyCol+` FROM records WHERE updated_at < $1 AND state <> $2
				ORDER BY updated_at LIMIT $3 `+d.skipLocked+`)`),
			d.t(t), int(StateInProgress), limit)
		if err != nil {
			return fmt.Errorf("records: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		total += n
		res, err = tx.ExecContext(ctx, d.q(`
			DELETE FROM events WHERE seq IN (
				SELECT seq FROM events WHERE received_at < $1
				ORDER BY seq LIMIT $2 `+d.skipLocked+`)`),
			d.t(t), limit)
		if err != nil {
			return fmt.Errorf("events: %w", err)
		}
		n, err = res.RowsAffected()
		total += n
		return err
	})
	if err != nil {
		return 0, s.wrap(fmt.Errorf("delete before %v: %w", t, err))
	}
	return int(total), nil
}
