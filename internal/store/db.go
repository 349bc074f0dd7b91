package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// dialect holds what differs between the backends. Queries are written once
// with PostgreSQL's $N placeholders; rebind rewrites them for SQLite.
type dialect struct {
	name string
	// lockRows follows a SELECT that must lock the rows it reads
	// ("FOR UPDATE"); skipLocked, one whose locked rows another replica
	// should leave alone ("FOR UPDATE SKIP LOCKED"). SQLite has neither:
	// its writes are serialised by BEGIN IMMEDIATE.
	lockRows, skipLocked string
	// placeholder reports whether $N must become ?N.
	questionMarks bool
	// prepare: the store keeps prepared statements (see Store.prepared).
	prepare bool
	// times are microseconds since the epoch in SQLite, timestamptz in
	// PostgreSQL.
	intTimes bool
	// textKeysOnly: the key column can't hold NUL or invalid UTF-8.
	textKeysOnly bool
	// keyCol is the records column that identifies a key: key itself in
	// SQLite, or key_hash (SHA-256 of the key) in PostgreSQL, whose btree
	// indexes can't hold a long key.
	keyCol string
	// no is false as a literal, written as the partial index
	// records_due's condition is, so that the planner matches it.
	no string
	// dueIndex follows "FROM records" in settlement's query: SQLite's
	// planner, with no statistics, prefers records_state, which holds
	// every given-up record too.
	dueIndex string
}

var (
	sqliteDialect = dialect{
		name:          "sqlite",
		questionMarks: true,
		prepare:       true,
		intTimes:      true,
		keyCol:        "key",
		no:            "0",
		dueIndex:      " INDEXED BY records_due",
	}
	postgresDialect = dialect{
		name:         "postgres",
		lockRows:     "FOR UPDATE",
		skipLocked:   "FOR UPDATE SKIP LOCKED",
		textKeysOnly: true,
		keyCol:       "key_hash",
		no:           "false",
	}
)

// q returns query in the dialect's placeholder syntax: for SQLite, every $
// followed by a digit becomes ?, so $12 becomes ?12. It runs for every
// statement, so it is a byte loop with one allocation rather than a
// regular expression.
func (d dialect) q(query string) string {
	if !d.questionMarks || !strings.Contains(query, "$") {
		return query
	}
	var b strings.Builder
	b.Grow(len(query))
	for i := 0; i < len(query); i++ {
		c := query[i]
		if c == '$' && i+1 < len(query) && '0' <= query[i+1] && query[i+1] <= '9' {
			c = '?'
		}
		b.WriteByte(c)
	}
	return b.String()
}

// t converts a time to the column's representation, truncated to the
// microsecond both backends keep.
func (d dialect) t(t time.Time) any {
	if d.intTimes {
		return t.UnixMicro()
	}
	return t.Truncate(time.Microsecond).UTC()
}

// k returns the value of keyCol for key.
func (d dialect) k(key string) any {
	if d.keyCol == "key" {
		return key
	}
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// storable reports whether the backend can store key exactly.
func (d dialect) storable(key string) bool {
	if !d.textKeysOnly {
		return true
	}
	return strings.IndexByte(key, 0) < 0 && utf8.ValidString(key)
}

// timeCol scans either representation of a time column into a UTC time.
type timeCol struct{ t *time.Time }

func (c timeCol) Scan(src any) error {
	switch v := src.(type) {
	case int64:
		*c.t = time.UnixMicro(v).UTC()
	case time.Time:
		*c.t = v.UTC()
	case nil:
		*c.t = time.Time{}
	default:
		return fmt.Errorf("time column holds %T", src)
	}
	return nil
}

// shaCol scans a 32-byte hash.
type shaCol struct{ h *[32]byte }

func (c shaCol) Scan(src any) error {
	b, ok := src.([]byte)
	if !ok || len(b) != len(c.h) {
		return fmt.Errorf("sha256 column holds %T of length %d", src, len(b))
	}
	copy(c.h[:], b)
	return nil
}

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

// setStatementTimeout sets statementTimeout for the rest of a transaction.
var setStatementTimeout = fmt.Sprintf(`SELECT set_config('statement_timeout', '%d', true)`, statementTimeout.Milliseconds())

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
//     set in each transaction (transact), and as a startup parameter only
//     once detectPooler has found the connections direct;
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
	var db *sql.DB
	if opts.WrapConnector != nil {
		db = sql.OpenDB(opts.WrapConnector(stdlib.GetConnector(*cfg, beforeConnect)))
	} else {
		db = stdlib.OpenDB(*cfg, beforeConnect)
	}
	db.SetMaxOpenConns(opts.postgresConns())
	db.SetMaxIdleConns(opts.postgresConns())
	db.SetConnMaxIdleTime(5 * time.Minute)
	return db, mode, nil
}

// transact runs fn in a transaction on the writer, committing if fn returns
// nil and rolling back otherwise (as in pkgsite's database.Transact). In
// SQLite the transaction starts with BEGIN IMMEDIATE, taking the write lock
// at once.
//
// fn's statements run with ctx, and stop when it ends; the COMMIT, once
// sent, is never cancelled (commit.go): a caller whose ctx ends while it
// waits is told ErrCommitUnknown, and the store waits on for the answer.
// A caller whose ctx can end first waits for the answers of the COMMITs
// other callers left.
//
// Every outcome but a caller's giving up and the store's own refusals
// goes into the store's write health (see writeHealth); but fn returns
// errNoWrite when it wrote nothing, and then the transaction is rolled
// back, transact returns nil, and only on SQLite (whose transaction took
// the write lock) does it count as a commit.
func (s *Store) transact(ctx context.Context, fn func(*sql.Tx) error) (err error) {
	if err := s.unanswered.wait(ctx); err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	tc := newTransactionContext(ctx)
	tctx := tc.ctx
	var watch *commitWatch
	if s.d.name == "postgres" {
		watch = new(commitWatch)
		tctx = context.WithValue(tctx, commitWatchKey{}, watch)
	}
	tx, err := s.w.BeginTx(tctx, nil)
	if err != nil {
		tc.end()
		s.noteWrite(err)
		return fmt.Errorf("begin transaction: %w", err)
	}
	if s.d.name == "postgres" {
		if _, err := tx.ExecContext(ctx, setStatementTimeout); err != nil {
			tx.Rollback()
			tc.end()
			return fmt.Errorf("begin transaction: set statement_timeout: %w", err)
		}
	}
	defer func() {
		if p := recover(); p != nil {
			tx.Rollback()
			tc.end()
			s.health.failed()
			panic(p)
		}
		if errors.Is(err, errNoWrite) {
			tx.Rollback()
			tc.end()
			err = nil
			if s.d.name == "sqlite" {
				s.noteWrite(nil)
			}
			return
		}
		if err == nil {
			err = s.commit(ctx, tx, tc, watch)
		} else {
			tx.Rollback()
			tc.end()
		}
		s.noteWrite(err)
	}()
	return fn(tx)
}

// errNoWrite is what a transaction's fn returns when it wrote nothing (a
// settlement pass with nothing to claim or give up, a retention step with
// nothing to delete, a batch none of whose operations wrote a row:
// noteWrote). On
// PostgreSQL such a transaction commits at once, without waiting for a
// synchronous standby: its commit is no evidence that a write can land,
// and counted in the write health it would let a replica take a lease
// over while every write (the holder's outcome among them) waits for the
// standby. It is rolled back, and counts only on SQLite, where taking the
// write lock is what a write needs.
var errNoWrite = errors.New("the transaction wrote nothing")

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

// CheckURL reports what is wrong with a database URL, or nil: "sqlite:PATH",
// or a PostgreSQL URL whose parts (user, password, hosts, database, query)
// read the same to pgx, which splits a URL as libpq does, as they do to a
// person and to net/url. Its errors never quote the URL.
//
// libpq ends the user name and password at the first '@' before any '/',
// so an unescaped '@' in a password makes the rest of it the host that is
// dialled (and quoted by "no such host"), and an unescaped '/' makes part
// of it the port and the rest the database name. Such URLs are refused, as
// are a '#' (a fragment to net/url, part of the password to libpq) and a
// '?' before that '@', with advice to percent-encode.
func CheckURL(rawURL string) error {
	if path, ok := strings.CutPrefix(rawURL, "sqlite:"); ok {
		switch {
		case path == "":
			return errors.New("sqlite: needs a file path, such as sqlite:/var/lib/paymentsd/records.db, or sqlite::memory:")
		case strings.ContainsAny(path, "?#"):
			return errors.New("the SQLite path holds a '?' or '#': want a file path alone")
		}
		return nil
	}
	u, ok := splitPostgresURL(rawURL)
	if !ok {
		return errors.New(`want sqlite:PATH or a postgres:// (or postgresql://) URL`)
	}
	return u.check()
}

// errAmbiguousURL refuses a PostgreSQL URL whose password (or user name)
// may run into its host, database or query.
var errAmbiguousURL = errors.New("the URL's user name or password holds an unescaped '@', '/', '?' or '#', so where the password ends can't be told for sure: " +
	"percent-encode those characters in the user name and password (@ as %40, / as %2F, ? as %3F, # as %23, and % itself as %25)")

// pgURL is a PostgreSQL URL split as pgx and libpq split it; every part is
// as written (not percent-decoded).
type pgURL struct {
	scheme   string
	userinfo string // before the first '@' that precedes any '/'
	hasUser  bool
	hosts    string // host[:port][,host[:port]…]
	path     string // after the '/' that ends the hosts, up to any '?'
	query    string // after the '?'
}

func splitPostgresURL(rawURL string) (pgURL, bool) {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok || (scheme != "postgres" && scheme != "postgresql") {
		return pgURL{}, false
	}
	u := pgURL{scheme: scheme}
	if i := strings.IndexAny(rest, "@/"); i >= 0 && rest[i] == '@' {
		u.userinfo, u.hasUser, rest = rest[:i], true, rest[i+1:]
	}
	end := strings.IndexAny(rest, "/?")
	if end < 0 {
		end = len(rest)
	}
	u.hosts, rest = rest[:end], rest[end:]
	if r, ok := strings.CutPrefix(rest, "/"); ok {
		u.path, rest, _ = strings.Cut(r, "?")
		rest = "?" + rest
	}
	u.query = strings.TrimPrefix(rest, "?")
	return u, true
}

// params are the query's name=value pairs, as written.
func (u pgURL) params() [][2]string {
	var out [][2]string
	for _, p := range strings.Split(u.query, "&") {
		if p == "" {
			continue
		}
		k, v, _ := strings.Cut(p, "=")
		out = append(out, [2]string{k, v})
	}
	return out
}

func (u pgURL) check() error {
	switch {
	case strings.Contains(u.userinfo+u.hosts+u.path+u.query, "#"),
		strings.ContainsAny(u.userinfo, "?"),
		strings.Contains(u.hosts, "@"),
		strings.Contains(u.path, "@"):
		return errAmbiguousURL
	}
	hostParam := false
	for i, p := range strings.Split(u.query, "&") {
		if p == "" {
			continue
		}
		k, v, ok := strings.Cut(p, "=")
		switch {
		case strings.Contains(k, "@"):
			return errAmbiguousURL
		case !ok || strings.Contains(v, "="):
			return fmt.Errorf("query parameter %d is not one name=value pair (percent-encode '=' and '&' in values as %%3D and %%26)", i+1)
		}
		if dk, _ := url.QueryUnescape(k); dk == "host" || dk == "hostaddr" || dk == "service" {
			hostParam = hostParam || v != ""
		}
	}
	if !validEscapes(u.userinfo) || !validEscapes(u.hosts) || !validEscapes(u.path) || !validEscapes(u.query) {
		return errors.New("the URL holds a '%' not followed by two hex digits: percent-encode a '%' in the password as %25")
	}
	if u.hosts == "" && !hostParam {
		return errors.New("the URL names no host, in the URL or as host= in its query")
	}
	return nil
}

// validEscapes reports whether every '%' in s starts a %XX escape.
func validEscapes(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			continue
		}
		if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
			return false
		}
		i += 2
	}
	return true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// shownParams are the query parameters that say where pgx connects, and
// as whom: shown so that the host shown is the host dialled. No other
// parameter is shown: password and sslpassword are secrets, and others
// may hold one pasted by mistake.
var shownParams = map[string]bool{"host": true, "hostaddr": true, "port": true, "user": true, "dbname": true, "database": true, "service": true}

// RedactedURL is rawURL as it may be shown, in a log line or anywhere
// else. For PostgreSQL that is the scheme, user, hosts, ports and database
// name, as pgx reads them, and the query parameters that change where it
// connects (host=, hostaddr=, port=, user=, dbname=, service=): never the
// password, nor any other parameter (pgx reads password and sslpassword
// there too). For SQLite it is the path. ok is false, and shown the scheme
// alone, if CheckURL refuses rawURL; Open refuses such a URL too.
func RedactedURL(rawURL string) (shown string, ok bool) {
	const redacted = "[REDACTED]"
	if path, isSQLite := strings.CutPrefix(rawURL, "sqlite:"); isSQLite {
		if i := strings.IndexAny(path, "?#"); i >= 0 {
			return "sqlite:" + path[:i] + redacted, false
		}
		return rawURL, CheckURL(rawURL) == nil
	}
	u, isPG := splitPostgresURL(rawURL)
	if !isPG {
		return redacted, false
	}
	if u.check() != nil {
		return u.scheme + "://" + redacted, false
	}
	var b strings.Builder
	b.WriteString(u.scheme + "://")
	if user, _, _ := strings.Cut(u.userinfo, ":"); user != "" {
		b.WriteString(user + "@")
	}
	b.WriteString(u.hosts)
	if u.path != "" {
		b.WriteString("/" + u.path)
	}
	sep := "?"
	for _, p := range u.params() {
		if k, _ := url.QueryUnescape(p[0]); shownParams[k] {
			b.WriteString(sep + p[0] + "=" + p[1])
			sep = "&"
		}
	}
	shown = b.String()
	// A last guard, should the split above and the forms in secrets ever
	// disagree about where the password is.
	for _, s := range secrets(rawURL) {
		if strings.Contains(shown, s) {
			return u.scheme + "://" + redacted, true
		}
	}
	return shown, true
}

// secrets lists the forms in which rawURL's password could appear in an
// error message: as written, URL-decoded, and re-encoded. It parses by hand
// as well as with net/url, since a URL net/url can't parse must still be
// kept out of error messages.
func secrets(rawURL string) []string {
	var out []string
	add := func(s string) {
		if s == "" {
			return
		}
		out = append(out, s)
		if d, err := url.PathUnescape(s); err == nil && d != s {
			out = append(out, d)
		}
		if d, err := url.QueryUnescape(s); err == nil && d != s {
			out = append(out, d)
		}
		if e := url.QueryEscape(s); e != s {
			out = append(out, e)
		}
		if e := url.PathEscape(s); e != s {
			out = append(out, e)
		}
	}
	if u, err := url.Parse(rawURL); err == nil {
		if p, ok := u.User.Password(); ok {
			add(p)
		}
		for k, vs := range u.Query() {
			if strings.EqualFold(k, "password") {
				for _, v := range vs {
					add(v)
				}
			}
		}
	}
	// scheme://user:password@host…: the password runs from the first ':'
	// after "//" to the last '@' before the path.
	if _, rest, ok := strings.Cut(rawURL, "//"); ok {
		authority := rest
		if i := strings.IndexAny(authority, "/?"); i >= 0 && strings.LastIndexByte(authority[:i], '@') >= 0 {
			authority = authority[:i]
		}
		if at := strings.LastIndexByte(authority, '@'); at >= 0 {
			if _, pw, ok := strings.Cut(authority[:at], ":"); ok {
				add(pw)
				// Should a parser end the password at an unescaped
				// '@', '/', '?' or '#' in it, each piece could be shown
				// as another part of the URL.
				for _, piece := range strings.FieldsFunc(pw, func(r rune) bool { return strings.ContainsRune("@/?#", r) }) {
					if len(piece) >= 4 && piece != pw {
						add(piece)
					}
				}
			}
		}
	}
	// As pgx (and libpq) read it: up to the first '@' before any '/'.
	if u, ok := splitPostgresURL(rawURL); ok && u.hasUser {
		if _, pw, ok := strings.Cut(u.userinfo, ":"); ok {
			add(pw)
		}
	}
	for _, m := range regexp.MustCompile(`(?i)password=([^&\s]+)`).FindAllStringSubmatch(rawURL, -1) {
		add(m[1])
	}
	return out
}

// redactedError is an error whose message had a password removed. It keeps
// the original only to answer errors.Is for context errors and the store's
// sentinels, never for its text.
type redactedError struct {
	msg   string
	cause error
}

func (e *redactedError) Error() string { return e.msg }

func (e *redactedError) Is(target error) bool {
	switch target {
	case context.Canceled, context.DeadlineExceeded, ErrNotFound, ErrWrongEnvironment, ErrKeyNotStorable, ErrCommitUnknown,
		ErrConnectTimeout, ErrMigrateTimeout, ErrInboxFull, ErrNotUnknown, ErrInFlight, ErrChanged, ErrClosed:
		return errors.Is(e.cause, target)
	}
	return false
}

// redact returns err, or an error with the same message less any of the
// secrets, if its message holds one.
func redact(err error, secrets []string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	found := false
	for _, s := range secrets {
		if strings.Contains(msg, s) {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
			found = true
		}
	}
	if !found {
		return err
	}
	return &redactedError{msg: msg, cause: err}
}
