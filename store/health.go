package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// CheckWrite commits a one-row write, for readiness: a database that
// answers pings may still refuse writes (a full volume, a PostgreSQL
// server turned read-only by a failover), and then no payment can be
// recorded. Every replica writes the same row.
func (s *Store) CheckWrite(ctx context.Context) error {
	err := s.transact(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, s.d.q(`
			INSERT INTO meta (name, value) VALUES ('write_check', $1)
			ON CONFLICT (name) DO UPDATE SET value = excluded.value`), time.Now().UTC().Format(time.RFC3339Nano))
		return err
	})
	if err != nil {
		return s.wrap(fmt.Errorf("write check: %w", err))
	}
	return nil
}
