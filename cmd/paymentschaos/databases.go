package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"example.com/paymentsd/internal/pgtest"
	"example.com/paymentsd/internal/store"
)

// Record stores the replicas can share.
const (
	storePostgres = "postgres" // a PostgreSQL server the run starts and stops itself
	storeSQLite   = "sqlite"   // one SQLite file, shared by the replicas' processes
	storePatroni  = "patroni"  // the two-node Patroni cluster of .ci/pgcluster
)

// Replication modes of a Patroni cluster (-replication), as .ci/pgcluster
// starts them.
const (
	replicationStrict    = pgtest.ReplicationStrict
	replicationNonStrict = pgtest.ReplicationNonStrict
	replicationAsync     = pgtest.ReplicationAsync
)

// startPostgres starts a PostgreSQL server of the run's own under dir,
// which faults stop, kill, freeze and make read-only, as storetest.Cluster
// is a test's. It needs PostgreSQL's server binaries (bash .ci/postgres
// installs them).
func startPostgres(ctx context.Context, dir string, logw io.Writer) (*pgtest.Server, error) {
	s, err := pgtest.StartServer(ctx, filepath.Join(dir, "postgres"), pgtest.ServerOptions{MaxConnections: 200, Log: logw})
	if errors.Is(err, pgtest.ErrNoServer) {
		return nil, errors.New("PostgreSQL's server binaries are not installed (/usr/lib/postgresql/*/bin); run bash .ci/postgres, or use -store=sqlite")
	}
	return s, err
}

// startAgain starts the stopped server again and waits until it accepts
// connections. After a SIGKILL of the postmaster its orphaned backends may
// hold the shared memory for a moment: it tries again until they have
// gone, for a minute at most.
func startAgain(ctx context.Context, s *pgtest.Server) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := s.Start(ctx)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		if !sleepCtx(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// holdSQLiteLock takes the SQLite database's write lock from this process
// (BEGIN IMMEDIATE), as another program writing to the file would, and
// holds it until release is closed. It returns once the lock is held.
func holdSQLiteLock(ctx context.Context, path string, release <-chan struct{}) (done <-chan error, err error) {
	db, err := sql.Open(store.SQLiteDriver, store.SQLiteDSN(path, false, "busy_timeout(60000)"))
	if err != nil {
		return nil, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		return nil, err
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		conn.Close()
		db.Close()
		return nil, fmt.Errorf("take the write lock: %w", err)
	}
	errc := make(chan error, 1)
	go func() {
		select {
		case <-release:
		case <-ctx.Done():
		}
		_, err := conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		conn.Close()
		db.Close()
		errc <- err
	}()
	return errc, nil
}

// sleepCtx waits d or until ctx ends; it reports whether ctx is live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
