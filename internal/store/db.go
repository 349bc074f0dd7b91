package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// openSQLite opens a writer pool of one connection, through which every
// write is serialised, with BEGIN IMMEDIATE so that other processes on the
// same file wait (busy_timeout) rather than fail midway; and a reader pool
// for the queries that only read, which WAL lets run beside the writer.
// An in-memory database lives in one connection, so it gets one pool of one.
func openSQLite(path string, opts Options) (w, r *sql.DB, err error) {
	if path == "" {
		return nil, nil, errors.New(`empty SQLite path; use "sqlite:PATH" or "sqlite::memory:"`)
	}
	if strings.ContainsAny(path, "?#") {
		return nil, nil, errors.New("SQLite path contains ? or #: want a file path alone")
	}
	busy := fmt.Sprintf("busy_timeout(%d)", opts.busyTimeout().Milliseconds())
	if path == ":memory:" {
		db, err := opts.open(SQLiteDriver, SQLiteDSN(path, true, busy, "foreign_keys(1)"))
		if err != nil {
			return nil, nil, err
		}
		db.SetMaxOpenConns(1)
		db.SetMaxIdleConns(1)
		db.SetConnMaxLifetime(0)
		db.SetConnMaxIdleTime(0)
		return db, db, nil
	}
	// synchronous(FULL) in WAL mode fsyncs the log on every commit: a
	// record is on disk when Begin returns.
	common := []string{busy, "journal_mode(WAL)", "synchronous(FULL)", "foreign_keys(1)"}
	w, err = opts.open(SQLiteDriver, SQLiteDSN(path, true, common...))
	if err != nil {
		return nil, nil, err
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	r, err = opts.open(SQLiteDriver, SQLiteDSN(path, false, append([]string{"query_only(1)"}, common...)...))
	if err != nil {
		w.Close()
		return nil, nil, err
	}
	r.SetMaxOpenConns(opts.sqliteReaders())
	r.SetMaxIdleConns(opts.sqliteReaders())
	return w, r, nil
}

// open is sql.Open, through Options.WrapConnector when it is set.
func (o Options) open(driverName, dsn string) (*sql.DB, error) {
	if o.WrapConnector == nil {
		return sql.Open(driverName, dsn)
	}
	db, err := sql.Open(driverName, "")
	if err != nil {
		return nil, err
	}
	drv := db.Driver()
	db.Close()
	var c driver.Connector = dsnConnector{dsn: dsn, drv: drv}
	if dc, ok := drv.(driver.DriverContext); ok {
		if c, err = dc.OpenConnector(dsn); err != nil {
			return nil, err
		}
	}
	return sql.OpenDB(o.WrapConnector(c)), nil
}

// dsnConnector is the connector database/sql makes for a driver without
// one of its own.
type dsnConnector struct {
	dsn string
	drv driver.Driver
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.drv.Open(c.dsn) }
func (c dsnConnector) Driver() driver.Driver                        { return c.drv }

// sqliteParams joins a SQLite DSN's parameters: _txlock=immediate if
// immediate, then each pragma as param writes it.
func sqliteParams(immediate bool, pragmas []string, param func(string) string) string {
	var ps []string
	if immediate {
		ps = append(ps, "_txlock=immediate")
	}
	for _, p := range pragmas {
		ps = append(ps, param(p))
	}
	return strings.Join(ps, "&")
}

// statementTimeout bounds every statement of the store's PostgreSQL
// transactions but migrations'.
const statementTimeout = 30 * time.Second

// readOnlySQLTransaction is PostgreSQL's SQLSTATE for a write refused by a
// server that takes none: a standby, or a primary being demoted.
const readOnlySQLTransaction = "25006"

// openPostgres opens a database/sql pool over pgx.
//
// The pool keeps no state in a server session from one transaction to the
// next that a pooler in transaction mode (PgBouncer's pool_mode =
// transaction), which lends each transaction whichever server session is
// free, would lose or hand to another client:
//   - no startup parameters (PgBouncer refuses them): statementTimeout is
//     a startup parameter only once detectPooler has found the connections
//     direct, and otherwise is set by the query that begins each
//     transaction (beginQuery);
//   - no named prepared statements through a pooler: the store prepares
//     nothing itself (Store.prepared), and pgx runs every query as the
//     unnamed statement (QueryExecModeExec) until detectPooler has found
//     the connections direct, when it caches a named statement per query
//     and connection instead (QueryExecModeCacheStatement), which the
//     server plans once; see pgMode;
//   - no session SET, advisory lock, temporary table or LISTEN: migrate
//     takes a transaction's advisory lock.
//
// A connection whose server turned out to take no writes (25006: the
// PostgreSQL it reached is, or has become, a standby) is closed rather than
// kept in the pool, so that the next one is opened afresh, and a
// multi-host URL with target_session_attrs=read-write (or a proxy that
// follows the primary) finds the new primary.
func openPostgres(rawURL string, opts Options) (*sql.DB, *pgMode, error) {
	cfg, err := pgx.ParseConfig(rawURL)
	if err != nil {
		return nil, nil, err
	}
	mode := &pgMode{explicit: namesParam(rawURL, execModeParam), urlMode: cfg.DefaultQueryExecMode}
	mode.v.Store(int64(pgx.QueryExecModeExec))
	cfg.OnPgError = func(_ *pgconn.PgConn, e *pgconn.PgError) bool {
		return !strings.EqualFold(e.Severity, "FATAL") && e.Code != readOnlySQLTransaction
	}
	// A COMMIT answered with a WARNING is not reported as written
	// (commit.go).
	cfg.Tracer = commitTracer{}
	cfg.OnNotice = onNotice
	if cfg.ConnectTimeout == 0 {
		// The URL sets no connect_timeout: without one, a connection the
		// pool opens later to a database that never answers would wait
		// for as long as its caller's context allows, or forever.
		cfg.ConnectTimeout = opts.connectTimeout()
	}
	beforeConnect := stdlib.OptionBeforeConnect(func(_ context.Context, c *pgx.ConnConfig) error {
		if !mode.explicit {
			c.DefaultQueryExecMode = pgx.QueryExecMode(mode.v.Load())
		}
		if mode.direct.Load() {
			// Straight to PostgreSQL, every statement is bounded, reads
			// outside a transaction too; a pooler would refuse this.
			c.RuntimeParams = maps.Clone(c.RuntimeParams)
			c.RuntimeParams["statement_timeout"] = strconv.FormatInt(statementTimeout.Milliseconds(), 10)
		}
		return nil
	})
	var c driver.Connector = pgConnector{stdlib.GetConnector(*cfg, beforeConnect)}
	if opts.WrapConnector != nil {
		c = opts.WrapConnector(c)
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(opts.postgresConns())
	db.SetMaxIdleConns(opts.postgresConns())
	db.SetConnMaxIdleTime(5 * time.Minute)
	return db, mode, nil
}

// namesParam reports whether the PostgreSQL URL's query sets the parameter
// name.
func namesParam(rawURL, name string) bool {
	u, ok := splitPostgresURL(rawURL)
	if !ok {
		return false
	}
	for _, p := range u.params() {
		if k, _ := url.QueryUnescape(p[0]); k == name {
			return true
		}
	}
	return false
}
