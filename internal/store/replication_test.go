package store_test

import (
	"context"
	"database/sql"
	"net/url"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
)

// openFor opens a store on url, closed at the test's end.
func openFor(t *testing.T, url string) *store.Store {
	t.Helper()
	s, err := store.Open(t.Context(), url, "sandbox", store.Options{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func readReplication(t *testing.T, s *store.Store) store.Replication {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	r, err := s.Replication(ctx)
	if err != nil {
		t.Fatalf("Replication() = %v", err)
	}
	return r
}

// TestReplicationSQLite: a SQLite file is local and never fails over: its
// commits count as durable.
func TestReplicationSQLite(t *testing.T) {
	t.Parallel()
	r := readReplication(t, openFor(t, storetest.SQLiteURL(t)))
	if want := (store.Replication{Backend: "sqlite"}); r != want {
		t.Errorf("Replication() = %+v, want %+v", r, want)
	}
	if !r.Synchronous() {
		t.Errorf("Replication().Synchronous() = false on SQLite, want true")
	}
}

// TestReplicationSettings reads a real PostgreSQL server's settings as
// they change: a lone server (its commits wait for no standby), one whose
// commits wait for a standby that is not there (synchronous: commits wait,
// none is lost), and the same server for a role whose synchronous_commit
// is local (not synchronous, whatever the names say).
func TestReplicationSettings(t *testing.T) {
	t.Parallel()
	c := storetest.StartCluster(t)
	s := openFor(t, c.URL)
	admin, err := sql.Open("pgx", c.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() }) // after setNames's cleanup
	setNames := func(names string) {
		t.Helper()
		// Not t.Context(): the cleanup sets the names back too.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := admin.ExecContext(ctx, `ALTER SYSTEM SET synchronous_standby_names = '`+names+`'`); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.ExecContext(ctx, `SELECT pg_reload_conf()`); err != nil {
			t.Fatal(err)
		}
		// pg_reload_conf signals the postmaster and returns; a new session
		// reads the file once the postmaster has.
		deadline := time.Now().Add(30 * time.Second)
		for {
			var got string
			if err := admin.QueryRowContext(ctx, `SHOW synchronous_standby_names`).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got == names {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("synchronous_standby_names = %q 30s after reload, want %q", got, names)
			}
			time.Sleep(10 * time.Millisecond) // the reload has no signal to wait on
		}
	}

	if got, want := readReplication(t, s), (store.Replication{Backend: "postgres", SynchronousCommit: "on"}); got != want || got.Synchronous() {
		t.Errorf("lone server: Replication() = %+v (synchronous %v), want %+v, not synchronous", got, got.Synchronous(), want)
	}

	// Commits now wait for a standby named standby1: none is lost, and
	// none is acknowledged until it streams. Writes wait, so the store
	// that reads the settings was opened before.
	setNames("FIRST 1 (standby1)")
	t.Cleanup(func() { setNames("") }) // release the heartbeat's commit before Close
	if got, want := readReplication(t, s), (store.Replication{Backend: "postgres", SynchronousCommit: "on", SynchronousStandbyNames: "FIRST 1 (standby1)"}); got != want || !got.Synchronous() {
		t.Errorf("commits waiting for a standby: Replication() = %+v (synchronous %v), want %+v, synchronous", got, got.Synchronous(), want)
	}

	// synchronous_commit as this store's sessions get it (a startup
	// parameter here; a role's or database's setting in production).
	for _, level := range []string{"local", "off", "remote_write", "remote_apply"} {
		u, err := url.Parse(c.URL)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("synchronous_commit", level)
		u.RawQuery = q.Encode()
		got := readReplication(t, openFor(t, u.String()))
		want := store.Replication{Backend: "postgres", SynchronousCommit: level, SynchronousStandbyNames: "FIRST 1 (standby1)"}
		if sync := level == "remote_write" || level == "remote_apply"; got != want || got.Synchronous() != sync {
			t.Errorf("synchronous_commit=%s: Replication() = %+v (synchronous %v), want %+v, synchronous %v", level, got, got.Synchronous(), want, sync)
		}
	}
	setNames("") // before the stores close: their heartbeats' commits wait
}

// TestReplicationPatroni reads the settings of .ci/pgcluster's two-node
// Patroni cluster: strict synchronous replication with its standby
// attached, read directly and through PgBouncer, and by a role that may
// not read the standby's state; and asynchronous replication.
func TestReplicationPatroni(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts two Patroni clusters")
	}
	t.Run("strict", func(t *testing.T) {
		t.Parallel()
		c := storetest.StartPatroniCluster(t, false)
		want := store.Replication{Backend: "postgres", SynchronousCommit: "on", SynchronousStandbyNames: "n2", Standbys: 1, SyncStandbys: 1}
		for name, u := range map[string]string{"haproxy": c.URL, "pooler": c.PoolerURL} {
			got := readReplication(t, openFor(t, c.Database("repl_"+name, u)))
			if got != want || !got.Synchronous() {
				t.Errorf("through %s: Replication() = %+v (synchronous %v), want %+v, synchronous", name, got, got.Synchronous(), want)
			}
		}

		// A role without pg_read_all_stats counts the standby but does not
		// see its state.
		admin, err := sql.Open("pgx", c.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close()
		for _, q := range []string{`CREATE ROLE plain LOGIN`, `CREATE DATABASE repl_plain OWNER plain TEMPLATE template0`} {
			if _, err := admin.ExecContext(t.Context(), q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		u, err := url.Parse(c.URL)
		if err != nil {
			t.Fatal(err)
		}
		u.User, u.Path = url.User("plain"), "/repl_plain"
		got := readReplication(t, openFor(t, u.String()))
		want.SyncStandbys = -1
		if diff := cmp.Diff(want, got); diff != "" || !got.Synchronous() {
			t.Errorf("as a plain role: Replication() (-want +got):\n%s\nsynchronous %v, want true", diff, got.Synchronous())
		}
	})
	t.Run("async", func(t *testing.T) {
		t.Parallel()
		c := storetest.StartPatroniCluster(t, true)
		got := readReplication(t, openFor(t, c.Database("repl", c.URL)))
		if want := (store.Replication{Backend: "postgres", SynchronousCommit: "on", Standbys: 1}); got != want || got.Synchronous() {
			t.Errorf("Replication() = %+v (synchronous %v), want %+v, not synchronous", got, got.Synchronous(), want)
		}
	})
}
