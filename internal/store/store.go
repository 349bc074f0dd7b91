// Package store is paymentsd's durable state: one record per idempotency
// key (the payment's request, state, provider reply and lease) and the
// webhook inbox. Its records, states and transitions live here; the two
// backends, SQLite (the embedded default, pure Go) and PostgreSQL (for
// replicas sharing one database), sit beneath it behind one contract that
// one conformance suite checks.
//
// A record's life is one state machine, package internal/record: every
// change to a record is record.Step's, and the store runs the one named,
// guarded statement Step's effect names (statements.go). The store never
// decides, and never holds a transaction open across a call to the
// provider: Begin commits the record (and its lease) before anything is
// sent, and Finish commits the outcome after the provider answers.
package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"example.com/paymentsd/internal/record"
)

// Errors. Every error a Store returns wraps one of these or is a failure of
// the database itself; none contains a database password.
var (
	// ErrNotFound: no record for the key.
	ErrNotFound = errors.New("no record for that idempotency key")
	// ErrWrongEnvironment: the database is stamped with the other provider
	// environment.
	ErrWrongEnvironment = errors.New("database belongs to another provider environment")
	// ErrKeyNotStorable: the key can't be stored exactly by this backend
	// (for example a NUL byte in PostgreSQL).
	ErrKeyNotStorable = errors.New("idempotency key can't be stored exactly")
	// ErrCommitUnknown: the write's transaction was sent to be committed
	// and the database's answer was an error, never came, had not come
	// when the caller's context ended (the store waits on for it), or came
	// with a warning that its wait for a synchronous standby was
	// cancelled; so it may or may not have been written, durably. Any
	// other error of a write means nothing was written.
	ErrCommitUnknown = errors.New("the commit's outcome is unknown")
	// ErrConnectTimeout: Open got no connection to the database within
	// Options.ConnectTimeout.
	ErrConnectTimeout = errors.New("the database did not answer within the connect timeout")
	// ErrMigrateTimeout: Open's migrations (or the wait for another
	// replica's) did not finish within Options.MigrateTimeout. Nothing of
	// them was applied, unless the error is ErrCommitUnknown too: their
	// COMMIT was sent and waits (for a synchronous standby), and they are
	// applied if it lands.
	ErrMigrateTimeout = errors.New("the migrations did not finish within the migrate timeout")
	// ErrInboxFull: AppendEvent refused the event, writing nothing: the
	// inbox holds its quota (Options.InboxQuota), or the SQLite volume's
	// free space is down to the reserve kept for payments
	// (Options.InboxReserve).
	ErrInboxFull = errors.New("the webhook inbox is full")
	// ErrClosed: the store was closed; nothing was written.
	ErrClosed = errors.New("the record store is closed")
)

// Stats are gauges for metrics.
type Stats struct {
	// ByState counts records in each state.
	ByState map[record.State]int64
	// Unsettled counts OutcomeUnknown records past their settlement window:
	// those SettleDue has given up on (GaveUp). Stats takes no clock, so a
	// record whose window closed since SettleDue last ran is counted once
	// it runs.
	Unsettled int64
	// Events counts stored webhook events.
	Events int64
}

// Options tunes Open. The zero value is sensible.
type Options struct {
	// BusyTimeout is how long a SQLite connection waits for another
	// process's write lock before failing (default 10s).
	BusyTimeout time.Duration
	// MaxConns caps the PostgreSQL connection pool, or SQLite's reader
	// pool (default 10 and 4). SQLite always writes through one connection.
	MaxConns int
	// Retention, if set, is how long events are kept: an event is marked a
	// duplicate only of one received within it, never of one about to be
	// deleted.
	Retention time.Duration
	// ConnectTimeout bounds Open's first connection (default 15s), and
	// every later PostgreSQL connection whose URL sets no connect_timeout:
	// a database that accepts connections and never answers would
	// otherwise hold them forever.
	ConnectTimeout time.Duration
	// MigrateTimeout bounds Open's migrations, including the wait for
	// another replica's (default 1m).
	MigrateTimeout time.Duration
	// Logger, if set, reports the migrations Open applies.
	Logger *slog.Logger
	// Now is the clock the store decides by. Leave it nil: SQLite then
	// uses time.Now, and PostgreSQL its server's clock (see ClockOffset),
	// so that replicas whose clocks disagree never both hold a key; and
	// the writes' health (WriteHealthyFor) and the heartbeat's schedule
	// go by time.Now. Tests set it to move time: then it decides all of
	// them.
	Now func() time.Time
	// InboxQuota, if set, bounds the bytes the webhook inbox keeps (the
	// events' Size in all): AppendEvent refuses an event that would pass
	// it (ErrInboxFull).
	InboxQuota int64
	// InboxReserve is the free space AppendEvent leaves on an SQLite
	// database's volume for payment records (ErrInboxFull past it); 0
	// means DefaultInboxReserve. PostgreSQL's volume can't be seen from
	// here: InboxQuota is its bound.
	InboxReserve int64
	// TakeoverGrace is how long this store's writes must have been
	// committing without a failure or a gap before it lets a claim take
	// over a record whose holder's lease expired (see WriteHealthyFor):
	// after an outage, the holder's outcome, retried by its outbox, lands
	// first. 0 means DefaultTakeoverGrace; a negative value turns the
	// check off, for tests that move Now by hours.
	TakeoverGrace time.Duration
	// WrapConnector, if set, wraps the database driver's connector: a
	// seam for tests, which inject failures beneath the store's own code
	// (storetest.Faults). Leave it nil.
	WrapConnector func(driver.Connector) driver.Connector
}

// DefaultInboxReserve is the free space the webhook inbox leaves on an
// SQLite volume by default: room for tens of thousands of payment records.
const DefaultInboxReserve = 64 << 20

func (o Options) connectTimeout() time.Duration {
	if o.ConnectTimeout > 0 {
		return o.ConnectTimeout
	}
	return 15 * time.Second
}

func (o Options) migrateTimeout() time.Duration {
	if o.MigrateTimeout > 0 {
		return o.MigrateTimeout
	}
	return time.Minute
}

func (o Options) busyTimeout() time.Duration {
	if o.BusyTimeout > 0 {
		return o.BusyTimeout
	}
	return 10 * time.Second
}

func (o Options) sqliteReaders() int {
	if o.MaxConns > 0 {
		return o.MaxConns
	}
	return 4
}

func (o Options) postgresConns() int {
	if o.MaxConns > 0 {
		return o.MaxConns
	}
	return 10
}

// Store is an open record store. It is safe for concurrent use.
type Store struct {
	d dialect
	// w takes every write (for SQLite, one connection); r serves reads
	// (for SQLite on a file, a pool of read-only connections; otherwise w).
	w, r *sql.DB
	// secrets are the forms of the URL's password that errors must not
	// carry.
	secrets []string
	// retention is Options.Retention.
	retention time.Duration
	// clock is the store's clock, or nil for the database server's; now
	// is the clock of this process the writes' health goes by.
	clock func() time.Time
	now   func() time.Time
	// inboxQuota and inboxReserve are Options'; sqlitePath is the SQLite
	// file, "" in memory or with PostgreSQL.
	inboxQuota, inboxReserve int64
	sqlitePath               string
	// appends lets one AppendEvent at a time at the writer, so that a
	// flood of deliveries queues here rather than ahead of payments.
	appends chan struct{}
	// batch group-commits Begins and Finishes.
	batch *batcher
	// later counts FloorExecLater calls not yet done, for Close.
	later sync.WaitGroup
	// commits counts committed write transactions.
	commits atomic.Uint64
	// unanswered counts the COMMITs whose callers left before their
	// answer came (commit.go).
	unanswered unansweredCommits
	// health tracks the writes' run of commits, and grace is
	// Options.TakeoverGrace; stopHeartbeat ends the heartbeat, and
	// heartbeatDone is closed once it has.
	health        writeHealth
	grace         time.Duration
	stopHeartbeat chan struct{}
	stopOnce      sync.Once
	heartbeatDone chan struct{}
	// pg is how PostgreSQL connections send queries; nil for SQLite.
	pg *pgMode
	// cache holds prepared statements by database and query (SQLite
	// only).
	cache sync.Map // stmtKey → *sql.Stmt
	// stmts are the store's named statements.
	stmts statements
}

type stmtKey struct {
	db    *sql.DB
	query string
}

// stmt is a query ready to run with its arguments: a prepared statement in
// SQLite, or the query itself in PostgreSQL (unprepared).
type stmt interface {
	ExecContext(ctx context.Context, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, args ...any) *sql.Row
}

// querier is what runs a query: a *sql.DB or a *sql.Tx.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// unprepared runs query on q as it is.
type unprepared struct {
	q     querier
	query string
}

func (u unprepared) ExecContext(ctx context.Context, args ...any) (sql.Result, error) {
	return u.q.ExecContext(ctx, u.query, args...)
}

func (u unprepared) QueryContext(ctx context.Context, args ...any) (*sql.Rows, error) {
	return u.q.QueryContext(ctx, u.query, args...)
}

func (u unprepared) QueryRowContext(ctx context.Context, args ...any) *sql.Row {
	return u.q.QueryRowContext(ctx, u.query, args...)
}

// prepared returns query prepared on db, preparing it on first use.
// database/sql prepares it again on each connection that runs it.
//
// In PostgreSQL nothing is prepared: a prepared statement lives in one
// server session, and behind a pooler in transaction mode (PgBouncer) the
// next transaction may run in another session, where it does not exist
// (26000) or another client's of the same name does (42P05). pgx runs
// each query as an unnamed statement in one round trip (see
// openPostgres).
func (s *Store) prepared(ctx context.Context, db *sql.DB, query string) (stmt, error) {
	if !s.d.prepare {
		return unprepared{db, query}, nil
	}
	k := stmtKey{db, query}
	if st, ok := s.cache.Load(k); ok {
		return st.(*sql.Stmt), nil
	}
	st, err := db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if prev, loaded := s.cache.LoadOrStore(k, st); loaded {
		st.Close()
		return prev.(*sql.Stmt), nil
	}
	return st, nil
}

// txStmt returns query prepared for tx (on the writer). The writer's hot
// queries are prepared at Open (writerQueries), since a transaction holds
// SQLite's one writer connection and preparing on the pool would wait for
// it; any other is prepared in tx alone. In PostgreSQL nothing is
// prepared (see prepared).
func (s *Store) txStmt(ctx context.Context, tx *sql.Tx, query string) (stmt, error) {
	if !s.d.prepare {
		return unprepared{tx, query}, nil
	}
	if st, ok := s.cache.Load(stmtKey{s.w, query}); ok {
		return tx.StmtContext(ctx, st.(*sql.Stmt)), nil
	}
	return tx.PrepareContext(ctx, query)
}

// Commits is the number of write transactions the store has committed.
// With group commit, one may hold many Begins and Finishes.
func (s *Store) Commits() uint64 { return s.commits.Load() }

// Open opens the store that url names, runs the embedded migrations (safe
// when several replicas start at once), and stamps the database with env on
// first use, refusing (ErrWrongEnvironment) a database stamped with another.
// url is "sqlite:PATH" (PATH may be ":memory:"), or "postgres://…" /
// "postgresql://…". Errors never contain the URL's password.
func Open(ctx context.Context, url, env string, opts Options) (*Store, error) {
	sec := secrets(url)
	s, err := open(ctx, url, env, opts, sec)
	if err != nil {
		return nil, redact(fmt.Errorf("open store: %w", err), sec)
	}
	return s, nil
}

func open(ctx context.Context, url, env string, opts Options, sec []string) (*Store, error) {
	if env == "" {
		return nil, errors.New("empty provider environment")
	}
	if err := CheckURL(url); err != nil {
		return nil, err
	}
	s := &Store{secrets: sec, retention: opts.Retention, clock: opts.Now, now: opts.Now, grace: opts.TakeoverGrace,
		inboxQuota: opts.InboxQuota, inboxReserve: opts.InboxReserve, appends: make(chan struct{}, 1)}
	if s.now == nil {
		s.now = time.Now
	}
	if s.inboxReserve <= 0 {
		s.inboxReserve = DefaultInboxReserve
	}
	if s.grace == 0 {
		s.grace = DefaultTakeoverGrace
	}
	where := "postgres"
	if path, ok := strings.CutPrefix(url, "sqlite:"); ok {
		w, r, err := openSQLite(path, opts)
		if err != nil {
			return nil, err
		}
		s.d, s.w, s.r = sqliteDialect, w, r
		if s.clock == nil {
			s.clock = time.Now
		}
		if path != ":memory:" {
			s.sqlitePath = path
		}
		// A SQLite path holds no password; an error that names it says
		// which file could not be opened.
		where = "sqlite file " + path
	} else {
		db, mode, err := openPostgres(url, opts)
		if err != nil {
			return nil, fmt.Errorf("PostgreSQL URL: %w", err)
		}
		s.d, s.w, s.r, s.pg = postgresDialect, db, db, mode
	}
	s.stmts = s.buildStatements()
	s.batch = newBatcher(s)

	cctx, cancel := context.WithTimeout(ctx, opts.connectTimeout())
	err := s.w.PingContext(cctx)
	// A new connection to a SQLite file runs its pragmas, and the one
	// that puts a new file in WAL mode may find another process (a
	// replica starting beside this one) holding a lock, and fail at once
	// rather than wait out busy_timeout: try again until the connect
	// timeout.
	for delay := 5 * time.Millisecond; s.pg == nil && sqliteBusy(err); delay = min(2*delay, 200*time.Millisecond) {
		t := time.NewTimer(delay)
		select {
		case <-cctx.Done():
		case <-t.C:
			err = s.w.PingContext(cctx)
			continue
		}
		t.Stop()
		break
	}
	timedOut := cctx.Err() != nil && ctx.Err() == nil
	cancel()
	if err != nil {
		s.Close()
		if timedOut {
			return nil, fmt.Errorf("connect to %s: %w (%v): %w", where, ErrConnectTimeout, opts.connectTimeout(), err)
		}
		return nil, fmt.Errorf("connect to %s: %w", where, err)
	}

	mctx, cancel := context.WithTimeout(ctx, opts.migrateTimeout())
	defer cancel()
	if s.pg != nil {
		err = s.detectPooler(mctx, opts.Logger)
	}
	if err == nil {
		err = s.migrate(mctx, env, opts.Logger)
	}
	for _, q := range s.writerQueries() {
		if err != nil {
			break
		}
		if _, err = s.prepared(mctx, s.w, q); err != nil {
			err = fmt.Errorf("prepare: %w", err)
		}
	}
	if err != nil {
		s.Close()
		if mctx.Err() != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("%w (%v): %w", ErrMigrateTimeout, opts.migrateTimeout(), err)
		}
		return nil, err
	}
	s.stopHeartbeat, s.heartbeatDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(s.heartbeatDone)
		s.heartbeat(s.stopHeartbeat)
	}()
	return s, nil
}

// Close waits for every FloorExecLater, stops the heartbeat, then closes
// the database.
func (s *Store) Close() error {
	s.later.Wait()
	if s.stopHeartbeat != nil {
		s.stopOnce.Do(func() { close(s.stopHeartbeat) })
		<-s.heartbeatDone
	}
	if s.batch != nil {
		s.batch.close()
	}
	s.cache.Range(func(_, st any) bool {
		st.(*sql.Stmt).Close()
		return true
	})
	err := s.w.Close()
	if s.r != s.w {
		err = errors.Join(err, s.r.Close())
	}
	return s.wrap(err)
}

// Backend is "sqlite" or "postgres".
func (s *Store) Backend() string { return s.d.name }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	return s.wrap(s.w.PingContext(ctx))
}

// wrap keeps the password out of errors from the database.
func (s *Store) wrap(err error) error { return redact(err, s.secrets) }

// Stats counts records by state, unsettled records past their window, and
// stored events.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	st := Stats{ByState: map[record.State]int64{
		record.InProgress: 0, record.Succeeded: 0, record.NotCreated: 0, record.OutcomeUnknown: 0,
	}}
	err := func() error {
		rows, err := s.r.QueryContext(ctx, `SELECT state, COUNT(*) FROM records WHERE tombstoned_at IS NULL GROUP BY state`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var state int
			var n int64
			if err := rows.Scan(&state, &n); err != nil {
				return err
			}
			st.ByState[record.State(state)] = n
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if err := s.r.QueryRowContext(ctx, s.d.q(`SELECT COUNT(*) FROM records WHERE state = $1 AND gave_up = $2 AND tombstoned_at IS NULL`),
			int(record.OutcomeUnknown), true).Scan(&st.Unsettled); err != nil {
			return err
		}
		return s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM events`).Scan(&st.Events)
	}()
	if err != nil {
		return Stats{}, s.wrap(fmt.Errorf("stats: %w", err))
	}
	return st, nil
}
