package storetest

import (
	"context"
	"os"
	"testing"

	"example.com/paymentsd/internal/pgtest"
	"example.com/paymentsd/internal/testenv"
)

// Cluster is a PostgreSQL server of a test's own, which the test may stop
// and start (as a failing database would), unlike the shared server of
// PAYMENTS_TEST_POSTGRES_URL. It is pgtest.Server, failing the test on
// errors.
type Cluster struct {
	t testing.TB
	s *pgtest.Server
	// URL is the cluster's postgres database, for the postgres superuser.
	URL string
}

// StartCluster initdbs and starts a throwaway PostgreSQL cluster on a free
// loopback port, trusting local connections; t.Cleanup stops it and
// removes its files. It needs PostgreSQL's server binaries (as `bash
// .ci/postgres` installs them): without them it skips the test, except
// under CI=true, where it fails it. As root, the server runs as the
// postgres user, as PostgreSQL requires.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	if _, err := pgtest.ServerBin(); err != nil {
		testenv.Missing(t, "PostgreSQL's server binaries are not installed (/usr/lib/postgresql/*/bin); run bash .ci/postgres")
	}
	dir, err := os.MkdirTemp("", "paymentsd-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s, err := pgtest.StartServer(context.Background(), dir, pgtest.ServerOptions{MaxConnections: 100})
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(s.Close)
	return &Cluster{t: t, s: s, URL: s.URL}
}

// Start starts the server, which must be stopped, and waits until it
// accepts connections.
func (c *Cluster) Start() {
	c.t.Helper()
	if err := c.s.Start(context.Background()); err != nil {
		c.t.Fatalf("%v\n%s", err, c.s.ServerLog())
	}
}

// Stop stops the server with pg_ctl's shutdown mode: "fast" (roll back
// open transactions, close connections) or "immediate" (abort, as a crash
// would; the next start recovers from the WAL).
func (c *Cluster) Stop(mode string) {
	c.t.Helper()
	if err := c.s.Stop(context.Background(), mode); err != nil {
		c.t.Fatalf("%v\n%s", err, c.s.ServerLog())
	}
}

// Kill kills the server with SIGKILL, the postmaster and every process it
// started, as a crash would, and waits until they are gone. Start starts
// it again, recovering from the WAL.
func (c *Cluster) Kill() {
	c.t.Helper()
	if err := c.s.Kill(); err != nil {
		c.t.Fatal(err)
	}
}

// Freeze stops the server with SIGSTOP, the postmaster and every process
// it started: a hung server, whose connections stay open and whose
// statements and commits neither finish nor fail. It returns thaw, which
// sends them SIGCONT; t.Cleanup thaws it too.
func (c *Cluster) Freeze() (thaw func()) {
	c.t.Helper()
	thaw, err := c.s.Freeze()
	if err != nil {
		c.t.Fatalf("freeze the server: %v", err)
	}
	c.t.Cleanup(thaw)
	return thaw
}
