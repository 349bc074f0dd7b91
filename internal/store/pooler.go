package store

import (
	"context"
	"database/sql/driver"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// execModeParam is the URL query parameter in which pgx takes its query
// execution mode; a URL that sets it overrides the store's choice.
const execModeParam = "default_query_exec_mode"

// pgMode is how the pool's new PostgreSQL connections send queries.
//
// A connection straight to PostgreSQL (or through a proxy that keeps one
// server session per connection, as HAProxy does) may keep named prepared
// statements: pgx caches one per query (QueryExecModeCacheStatement), and
// the server parses and plans it once, not on every call. Through a pooler
// in transaction mode such a statement is left in a server session that
// the connection's next transaction may not get, and that another client's
// may: PgBouncer 1.18 then fails with 26000 or 42P05. There every query
// runs as the unnamed statement (QueryExecModeExec). Measured on
// PostgreSQL 15 (docs/postgresql.md), the unnamed statements cost a lookup
// about 40 µs more of paymentsd's CPU, and a payment about 80 µs at c=32.
type pgMode struct {
	v atomic.Int64 // pgx.QueryExecMode for connections opened from now on
	// pooled: detectPooler found a pooler; direct: it found none.
	pooled, direct atomic.Bool
	// explicit: the URL sets default_query_exec_mode (urlMode), which is
	// used as it is.
	explicit bool
	urlMode  pgx.QueryExecMode
}

// The queries that begin the store's transactions (pgtx.go).
var beginDirect, beginPooled = beginQuery(false), beginQuery(true)

// begin is the query that begins the store's transactions: through a
// pooler, or before detectPooler has found none, it sets the statement
// timeout too.
func (m *pgMode) begin() string {
	if m.direct.Load() {
		return beginDirect
	}
	return beginPooled
}

// detectPooler finds out whether the pool's connections reach PostgreSQL
// through a pooler and sets pgMode accordingly, before any query but its
// own has run: a pooler answers a connection with a cancel key of its own
// (it must route cancel requests itself), whose process ID is not the one
// of the server session that runs its queries. It refuses a URL whose
// default_query_exec_mode keeps statements in a server session, should a
// pooler be found, and logs what it found.
func (s *Store) detectPooler(ctx context.Context, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	conn, err := s.w.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var keyPID uint32
	if err := conn.Raw(func(dc any) error {
		// A wrapped driver connection (the tests' failure seam) says
		// what it wraps.
		for {
			u, ok := dc.(interface{ Unwrap() driver.Conn })
			if !ok {
				break
			}
			dc = u.Unwrap()
		}
		pc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("the PostgreSQL connection is a %T, not pgx's", dc)
		}
		keyPID = pc.Conn().PgConn().PID()
		return nil
	}); err != nil {
		return err
	}
	var backendPID int64
	if err := conn.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&backendPID); err != nil {
		return fmt.Errorf("ask the server for its process ID: %w", err)
	}
	// This connection was opened before the mode was chosen: drop it.
	conn.Raw(func(any) error { return driver.ErrBadConn })

	pooled := int64(keyPID) != backendPID
	mode, how := pgx.QueryExecModeCacheStatement, "prepared statements, cached per connection"
	if pooled {
		mode, how = pgx.QueryExecModeExec, "unnamed statements, nothing kept in a server session"
	}
	if s.pg.explicit {
		mode, how = s.pg.urlMode, "as the URL's "+execModeParam+" says"
		if pooled && (mode == pgx.QueryExecModeCacheStatement || mode == pgx.QueryExecModeDescribeExec) {
			return fmt.Errorf("the database URL sets %s=%v, but paymentsd reaches PostgreSQL through a connection pooler "+
				"(the server's process ID is not the one the connection was given), where that mode's prepared statements fail: "+
				"remove %s from the URL (paymentsd then uses exec through a pooler), or set it to exec", execModeParam, modeName(mode), execModeParam)
		}
	}
	s.pg.v.Store(int64(mode))
	s.pg.pooled.Store(pooled)
	s.pg.direct.Store(!pooled)
	// Every connection opened from now on gets the mode, and a direct one
	// its statement timeout as a startup parameter, on which transact
	// counts: none opened before may stay in the pool. (Open's ping opened
	// one, which this function took and dropped; no other is in use yet.)
	conns := s.w.Stats().MaxOpenConnections
	s.w.SetMaxIdleConns(0)
	s.w.SetMaxIdleConns(conns)
	if !pooled {
		logger.Info("PostgreSQL is reached directly (or through a proxy that keeps a server session per connection)",
			"queries", how, "query_exec_mode", modeName(mode), "statement_timeout", statementTimeout.String())
		return nil
	}
	var timeout string
	if err := s.w.QueryRowContext(ctx, `SHOW statement_timeout`).Scan(&timeout); err != nil {
		return fmt.Errorf("read statement_timeout: %w", err)
	}
	logger.Info("PostgreSQL is reached through a connection pooler",
		"queries", how, "query_exec_mode", modeName(mode), "statement_timeout_in_transactions", statementTimeout.String(),
		"statement_timeout_otherwise", timeout)
	if timeout == "0" {
		logger.Warn("through a connection pooler, paymentsd can bound only its transactions' statements (SET LOCAL); "+
			"its single-statement reads are bounded by their callers' deadlines, which a server does not see: "+
			"to bound them on the server too, set a statement timeout on paymentsd's database role, as its owner or a superuser: "+
			"ALTER ROLE <paymentsd's user> SET statement_timeout = '30s'",
			"statement_timeout", timeout)
	}
	return nil
}

// modeName is mode as default_query_exec_mode names it.
func modeName(mode pgx.QueryExecMode) string {
	switch mode {
	case pgx.QueryExecModeCacheStatement:
		return "cache_statement"
	case pgx.QueryExecModeCacheDescribe:
		return "cache_describe"
	case pgx.QueryExecModeDescribeExec:
		return "describe_exec"
	case pgx.QueryExecModeExec:
		return "exec"
	case pgx.QueryExecModeSimpleProtocol:
		return "simple_protocol"
	}
	return mode.String()
}
