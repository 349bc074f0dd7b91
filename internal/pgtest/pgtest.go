// Package pgtest starts PostgreSQL, PgBouncer and Patroni on loopback, for
// the tests (through storetest), the chaos checker (cmd/paymentschaos) and
// the benchmark (cmd/paymentsbench): a PostgreSQL server of one's own that
// can be stopped, killed, frozen or made read-only (Server), a fresh
// database on a server (CreateDatabase), a PgBouncer in transaction mode in
// front of one (PgBouncer), and the Patroni cluster of .ci/pgcluster
// (Patroni). It returns errors and never fails a test itself: storetest
// turns them into a test's failures and skips.
package pgtest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
)

// CreateDatabase creates the database name on the PostgreSQL server that
// adminURL (a superuser's URL) names, and returns adminURL naming it
// instead, and a drop that drops it. It is created from template0, in
// UTF8 with the C collation: the same empty database on any server,
// whatever its defaults.
func CreateDatabase(ctx context.Context, adminURL, name string) (dbURL string, drop func(context.Context) error, err error) {
	u, err := url.Parse(adminURL)
	if err != nil {
		// The URL may hold a password: don't quote the parser's error.
		return "", nil, errors.New("the admin URL is not a URL")
	}
	if err := execSQL(ctx, adminURL, `CREATE DATABASE "`+name+`" TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'`); err != nil {
		return "", nil, err
	}
	drop = func(ctx context.Context) error {
		return execSQL(ctx, adminURL, `DROP DATABASE IF EXISTS "`+name+`" WITH (FORCE)`)
	}
	u.Path = "/" + name
	return u.String(), drop, nil
}

// execSQL runs one statement on the server dbURL names, on a connection of
// its own.
func execSQL(ctx context.Context, dbURL, stmt string) error {
	db, err := sql.Open("pgx", dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, stmt)
	return err
}

// postgresUser is the user PostgreSQL and PgBouncer run as when this
// process runs as root (both refuse to run as root), or nil otherwise.
func postgresUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs a postgres user to run the server as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// freePort is a loopback TCP port nothing listens on at the moment.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		if f := strings.Fields(string(stat[i+1:])); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}
