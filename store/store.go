// Package store is paymentsd's durable state: one record per idempotency
// key (the payment's request, state, provider reply and lease) and the
// webhook inbox. Its records, states and transitions live here; the two
// backends, SQLite (the embedded default, pure Go) and PostgreSQL (for
// replicas sharing one database), sit beneath it behind one contract that
// one conformance suite checks.
//
// The store never holds a transaction open across a call to the provider:
// Begin commits the record (and its lease) before anything is sent, and
// Finish commits the outcome after the provider answers.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// State is what a record says about a payment's money.
type State int

const (
	// StateInProgress: a request for the key is being sent now, by the
	// holder of the record's lease. A payment may exist.
	StateInProgress State = 1
	// StateSucceeded: the provider answered 2xx; Reply holds its body.
	StateSucceeded State = 2
	// StateNotCreated: no attempt for the key can have created a payment.
	StateNotCreated State = 3
	// StateOutcomeUnknown: some attempt may have created a payment and no
	// 2xx has confirmed it. Settlement re-sends the body until SettleBy.
	StateOutcomeUnknown State = 4
)

func (s State) String() string {
	switch s {
	case StateInProgress:
		return "in_progress"
	case StateSucceeded:
		return "succeeded"
	case StateNotCreated:
		return "not_created"
	case StateOutcomeUnknown:
		return "outcome_unknown"
	}
	return "unspecified"
}

// Errors. Every error a Store returns wraps one of these or is a failure of
// the database itself; none contains a database password.
var (
	// ErrNotFound: no record for the key.
	ErrNotFound = errors.New("no record for that idempotency key")
	// ErrLeaseLost: the caller of Finish no longer holds the record's lease
	// (it expired and another owner took the record over). Nothing was
	// written.
	ErrLeaseLost = errors.New("lease on the record was lost")
	// ErrWrongEnvironment: the database is stamped with the other provider
	// environment.
	ErrWrongEnvironment = errors.New("database belongs to another provider environment")
	// ErrKeyNotStorable: the key can't be stored exactly by this backend
	// (for example a NUL byte in PostgreSQL).
	ErrKeyNotStorable = errors.New("idempotency key can't be stored exactly")
	// ErrCommitUnknown: the write's transaction was sent to be committed
	// and the database's answer was an error or never came, so it may or
	// may not have been written. Any other error of a write means nothing
	// was written.
	ErrCommitUnknown = errors.New("the commit's outcome is unknown")
)

// Record is the durable record of one idempotency key.
type Record struct {
	Key string
	// Body is the exact provider request body (never the API key), and
	// BodySHA256 its hash, which decides whether a later call is the same
	// request.
	Body       []byte
	BodySHA256 [32]byte
	// Currency and Amount are the recorded request, for lookups.
	Currency string
	Amount   int64

	State State
	// Attempts counts requests sent to the provider for this key, by every
	// call and by settlement.
	Attempts int
	// ProviderStatus is the provider's last HTTP status (0: none), and
	// Reply its last reply body exactly (a 2xx body when Succeeded, else
	// the error body, or nil).
	ProviderStatus int
	Reply          []byte
	// LastError says why the last attempt failed ("" after a success), and
	// Code is the status code its call was answered with. Code is the
	// service's vocabulary; the store keeps it opaque.
	LastError string
	Code      int32

	// RequestID, TraceID and Caller identify the call that created the
	// record.
	RequestID string
	TraceID   string
	Caller    string

	CreatedAt time.Time
	UpdatedAt time.Time
	// SettleBy ends the settlement window: no request for the key is sent
	// after it. It is set when the first attempt that may create a payment
	// begins (a new record, or one that was NotCreated).
	SettleBy time.Time
	// NextSettleAt is when settlement may next re-send an OutcomeUnknown
	// record; SettleAttempts counts its re-sends.
	NextSettleAt   time.Time
	SettleAttempts int
	// LeaseOwner holds the record while it is InProgress, until
	// LeaseExpiresAt. An expired lease means its holder died or hung.
	LeaseOwner     string
	LeaseExpiresAt time.Time
	// GaveUp is set once when an unknown record passes SettleBy.
	GaveUp bool
}

// Claim asks Begin for the right to send a request for a key.
type Claim struct {
	Key        string
	Body       []byte
	BodySHA256 [32]byte
	Currency   string
	Amount     int64
	RequestID  string
	TraceID    string
	Caller     string
	// Owner identifies the claimant (process and call) for the lease.
	Owner string
	// Now is the current time; LeaseUntil ends the lease if acquired;
	// SettleBy ends the settlement window if the claim starts one.
	Now        time.Time
	LeaseUntil time.Time
	SettleBy   time.Time
}

// Outcome is Begin's verdict on a Claim.
type Outcome int

const (
	// Acquired: the record is now InProgress with the claimant's lease,
	// committed; the claimant must send Body and call Finish.
	Acquired Outcome = iota + 1
	// Replay: the key's payment succeeded; answer from the record.
	Replay
	// Reused: the key's record holds a different request (another
	// BodySHA256); nothing changed.
	Reused
	// Busy: another owner holds an unexpired lease; nothing changed.
	Busy
	// PastWindow: the record's outcome is unknown and its settlement window
	// has closed, so nothing may be sent for the key again; the record is
	// left OutcomeUnknown (an expired InProgress record becomes
	// OutcomeUnknown).
	PastWindow
)

// Began is the result of Begin.
type Began struct {
	Outcome Outcome
	// Record is the record after Begin: as found, or as acquired.
	Record Record
	// Prior is the record's state before an acquisition: 0 for a new
	// record; NotCreated, OutcomeUnknown, or InProgress with an expired
	// lease. A claimant that acquires a record whose Prior is not 0 or
	// NotCreated must never record it NotCreated: an earlier attempt may
	// have created the payment.
	Prior State
}

// Finish records the outcome of the claimant's request.
type Finish struct {
	Key   string
	Owner string
	// State is Succeeded, NotCreated or OutcomeUnknown.
	State          State
	AddAttempts    int
	ProviderStatus int
	Reply          []byte
	LastError      string
	Code           int32
	Now            time.Time
	// NextSettleAt, for OutcomeUnknown, is when settlement may re-send.
	NextSettleAt time.Time
	// Settlement marks a finish by the settlement worker: SettleAttempts
	// is incremented.
	Settlement bool
}

// Stats are gauges for metrics.
type Stats struct {
	// ByState counts records in each state.
	ByState map[State]int64
	// Unsettled counts OutcomeUnknown records past their settlement window:
	// those GiveUp has marked (GaveUp). Stats takes no clock, so a record
	// whose window closed since GiveUp last ran is counted once it runs.
	Unsettled int64
	// Events counts stored webhook events.
	Events int64
}

// Header is one HTTP header field of a webhook delivery.
type Header struct {
	Name, Value string
}

// Event is one webhook delivery in the inbox.
type Event struct {
	// Sequence is assigned by AppendEvent. Sequences commit in order: a
	// reader that has seen sequence n will never later find an event < n
	// appear.
	Sequence    int64
	ReceivedAt  time.Time
	ContentType string
	Headers     []Header
	Body        []byte
	BodySHA256  [32]byte
	// DuplicateOf is the lowest sequence of a stored event with the same
	// BodySHA256, or 0. Assigned by AppendEvent.
	DuplicateOf int64
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
	// batch group-commits Begins and Finishes.
	batch *batcher
	// later counts FinishLater calls not yet done, for Close.
	later sync.WaitGroup
	// commits counts committed write transactions.
	commits atomic.Uint64
	// stmts caches prepared statements by database and query.
	stmts sync.Map // stmtKey → *sql.Stmt
}

type stmtKey struct {
	db    *sql.DB
	query string
}

// prepared returns query prepared on db, preparing it on first use.
// database/sql prepares it again on each connection that runs it.
func (s *Store) prepared(ctx context.Context, db *sql.DB, query string) (*sql.Stmt, error) {
	k := stmtKey{db, query}
	if st, ok := s.stmts.Load(k); ok {
		return st.(*sql.Stmt), nil
	}
	st, err := db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if prev, loaded := s.stmts.LoadOrStore(k, st); loaded {
		st.Close()
		return prev.(*sql.Stmt), nil
	}
	return st, nil
}

// txStmt returns query prepared for tx (on the writer). The writer's hot
// queries are prepared at Open (writerQueries), since a transaction holds
// SQLite's one writer connection and preparing on the pool would wait for
// it; any other is prepared in tx alone.
func (s *Store) txStmt(ctx context.Context, tx *sql.Tx, query string) (*sql.Stmt, error) {
	if st, ok := s.stmts.Load(stmtKey{s.w, query}); ok {
		return tx.StmtContext(ctx, st.(*sql.Stmt)), nil
	}
	return tx.PrepareContext(ctx, query)
}

// writerQueries are the queries every payment runs on the writer.
func (s *Store) writerQueries() []string {
	return []string{s.insertQuery(), s.lockedSelectQuery(), s.finishQuery()}
}

func (s *Store) insertQuery() string {
	d := s.d
	cols, vals := "", ""
	if d.keyCol != "key" {
		cols, vals = ", "+d.keyCol, ", $15"
	}
	// A new record comes back from RETURNING; a conflict returns no row.
	return d.q(`
		INSERT INTO records (key, body, body_sha256, currency, amount, state,
			request_id, trace_id, caller, created_at, updated_at, settle_by,
			next_settle_at, lease_owner, lease_expires_at` + cols + `)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, $11, $12, $13, $14` + vals + `)
		ON CONFLICT (` + d.keyCol + `) DO NOTHING
		RETURNING ` + recordColumns)
}

func (s *Store) lockedSelectQuery() string {
	return s.d.q(`SELECT ` + recordColumns + ` FROM records WHERE ` + s.d.keyCol + ` = $1 ` + s.d.lockRows)
}

func (s *Store) finishQuery() string {
	d := s.d
	return d.q(`
		UPDATE records SET state = $3, attempts = attempts + $4, provider_status = $5,
			reply = $6, last_error = $7, code = $8, updated_at = $9, next_settle_at = $10,
			settle_attempts = settle_attempts + $11, lease_owner = '', lease_expires_at = $12
		WHERE ` + d.keyCol + ` = $1 AND lease_owner = $2 AND state = $13
		RETURNING ` + recordColumns)
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
	s := &Store{secrets: sec, retention: opts.Retention}
	switch {
	case strings.HasPrefix(url, "sqlite:"):
		w, r, err := openSQLite(strings.TrimPrefix(url, "sqlite:"), opts)
		if err != nil {
			return nil, err
		}
		s.d, s.w, s.r = sqliteDialect, w, r
		s.batch = newBatcher(s)
	case strings.HasPrefix(url, "postgres://"), strings.HasPrefix(url, "postgresql://"):
		if ambiguousURL(url) {
			return nil, errAmbiguousURL
		}
		db, err := openPostgres(url, opts)
		if err != nil {
			return nil, fmt.Errorf("PostgreSQL URL: %w", err)
		}
		s.d, s.w, s.r = postgresDialect, db, db
		s.batch = newBatcher(s)
	default:
		return nil, errors.New(`unknown database URL scheme; want "sqlite:PATH", "postgres://…" or "postgresql://…"`)
	}
	if err := s.w.PingContext(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("connect to %s: %w", s.d.name, err)
	}
	if err := s.migrate(ctx, env); err != nil {
		s.Close()
		return nil, err
	}
	for _, q := range s.writerQueries() {
		if _, err := s.prepared(ctx, s.w, q); err != nil {
			s.Close()
			return nil, fmt.Errorf("prepare: %w", err)
		}
	}
	return s, nil
}

// Close waits for every FinishLater, then closes the database.
func (s *Store) Close() error {
	s.later.Wait()
	if s.batch != nil {
		s.batch.close()
	}
	s.stmts.Range(func(_, st any) bool {
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

// recordColumns are the records columns in the order scanRecord reads.
const recordColumns = `key, body, body_sha256, currency, amount, state, attempts,
	provider_status, reply, last_error, code, request_id, trace_id, caller,
	created_at, updated_at, settle_by, next_settle_at, settle_attempts,
	lease_owner, lease_expires_at, gave_up`

type scanner interface{ Scan(dest ...any) error }

func scanRecord(row scanner) (Record, error) {
	var r Record
	var state int
	err := row.Scan(&r.Key, &r.Body, shaCol{&r.BodySHA256}, &r.Currency, &r.Amount, &state, &r.Attempts,
		&r.ProviderStatus, &r.Reply, &r.LastError, &r.Code, &r.RequestID, &r.TraceID, &r.Caller,
		timeCol{&r.CreatedAt}, timeCol{&r.UpdatedAt}, timeCol{&r.SettleBy}, timeCol{&r.NextSettleAt}, &r.SettleAttempts,
		&r.LeaseOwner, timeCol{&r.LeaseExpiresAt}, &r.GaveUp)
	r.State = State(state)
	return r, err
}

func scanRecords(rows *sql.Rows) ([]Record, error) {
	defer rows.Close()
	var out []Record
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Begin decides, in one transaction, what a call with c.Key may do:
//   - no record: insert it InProgress with c's lease and window → Acquired;
//   - a record with another BodySHA256 → Reused;
//   - Succeeded → Replay;
//   - InProgress with an unexpired lease → Busy;
//   - OutcomeUnknown, or InProgress with an expired lease, before SettleBy →
//     Acquired (keeping SettleBy), Prior set;
//   - the same past SettleBy → PastWindow;
//   - NotCreated → Acquired with a new window (c.SettleBy), Prior set.
//
// It returns ErrKeyNotStorable for a key the backend can't hold exactly.
func (s *Store) Begin(ctx context.Context, c Claim) (Began, error) {
	if !s.d.storable(c.Key) {
		return Began{}, fmt.Errorf("begin %.64q: %w", c.Key, ErrKeyNotStorable)
	}
	var b Began
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		b, err = s.begin(ctx, tx, c)
		return err
	})
	if err != nil {
		return Began{}, s.wrap(fmt.Errorf("begin %.64q: %w", c.Key, err))
	}
	return b, nil
}

// write runs fn in a write transaction: the batcher's next one (SQLite),
// or one of its own.
func (s *Store) write(ctx context.Context, fn func(context.Context, *sql.Tx) error) error {
	if s.batch != nil {
		return s.batch.run(ctx, fn)
	}
	return s.transact(ctx, func(tx *sql.Tx) error { return fn(ctx, tx) })
}

func (s *Store) begin(ctx context.Context, tx *sql.Tx, c Claim) (Began, error) {
	d := s.d
	// The INSERT waits for a concurrent transaction inserting the same key
	// (PostgreSQL) and does nothing once it has committed; the SELECT then
	// locks the committed row. A row deleted in between (DeleteBefore) sends
	// us round again.
	for range 3 {
		args := []any{c.Key, c.Body, c.BodySHA256[:], c.Currency, c.Amount, int(StateInProgress),
			c.RequestID, c.TraceID, c.Caller, d.t(c.Now), d.t(c.SettleBy),
			d.t(time.Time{}), c.Owner, d.t(c.LeaseUntil)}
		if d.keyCol != "key" {
			args = append(args, d.k(c.Key))
		}
		ins, err := s.txStmt(ctx, tx, s.insertQuery())
		if err != nil {
			return Began{}, err
		}
		rows, err := ins.QueryContext(ctx, args...)
		if err != nil {
			return Began{}, err
		}
		inserted, err := scanRecords(rows)
		if err != nil {
			return Began{}, err
		}
		if len(inserted) == 1 {
			return Began{Outcome: Acquired, Record: inserted[0]}, nil
		}
		r, err := s.getRecordTx(ctx, tx, c.Key)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return Began{}, err
		}
		return s.decide(ctx, tx, c, r)
	}
	return Began{}, errors.New("record deleted and recreated repeatedly while beginning; retry")
}

// decide applies Begin's rules to the existing, locked record r.
func (s *Store) decide(ctx context.Context, tx *sql.Tx, c Claim, r Record) (Began, error) {
	d := s.d
	if r.BodySHA256 != c.BodySHA256 {
		return Began{Outcome: Reused, Record: r}, nil
	}
	expired := !c.Now.Before(r.LeaseExpiresAt)
	switch {
	case r.State == StateSucceeded:
		return Began{Outcome: Replay, Record: r}, nil
	case r.State == StateInProgress && !expired:
		return Began{Outcome: Busy, Record: r}, nil
	case r.State == StateNotCreated:
		nr, err := updateRecord(ctx, tx, d, `state = $2, lease_owner = $3, lease_expires_at = $4, updated_at = $5, settle_by = $6, gave_up = $7`,
			c.Key, int(StateInProgress), c.Owner, d.t(c.LeaseUntil), d.t(c.Now), d.t(c.SettleBy), false)
		return Began{Outcome: Acquired, Record: nr, Prior: r.State}, err
	case r.State == StateOutcomeUnknown || r.State == StateInProgress:
		if !c.Now.Before(r.SettleBy) {
			if r.State == StateOutcomeUnknown {
				return Began{Outcome: PastWindow, Record: r}, nil
			}
			nr, err := updateRecord(ctx, tx, d, `state = $2, lease_owner = '', lease_expires_at = $3, updated_at = $4`,
				c.Key, int(StateOutcomeUnknown), d.t(time.Time{}), d.t(c.Now))
			return Began{Outcome: PastWindow, Record: nr}, err
		}
		nr, err := updateRecord(ctx, tx, d, `state = $2, lease_owner = $3, lease_expires_at = $4, updated_at = $5`,
			c.Key, int(StateInProgress), c.Owner, d.t(c.LeaseUntil), d.t(c.Now))
		return Began{Outcome: Acquired, Record: nr, Prior: r.State}, err
	}
	return Began{}, fmt.Errorf("record in unknown state %d", r.State)
}

// getRecordTx reads and locks key's record in tx.
func (s *Store) getRecordTx(ctx context.Context, tx *sql.Tx, key string) (Record, error) {
	st, err := s.txStmt(ctx, tx, s.lockedSelectQuery())
	if err != nil {
		return Record{}, err
	}
	r, err := scanRecord(st.QueryRowContext(ctx, s.d.k(key)))
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, ErrNotFound
	}
	return r, err
}

// updateRecord sets columns ($2 onwards are args) on key's record and
// returns it.
func updateRecord(ctx context.Context, tx *sql.Tx, d dialect, set string, key string, args ...any) (Record, error) {
	args = append([]any{d.k(key)}, args...)
	return scanRecord(tx.QueryRowContext(ctx, d.q(`UPDATE records SET `+set+` WHERE `+d.keyCol+` = $1 RETURNING `+recordColumns), args...))
}

// Finish records f's outcome if f.Owner still holds the lease, clearing it,
// and returns the record; otherwise it returns ErrLeaseLost and writes
// nothing.
func (s *Store) Finish(ctx context.Context, f Finish) (Record, error) {
	fin, err := s.finishOp(f)
	if err != nil {
		return Record{}, err
	}
	var r Record
	err = s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		r, err = fin(ctx, tx)
		return err
	})
	if err != nil {
		return Record{}, s.wrap(fmt.Errorf("finish %.64q: %w", f.Key, err))
	}
	return r, nil
}

// finishOp checks f and returns the statement that records it.
func (s *Store) finishOp(f Finish) (func(context.Context, *sql.Tx) (Record, error), error) {
	if !s.d.storable(f.Key) {
		return nil, fmt.Errorf("finish %.64q: %w", f.Key, ErrLeaseLost)
	}
	switch f.State {
	case StateSucceeded, StateNotCreated, StateOutcomeUnknown:
	default:
		return nil, fmt.Errorf("finish %.64q: state %v is not an outcome", f.Key, f.State)
	}
	d := s.d
	settle := 0
	if f.Settlement {
		settle = 1
	}
	return func(ctx context.Context, tx *sql.Tx) (Record, error) {
		st, err := s.txStmt(ctx, tx, s.finishQuery())
		if err != nil {
			return Record{}, err
		}
		rows, err := st.QueryContext(ctx,
			d.k(f.Key), f.Owner, int(f.State), f.AddAttempts, f.ProviderStatus,
			f.Reply, f.LastError, f.Code, d.t(f.Now), d.t(f.NextSettleAt),
			settle, d.t(time.Time{}), int(StateInProgress))
		if err != nil {
			return Record{}, err
		}
		rs, err := scanRecords(rows)
		if err != nil {
			return Record{}, err
		}
		if len(rs) == 0 {
			return Record{}, ErrLeaseLost
		}
		return rs[0], nil
	}, nil
}

// FinishLater is Finish without waiting for the commit: done gets Finish's
// result once the outcome is durable or has failed, on another goroutine.
// Close waits for every FinishLater to be done. done must not write to the
// store: with SQLite it runs on the goroutine that commits. Use it only for an outcome
// whose loss in a crash is harmless: the record stays InProgress, and once
// its lease expires settlement re-sends it, which gives the same answer.
func (s *Store) FinishLater(f Finish, done func(Record, error)) {
	s.later.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), finishLaterTimeout)
	if s.batch == nil {
		go func() {
			defer s.later.Done()
			defer cancel()
			r, err := s.Finish(ctx, f)
			done(r, err)
		}()
		return
	}
	// Queued directly, so that no goroutine waits on it.
	fin, wrapErr := s.finishOp(f)
	if wrapErr != nil {
		cancel()
		defer s.later.Done()
		done(Record{}, wrapErr)
		return
	}
	var r Record
	s.batch.submit(&batchOp{ctx: ctx, fn: func(ctx context.Context, tx *sql.Tx) error {
		var err error
		r, err = fin(ctx, tx)
		return err
	}, done: func(err error) {
		defer s.later.Done()
		cancel()
		if err != nil {
			done(Record{}, s.wrap(fmt.Errorf("finish %.64q: %w", f.Key, err)))
			return
		}
		done(r, nil)
	}})
}

// finishLaterTimeout bounds a FinishLater.
const finishLaterTimeout = 30 * time.Second

// Get returns the record for key, or ErrNotFound.
func (s *Store) Get(ctx context.Context, key string) (Record, error) {
	if !s.d.storable(key) {
		return Record{}, fmt.Errorf("get %.64q: %w", key, ErrNotFound)
	}
	r, err := func() (Record, error) {
		st, err := s.prepared(ctx, s.r, s.d.q(`SELECT `+recordColumns+` FROM records WHERE `+s.d.keyCol+` = $1`))
		if err != nil {
			return Record{}, err
		}
		r, err := scanRecord(st.QueryRowContext(ctx, s.d.k(key)))
		if errors.Is(err, sql.ErrNoRows) {
			return Record{}, ErrNotFound
		}
		return r, err
	}()
	if err != nil {
		return Record{}, s.wrap(fmt.Errorf("get %.64q: %w", key, err))
	}
	return r, nil
}

// ClaimDue takes the lease (owner, until leaseUntil) on up to limit records
// due for settlement at now, marking them InProgress, and returns them:
// OutcomeUnknown records with NextSettleAt <= now, and InProgress records
// whose lease expired, both only while now < SettleBy. Replicas never claim
// the same record at once.
func (s *Store) ClaimDue(ctx context.Context, owner string, now, leaseUntil time.Time, limit int) ([]Record, error) {
	if limit <= 0 {
		return nil, nil
	}
	d := s.d
	var out []Record
	err := s.transact(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, d.q(`
			UPDATE records SET state = $1, lease_owner = $2, lease_expires_at = $3, updated_at = $4
			WHERE `+d.keyCol+` IN (
				SELECT `+d.keyCol+` FROM records
				WHERE ((state = $5 AND next_settle_at <= $4) OR (state = $1 AND lease_expires_at <= $4))
					AND settle_by > $4
				ORDER BY next_settle_at, key
				LIMIT $6 `+d.skipLocked+`)
			RETURNING `+recordColumns),
			int(StateInProgress), owner, d.t(leaseUntil), d.t(now), int(StateOutcomeUnknown), limit)
		if err != nil {
			return err
		}
		out, err = scanRecords(rows)
		return err
	})
	if err != nil {
		return nil, s.wrap(fmt.Errorf("claim due records: %w", err))
	}
	return out, nil
}

// GiveUp marks up to limit records whose settlement window closed at or
// before now, unsettled and not yet marked: OutcomeUnknown records, and
// InProgress records with an expired lease (which become OutcomeUnknown).
// It returns the records it marked, each once ever, for logging.
func (s *Store) GiveUp(ctx context.Context, now time.Time, limit int) ([]Record, error) {
	if limit <= 0 {
		return nil, nil
	}
	d := s.d
	var out []Record
	err := s.transact(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, d.q(`
			UPDATE records SET state = $1, gave_up = $2, updated_at = $3,
				lease_owner = CASE WHEN state = $4 THEN '' ELSE lease_owner END,
				lease_expires_at = CASE WHEN state = $4 THEN $5 ELSE lease_expires_at END
			WHERE `+d.keyCol+` IN (
				SELECT `+d.keyCol+` FROM records
				WHERE (state = $1 OR (state = $4 AND lease_expires_at <= $3))
					AND settle_by <= $3 AND gave_up = $6
				ORDER BY settle_by, key
				LIMIT $7 `+d.skipLocked+`)
			RETURNING `+recordColumns),
			int(StateOutcomeUnknown), true, d.t(now), int(StateInProgress), d.t(time.Time{}), false, limit)
		if err != nil {
			return err
		}
		out, err = scanRecords(rows)
		return err
	})
	if err != nil {
		return nil, s.wrap(fmt.Errorf("give up on records: %w", err))
	}
	return out, nil
}

// Stats counts records by state, unsettled records past their window, and
// stored events.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	st := Stats{ByState: map[State]int64{
		StateInProgress: 0, StateSucceeded: 0, StateNotCreated: 0, StateOutcomeUnknown: 0,
	}}
	err := func() error {
		rows, err := s.r.QueryContext(ctx, `SELECT state, COUNT(*) FROM records GROUP BY state`)
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
			st.ByState[State(state)] = n
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if err := s.r.QueryRowContext(ctx, s.d.q(`SELECT COUNT(*) FROM records WHERE state = $1 AND gave_up = $2`),
			int(StateOutcomeUnknown), true).Scan(&st.Unsettled); err != nil {
			return err
		}
		return s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM events`).Scan(&st.Events)
	}()
	if err != nil {
		return Stats{}, s.wrap(fmt.Errorf("stats: %w", err))
	}
	return st, nil
}

// DeleteBefore deletes up to limit records last updated before t (never
// InProgress ones) and up to limit events received before t, and returns
// how many rows it deleted in all. Call it repeatedly for small batches.
func (s *Store) DeleteBefore(ctx context.Context, t time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	d := s.d
	var total int64
	err := s.transact(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, d.q(`
			DELETE FROM records WHERE `+d.keyCol+` IN (
				SELECT `+d.keyCol+` FROM records WHERE updated_at < $1 AND state <> $2
				ORDER BY updated_at LIMIT $3 `+d.skipLocked+`)`),
			d.t(t), int(StateInProgress), limit)
		if err != nil {
			return fmt.Errorf("records: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		total += n
		res, err = tx.ExecContext(ctx, d.q(`
			DELETE FROM events WHERE seq IN (
				SELECT seq FROM events WHERE received_at < $1
				ORDER BY seq LIMIT $2 `+d.skipLocked+`)`),
			d.t(t), limit)
		if err != nil {
			return fmt.Errorf("events: %w", err)
		}
		n, err = res.RowsAffected()
		total += n
		return err
	})
	if err != nil {
		return 0, s.wrap(fmt.Errorf("delete before %v: %w", t, err))
	}
	return int(total), nil
}

// AppendEvent stores e durably, assigning its Sequence and DuplicateOf,
// and returns it once committed.
func (s *Store) AppendEvent(ctx context.Context, e Event) (Event, error) {
	d := s.d
	headers, err := encodeHeaders(e.Headers)
	if err != nil {
		return Event{}, fmt.Errorf("append event: %w", err)
	}
	e.ReceivedAt = e.ReceivedAt.Truncate(time.Microsecond).UTC()
	err = s.transact(ctx, func(tx *sql.Tx) error {
		// The counter row's lock is held until commit, so the next append
		// can't take a sequence until this one is visible.
		if err := tx.QueryRowContext(ctx, `UPDATE event_counter SET last = last + 1 WHERE id = 1 RETURNING last`).Scan(&e.Sequence); err != nil {
			return fmt.Errorf("next sequence: %w", err)
		}
		var dup sql.NullInt64
		since := time.Time{}
		if s.retention > 0 {
			since = e.ReceivedAt.Add(-s.retention)
		}
		if err := tx.QueryRowContext(ctx, d.q(`SELECT MIN(seq) FROM events WHERE body_sha256 = $1 AND received_at >= $2`), e.BodySHA256[:], d.t(since)).Scan(&dup); err != nil {
			return fmt.Errorf("find duplicates: %w", err)
		}
		e.DuplicateOf = dup.Int64
		_, err := tx.ExecContext(ctx, d.q(`
			INSERT INTO events (seq, received_at, content_type, headers, body, body_sha256, duplicate_of)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`),
			e.Sequence, d.t(e.ReceivedAt), e.ContentType, headers, e.Body, e.BodySHA256[:], e.DuplicateOf)
		return err
	})
	if err != nil {
		return Event{}, s.wrap(fmt.Errorf("append event: %w", err))
	}
	return e, nil
}

// encodeHeaders stores headers in order as a JSON list of [name, value]
// pairs. (Bytes that aren't UTF-8 become U+FFFD, as in any JSON.)
func encodeHeaders(hs []Header) (string, error) {
	pairs := make([][2]string, len(hs))
	for i, h := range hs {
		pairs[i] = [2]string{h.Name, h.Value}
	}
	b, err := json.Marshal(pairs)
	return string(b), err
}

func decodeHeaders(s string) ([]Header, error) {
	var pairs [][2]string
	if err := json.Unmarshal([]byte(s), &pairs); err != nil {
		return nil, fmt.Errorf("decode headers: %w", err)
	}
	if len(pairs) == 0 {
		return nil, nil
	}
	hs := make([]Header, len(pairs))
	for i, p := range pairs {
		hs[i] = Header{Name: p[0], Value: p[1]}
	}
	return hs, nil
}

// ListEvents returns up to limit events with Sequence > after, in order.
func (s *Store) ListEvents(ctx context.Context, after int64, limit int) ([]Event, error) {
	if limit <= 0 {
		return nil, nil
	}
	out, err := func() ([]Event, error) {
		rows, err := s.r.QueryContext(ctx, s.d.q(`
			SELECT seq, received_at, content_type, headers, body, body_sha256, duplicate_of
			FROM events WHERE seq > $1 ORDER BY seq LIMIT $2`), after, limit)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []Event
		for rows.Next() {
			var e Event
			var headers string
			if err := rows.Scan(&e.Sequence, timeCol{&e.ReceivedAt}, &e.ContentType, &headers, &e.Body,
				shaCol{&e.BodySHA256}, &e.DuplicateOf); err != nil {
				return nil, err
			}
			if e.Headers, err = decodeHeaders(headers); err != nil {
				return nil, err
			}
			out = append(out, e)
		}
		return out, rows.Err()
	}()
	if err != nil {
		return nil, s.wrap(fmt.Errorf("list events after %d: %w", after, err))
	}
	return out, nil
}

// LastSequence returns the highest committed event sequence, or 0.
func (s *Store) LastSequence(ctx context.Context) (int64, error) {
	// The counter, not MAX(seq): it keeps counting when old events are
	// deleted.
	var n int64
	if err := s.r.QueryRowContext(ctx, `SELECT last FROM event_counter WHERE id = 1`).Scan(&n); err != nil {
		return 0, s.wrap(fmt.Errorf("last event sequence: %w", err))
	}
	return n, nil
}
