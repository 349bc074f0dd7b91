package store

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"example.com/paymentsd/internal/store/storetest"
)

// TestPostgresMigrationsBesideAReader: a rollout's migrations run while
// the replicas they upgrade go on serving, and while a backup may be
// reading (pg_dump: one REPEATABLE READ snapshot, holding ACCESS SHARE on
// every table). A migration that needs a lock a reader holds up (DROP
// INDEX, most ALTER TABLEs: ACCESS EXCLUSIVE) would wait behind it, and
// every later read and write of the table by the serving replicas would
// queue behind the migration (attack34b, on a first version of migration
// 8, which dropped records_state on PostgreSQL too). From schema 6, the
// migrations since (7's CREATE INDEX records_due, whose SHARE lock a
// reader does not block, and any newer one) must let a serving replica's
// lookup through, and succeed.
func TestPostgresMigrationsBesideAReader(t *testing.T) {
	lookup, migrated := stallByMigration(t, []string{
		// Schema 6's indexes on records, as it left them.
		`CREATE INDEX IF NOT EXISTS records_state ON records (state, next_settle_at)`,
		`DROP INDEX records_due`,
		`DELETE FROM schema_migrations WHERE version >= 7`,
	})
	if lookup != nil || migrated != nil {
		t.Errorf("a serving replica's lookup while the migrations ran: %v; the migrations: %v", lookup, migrated)
	}
}

// stallByMigration opens a store (the running replica), puts its database
// back with setup, holds a pg_dump-like snapshot open, starts the new
// binary's Open, and reads through the running store with a 1 s deadline
// once the migration waits for a lock on records (or it has ended). It
// returns the lookup's error and the Open's.
func stallByMigration(t *testing.T, setup []string) (lookup, migrated error) {
	ctx := context.Background()
	url := storetest.PostgresURL(t)
	running, err := Open(ctx, url, "sandbox", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close()
	for _, q := range setup {
		if err := Exec(ctx, running, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := running.Get(ctx, "absent"); err != nil && !errors.Is(err, ErrNotFound) {
		t.Fatalf("a lookup before the migration: %v", err)
	}

	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// pg_dump: one REPEATABLE READ snapshot, ACCESS SHARE on every table.
	dump, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dump.Rollback()
	var n int
	if err := dump.QueryRowContext(ctx, `SELECT count(*) FROM records`).Scan(&n); err != nil {
		t.Fatal(err)
	}

	done := make(chan error, 1)
	go func() {
		s, err := Open(ctx, url, "sandbox", Options{MigrateTimeout: 3 * time.Second})
		if err == nil {
			s.Close()
		}
		done <- err
	}()
	// Wait for the DROP INDEX to queue for its lock (or the migration to
	// end without waiting).
	waiting := false
	for !waiting {
		select {
		case err := <-done:
			t.Logf("the migration ended without waiting for a lock on records: %v", err)
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			if _, err := running.Get(rctx, "absent"); err != nil && !errors.Is(err, ErrNotFound) {
				lookup = err
			}
			return lookup, err
		default:
		}
		if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE relation = 'records'::regclass AND mode = 'AccessExclusiveLock' AND NOT granted)`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}

	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	start := time.Now()
	_, err = running.Get(rctx, "absent")
	took := time.Since(start)
	if err != nil && !errors.Is(err, ErrNotFound) {
		lookup = err
	}
	t.Logf("lookup while the migration waits for its lock: %v after %v", err, took.Round(time.Millisecond))
	// The store's health (what readiness follows) writes meta, not
	// records: the stalled replica stays ready.
	t.Logf("heartbeat meanwhile: %v", running.beat(time.Second))
	return lookup, <-done
}
