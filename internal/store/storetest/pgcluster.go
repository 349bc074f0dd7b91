package storetest

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"example.com/paymentsd/internal/pgtest"
)

// PatroniCluster is a two-node PostgreSQL cluster managed by Patroni, with
// HAProxy and PgBouncer in front, started by `.ci/pgcluster` (see the
// script for the shape) for one test, which may kill its primary, switch
// it over and restart its pooler while paymentsd runs on it. It is
// pgtest.Patroni, failing the test on errors.
type PatroniCluster struct {
	t testing.TB
	p *pgtest.Patroni
	// URL goes through HAProxy to the leader (Patroni's REST GET /primary);
	// MultiHostURL names both nodes, with target_session_attrs=read-write;
	// PoolerURL goes through PgBouncer (transaction mode) to HAProxy. Each
	// names the database "payments"; see Database for others.
	URL, MultiHostURL, PoolerURL string
}

// StartPatroniCluster starts a cluster with `bash .ci/pgcluster start`,
// strictly synchronous (synchronous_mode and synchronous_mode_strict:
// after a failover, writes wait for the old node to rejoin) unless async,
// and waits until a leader and a (sync) standby stream; t.Cleanup stops
// it and removes its files. Without Patroni, etcd, HAProxy, PgBouncer or
// PostgreSQL it skips the test, except under CI=true, where it fails it.
func StartPatroniCluster(t testing.TB, async bool) *PatroniCluster {
	t.Helper()
	if missing := pgtest.PatroniTools(); len(missing) > 0 {
		msg := fmt.Sprintf("a Patroni cluster needs %s: apt-get install patroni etcd-server haproxy pgbouncer postgresql curl jq", strings.Join(missing, ", "))
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + " (CI=true: .ci/run installs them)")
		}
		t.Skip(msg)
	}
	script, err := pgtest.RepoFile(".ci/pgcluster")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "paymentsd-pgcluster-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	replication := pgtest.ReplicationStrict
	if async {
		replication = pgtest.ReplicationAsync
	}
	p, err := pgtest.StartPatroni(context.Background(), script, filepath.Join(dir, "c"), replication, nil)
	if err != nil {
		t.Fatalf("start the cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("stop the cluster: %v", err)
		}
	})
	if p.URL == "" || p.MultiHostURL == "" || p.PoolerURL == "" {
		t.Fatalf(".ci/pgcluster start printed no URLs")
	}
	return &PatroniCluster{t: t, p: p, URL: p.URL, MultiHostURL: p.MultiHostURL, PoolerURL: p.PoolerURL}
}

// Database creates the database name on the cluster and returns url (one
// of c's URLs) naming it instead.
func (c *PatroniCluster) Database(name, dbURL string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, err := pgtest.CreateDatabase(ctx, c.URL, name); err != nil {
		c.t.Fatalf("create database %s: %v", name, err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		c.t.Fatal("not a URL")
	}
	u.Path = "/" + name
	return u.String()
}

// KillPrimary SIGKILLs the leader's Patroni and PostgreSQL, as a lost
// machine, and returns the node's name at once.
func (c *PatroniCluster) KillPrimary() string {
	c.t.Helper()
	return strings.TrimSpace(c.must("kill-primary", c.p.Dir))
}

// RestartNode starts a killed node again; it rejoins as a replica.
func (c *PatroniCluster) RestartNode(node string) {
	c.t.Helper()
	c.must("restart-node", c.p.Dir, node)
}

// Switchover hands leadership to the other node (patronictl switchover)
// and returns once it leads.
func (c *PatroniCluster) Switchover() { c.t.Helper(); c.must("switchover", c.p.Dir) }

// RestartPooler restarts PgBouncer: its clients' connections drop.
func (c *PatroniCluster) RestartPooler() { c.t.Helper(); c.must("restart-pooler", c.p.Dir) }

// WaitLeader waits until a leader takes writes through every front.
func (c *PatroniCluster) WaitLeader() { c.t.Helper(); c.must("wait-leader", c.p.Dir) }

// WaitHealthy waits until a leader and a streaming (sync) standby run.
func (c *PatroniCluster) WaitHealthy() { c.t.Helper(); c.must("wait-healthy", c.p.Dir) }

// PauseReplication stops (SIGSTOP) the leader's WAL sender, as a network
// that stalls the replication stream would, and returns the function that
// lets it go on (SIGCONT). Asynchronous commits go on without the standby;
// synchronous ones wait for it. (Stopping the standby's WAL receiver
// instead would not do: what the sender has written waits in the socket's
// buffers, and reaches the standby after the primary has died.) The
// cluster must be healthy.
func (c *PatroniCluster) PauseReplication() (resume func()) {
	c.t.Helper()
	leader := c.leader()
	db, err := sql.Open("pgx", "postgres://postgres@"+leader+"/postgres?sslmode=disable")
	if err != nil {
		c.t.Fatal(err)
	}
	defer db.Close()
	var pid int
	if err := db.QueryRow(`SELECT pid FROM pg_stat_replication`).Scan(&pid); err != nil {
		c.t.Fatalf("find the WAL sender of %s: %v", leader, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		c.t.Fatalf("stop the WAL sender: %v", err)
	}
	resumed := false
	resume = func() {
		if !resumed {
			resumed = true
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	c.t.Cleanup(resume)
	return resume
}

// Status is `.ci/pgcluster status`: one line per node.
func (c *PatroniCluster) Status() string { c.t.Helper(); return c.must("status", c.p.Dir) }

func (c *PatroniCluster) must(args ...string) string {
	c.t.Helper()
	out, err := c.p.Run(context.Background(), args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// WaitReplicated waits until the standby has replayed everything the
// leader had written when it was called, so that a test can choose which
// commits an asynchronous failover loses: those made after
// PauseReplication, not those before it.
func (c *PatroniCluster) WaitReplicated() {
	c.t.Helper()
	db, err := sql.Open("pgx", "postgres://postgres@"+c.leader()+"/postgres?sslmode=disable")
	if err != nil {
		c.t.Fatal(err)
	}
	defer db.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		var caughtUp bool
		err := db.QueryRow(`SELECT COALESCE(bool_and(replay_lsn >= pg_current_wal_lsn()), false) FROM pg_stat_replication`).Scan(&caughtUp)
		if err == nil && caughtUp {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the standby did not catch up with the leader within a minute (%v)", err)
		}
		time.Sleep(20 * time.Millisecond) // polling the server: replication has no signal here
	}
}

// leader is the leader's HOST:PORT.
func (c *PatroniCluster) leader() string {
	c.t.Helper()
	for _, line := range strings.Split(c.Status(), "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[1] == "leader" {
			return f[3]
		}
	}
	c.t.Fatalf("no leader:\n%s", c.Status())
	return ""
}
