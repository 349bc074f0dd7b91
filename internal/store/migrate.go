package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The schema is a numbered list of plain SQL files per backend, embedded in
// the binary: migrations/<backend>/NNNN_name.sql.
//
// The runner is hand-written rather than pressly/goose (which would be
// light enough as a dependency) because of how it locks: all pending
// migrations, and the environment stamp, run in one transaction that first
// takes pg_advisory_xact_lock in PostgreSQL (BEGIN IMMEDIATE's write lock in
// SQLite). Replicas that start together wait on the lock rather than poll
// for it as goose's session locker does (its default retry interval is
// seconds), a replica that dies mid-migration leaves nothing half applied
// and no lock behind, and a newer replica's migrations never interleave
// with an older one's. It is about sixty lines.
//
//go:embed migrations
var migrationFS embed.FS

// migrationLockID is the PostgreSQL advisory lock key for migrations:
// "paymentsd" read as ASCII, truncated to 8 bytes.
const migrationLockID int64 = 0x7061796d656e7473

type migration struct {
	version int
	name    string
	sql     string
}

func migrations(backend string) ([]migration, error) {
	dir := "migrations/" + backend
	entries, err := fs.ReadDir(migrationFS, dir)
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || !strings.HasSuffix(e.Name(), ".sql") {
			return nil, fmt.Errorf("migration file %s/%s is not named NNNN_name.sql", dir, e.Name())
		}
		b, err := fs.ReadFile(migrationFS, dir+"/"+e.Name())
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: e.Name(), sql: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

// migrate applies the pending migrations and checks (or sets) the
// environment stamp, in one transaction, reporting to logger (if not nil)
// each migration applied and the schema version.
func (s *Store) migrate(ctx context.Context, env string, logger *slog.Logger) error {
	ms, err := migrations(s.d.name)
	if err != nil {
		return err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var applied []string
	var current int
	start := time.Now()
	err = s.transact(ctx, func(tx *sql.Tx, _ time.Time) error {
		applied = applied[:0]
		if s.d.name == "postgres" {
			// A migration may rewrite a large table: it is bounded by ctx,
			// not by the statement timeout of everyday queries.
			if _, err := tx.ExecContext(ctx, `SET LOCAL statement_timeout = 0`); err != nil {
				return fmt.Errorf("lift the statement timeout: %w", err)
			}
			if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLockID); err != nil {
				return fmt.Errorf("take the migration lock: %w", err)
			}
		}
		if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, name text NOT NULL)`); err != nil {
			return fmt.Errorf("create schema_migrations: %w", err)
		}
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&current); err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		for _, m := range ms {
			if m.version <= current {
				continue
			}
			if _, err := tx.ExecContext(ctx, m.sql); err != nil {
				return fmt.Errorf("migration %s: %w", m.name, err)
			}
			if _, err := tx.ExecContext(ctx, s.d.q(`INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`), m.version, m.name); err != nil {
				return fmt.Errorf("record migration %s: %w", m.name, err)
			}
			applied = append(applied, m.name)
		}
		if len(ms) > 0 && current > ms[len(ms)-1].version {
			return fmt.Errorf("database schema version %d is newer than this binary's %d; deploy the newer binary", current, ms[len(ms)-1].version)
		}

		if _, err := tx.ExecContext(ctx, s.d.q(`INSERT INTO meta (name, value) VALUES ('environment', $1) ON CONFLICT (name) DO NOTHING`), env); err != nil {
			return fmt.Errorf("stamp environment: %w", err)
		}
		var stamped string
		if err := tx.QueryRowContext(ctx, `SELECT value FROM meta WHERE name = 'environment'`).Scan(&stamped); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return errors.New("environment stamp missing after stamping")
			}
			return fmt.Errorf("read environment stamp: %w", err)
		}
		if stamped != env {
			return fmt.Errorf("the database is stamped for provider environment %q and this process runs %q; point it at the %s database: %w", stamped, env, env, ErrWrongEnvironment)
		}
		return nil
	})
	if err != nil {
		return err
	}
	version := current
	if len(ms) > 0 {
		version = max(current, ms[len(ms)-1].version)
	}
	if len(applied) > 0 {
		logger.Info("applied migrations", "backend", s.d.name, "from_version", current, "to_version", version,
			"migrations", applied, "took", time.Since(start).Round(time.Millisecond).String())
	} else {
		logger.Info("database schema is up to date", "backend", s.d.name, "version", version)
	}
	return nil
}
