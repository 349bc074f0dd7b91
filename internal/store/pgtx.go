package store

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// How the store's PostgreSQL transactions begin: in one round trip that
// reads the server's clock too, and, through a pooler, sets the statement
// timeout. The store's clock for PostgreSQL is the server's now(), the
// time the transaction began (clock.go); read with a SELECT of its own it
// cost a round trip per transaction, and through a pooler set_config
// another: four of a payment's ten. Sent with BEGIN as one simple query,
// "BEGIN; SELECT …", they cost none: the SELECT runs in the transaction
// BEGIN opened, so its now() is the one a SELECT on its own would read,
// and set_config(…, true) holds for the rest of that transaction, as
// before. pgx's database/sql driver begins with BEGIN alone, so the pool's
// connections are pgx's (pgConn) with a BeginTx of the store's own for the
// store's transactions, which commit and roll back as pgx's do.
//
// The clock comes back as microseconds since the epoch, not as a
// timestamptz: a simple query's results are text, and a timestamp's text
// follows the session's DateStyle, which the store does not set.

// pgTx is one of the store's PostgreSQL transactions as its connection
// runs it: what begins it, the server's clock it read, and the WARNING its
// COMMIT got, if any. It travels in the context the transaction begins
// with (pgTxKey), which pgx's database/sql driver also commits with.
type pgTx struct {
	// begin is the query that begins the transaction (beginQuery).
	begin string
	// now is the server's clock as the transaction began, read by begin;
	// zero until it has run.
	now time.Time
	// warning is the message of the WARNING the COMMIT got, if any. It is
	// written and read only on the goroutine that sends the COMMIT: pgx
	// calls the tracer and OnNotice there (commit.go).
	warning string
}

// pgTxKey is the context key of a transaction's pgTx.
type pgTxKey struct{}

// beginQuery begins a transaction and reads the server's clock: a
// transaction's now(), in microseconds since the epoch. Through a pooler
// in transaction mode it sets the statement timeout for the transaction
// too, which a direct connection has as a startup parameter (openPostgres);
// pooled, as detectPooler found, says which.
func beginQuery(pooled bool) string {
	q := `BEGIN; SELECT (extract(epoch FROM now()) * 1000000)::int8`
	if pooled {
		q += fmt.Sprintf(`, set_config('statement_timeout', '%d', true)`, statementTimeout.Milliseconds())
	}
	return q
}

// pgConnector makes the pool's connections pgConns.
type pgConnector struct{ driver.Connector }

func (c pgConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	sc, ok := dc.(*stdlib.Conn)
	if !ok {
		dc.Close()
		return nil, fmt.Errorf("pgx's connector made a %T, not its *stdlib.Conn", dc)
	}
	return &pgConn{sc}, nil
}

// pgConn is pgx's database/sql connection, but that a transaction begun
// with a pgTx in its context begins with the pgTx's query (beginQuery),
// whose clock it keeps in the pgTx.
type pgConn struct{ *stdlib.Conn }

// Unwrap is pgx's connection, for detectPooler.
func (c *pgConn) Unwrap() driver.Conn { return c.Conn }

func (c *pgConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	t, ok := ctx.Value(pgTxKey{}).(*pgTx)
	if !ok || opts != (driver.TxOptions{}) {
		return c.Conn.BeginTx(ctx, opts)
	}
	conn := c.Conn.Conn()
	if conn.IsClosed() {
		return nil, driver.ErrBadConn
	}
	now, err := begin(ctx, conn, t.begin)
	if err != nil {
		if conn.PgConn().TxStatus() != 'I' {
			// Begun, and then failed: close it rather than leave a
			// transaction open on it.
			closeNow(conn)
		}
		return nil, err
	}
	t.now = now
	return pgTxn{conn: conn, ctx: ctx}, nil
}

// begin runs query, beginQuery, on conn, and returns the clock it read.
func begin(ctx context.Context, conn *pgx.Conn, query string) (time.Time, error) {
	results, err := conn.PgConn().Exec(ctx, query).ReadAll()
	if err != nil {
		if pgconn.SafeToRetry(err) {
			// Nothing was sent: database/sql tries another connection.
			return time.Time{}, driver.ErrBadConn
		}
		return time.Time{}, err
	}
	if len(results) != 2 || len(results[1].Rows) != 1 || len(results[1].Rows[0]) == 0 {
		return time.Time{}, errors.New("begin: the server's clock did not come back")
	}
	us, err := strconv.ParseInt(string(results[1].Rows[0][0]), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("begin: the server's clock: %w", err)
	}
	return time.UnixMicro(us).UTC(), nil
}

// pgTxn is a transaction pgConn began: it commits and rolls back as pgx's
// (its dbTx) does, with the context it began with, which carries its pgTx
// for the COMMIT's watch (commit.go).
type pgTxn struct {
	conn *pgx.Conn
	ctx  context.Context
}

func (t pgTxn) Commit() error {
	tag, err := t.conn.Exec(t.ctx, "commit")
	if err != nil {
		if t.conn.PgConn().TxStatus() != 'I' {
			closeNow(t.conn)
		}
		return err
	}
	if tag.String() == "ROLLBACK" {
		// The transaction had failed: the server rolled it back.
		return pgx.ErrTxCommitRollback
	}
	return nil
}

func (t pgTxn) Rollback() error {
	if _, err := t.conn.Exec(t.ctx, "rollback"); err != nil {
		// A connection whose rollback failed is in no known state.
		closeNow(t.conn)
		return err
	}
	return nil
}

// closeNow closes conn at once, without waiting to tell the server.
func closeNow(conn *pgx.Conn) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	conn.Close(ctx)
}
