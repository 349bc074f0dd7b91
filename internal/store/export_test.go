package store

import (
	"context"
	"database/sql"
	"time"
)

// TombstoneGrace is how long a record outlives its tombstone.
const TombstoneGrace = tombstoneGrace

// CountRows counts the rows of table, whatever their state: it sees the
// records Get hides.
func CountRows(ctx context.Context, s *Store, table string) (int64, error) {
	var n int64
	err := s.w.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+table).Scan(&n)
	return n, err
}

// Exec runs a statement on the writer, as a person with database access
// would.
func Exec(ctx context.Context, s *Store, query string) error {
	_, err := s.w.ExecContext(ctx, query)
	return err
}

// QueuedOps is how many operations wait for the batcher.
func QueuedOps(s *Store) int {
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	return len(s.batch.queue)
}

// Beat commits one heartbeat, giving up after timeout.
func Beat(s *Store, timeout time.Duration) error { return s.beat(timeout) }

// SnapshotSettings is what a PostgreSQL list page's transaction
// (readSnapshot) runs with: its isolation level and whether it is read
// only, and its statement timeout, as the server reports them.
func SnapshotSettings(ctx context.Context, s *Store) (isolation, readOnly, timeout string, err error) {
	err = s.readSnapshot(ctx, func(tx *sql.Tx) error {
		if err := tx.QueryRowContext(ctx, `SHOW transaction_isolation`).Scan(&isolation); err != nil {
			return err
		}
		if err := tx.QueryRowContext(ctx, `SHOW transaction_read_only`).Scan(&readOnly); err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, `SHOW statement_timeout`).Scan(&timeout)
	})
	return isolation, readOnly, timeout, err
}
