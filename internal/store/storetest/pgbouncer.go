package storetest

import (
	"errors"
	"os"
	"testing"

	"example.com/paymentsd/internal/pgtest"
)

// PgBouncer is a PgBouncer of a test's own in transaction mode
// (pgtest.PgBouncer), failing the test on errors.
type PgBouncer struct {
	t testing.TB
	b *pgtest.PgBouncer
}

// PooledPostgresURL is PostgresURL reached through a PgBouncer of the
// test's own in transaction mode, whose pool holds poolSize server
// connections for the database.
func PooledPostgresURL(t testing.TB, poolSize int) string {
	t.Helper()
	direct := PostgresURL(t)
	return StartPgBouncer(t, direct, poolSize).URL(direct)
}

// StartPgBouncer starts PgBouncer on a free loopback port, in transaction
// mode, in front of the PostgreSQL server that serverURL names, with a
// pool of poolSize server connections for each database and user (see
// pgtest.StartPgBouncer). t.Cleanup stops it. It needs PgBouncer
// (Debian's package pgbouncer): without it it skips the test, except
// under CI=true, where it fails it.
func StartPgBouncer(t testing.TB, serverURL string, poolSize int) *PgBouncer {
	t.Helper()
	dir, err := os.MkdirTemp("", "paymentsd-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b, err := pgtest.StartPgBouncer(dir, serverURL, poolSize)
	if errors.Is(err, pgtest.ErrNoPgBouncer) {
		if os.Getenv("CI") == "true" {
			t.Fatal("pgbouncer is not installed and CI=true; apt-get install pgbouncer (.ci/run does)")
		}
		t.Skip("pgbouncer is not installed; apt-get install pgbouncer to test paymentsd behind a pooler")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return &PgBouncer{t: t, b: b}
}

// URL returns dbURL, a URL of a database on the server behind b, with b's
// address in place of the server's.
func (b *PgBouncer) URL(dbURL string) string {
	b.t.Helper()
	u, err := b.b.URL(dbURL)
	if err != nil {
		b.t.Fatal(err)
	}
	return u
}

// Restart stops PgBouncer, which closes every client's connection and
// every server connection, as a pooler's restart or crash does, and
// starts it again on the same port.
func (b *PgBouncer) Restart() {
	b.t.Helper()
	if err := b.b.Restart(); err != nil {
		b.t.Fatal(err)
	}
}
