package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
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
	// times are microseconds since the epoch in SQLite, timestamptz in
	// PostgreSQL.
	intTimes bool
	// textKeysOnly: the key column can't hold NUL or invalid UTF-8.
	textKeysOnly bool
	// keyCol is the records column that identifies a key: key itself in
	// SQLite, or key_hash (SHA-256 of the key) in PostgreSQL, whose btree
	// indexes can't hold a long key.
	keyCol string
}

var (
	sqliteDialect = dialect{
		name:          "sqlite",
		questionMarks: true,
		intTimes:      true,
		keyCol:        "key",
	}
	postgresDialect = dialect{
		name:         "postgres",
		lockRows:     "FOR UPDATE",
		skipLocked:   "FOR UPDATE SKIP LOCKED",
		textKeysOnly: true,
		keyCol:       "key_hash",
	}
)

var dollarN = regexp.MustCompile(`\$([0-9]+)`)

// q returns query in the dialect's placeholder syntax.
func (d dialect) q(query string) string {
	if d.questionMarks {
		return dollarN.ReplaceAllString(query, "?$1")
	}
	return query
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
	busy := opts.busyTimeout().Milliseconds()
	if path == ":memory:" {
		db, err := sql.Open("sqlite", fmt.Sprintf(":memory:?_txlock=immediate&_pragma=busy_timeout(%d)&_pragma=foreign_keys(1)", busy))
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
	common := fmt.Sprintf("_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=foreign_keys(1)", busy)
	w, err = sql.Open("sqlite", path+"?_txlock=immediate&"+common)
	if err != nil {
		return nil, nil, err
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	r, err = sql.Open("sqlite", path+"?_pragma=query_only(1)&"+common)
	if err != nil {
		w.Close()
		return nil, nil, err
	}
	r.SetMaxOpenConns(opts.sqliteReaders())
	r.SetMaxIdleConns(opts.sqliteReaders())
	return w, r, nil
}

// openPostgres opens a database/sql pool over pgx.
func openPostgres(rawURL string, opts Options) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(rawURL)
	if err != nil {
		return nil, err
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(opts.postgresConns())
	db.SetMaxIdleConns(opts.postgresConns())
	db.SetConnMaxIdleTime(5 * time.Minute)
	return db, nil
}

// transact runs fn in a transaction on the writer, committing if fn returns
// nil and rolling back otherwise (as in pkgsite's database.Transact). In
// SQLite the transaction starts with BEGIN IMMEDIATE, taking the write lock
// at once.
func (s *Store) transact(ctx context.Context, fn func(*sql.Tx) error) (err error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	defer func() {
		if p := recover(); p != nil {
			tx.Rollback()
			panic(p)
		}
		if err != nil {
			tx.Rollback()
			return
		}
		if cerr := tx.Commit(); cerr != nil {
			err = fmt.Errorf("commit: %w: %w", ErrCommitUnknown, cerr)
			return
		}
		s.commits.Add(1)
	}()
	return fn(tx)
}

// RedactedURL is rawURL as it may be shown, in a log line or anywhere
// else. For PostgreSQL that is the scheme, user, host, port and database
// name only: never the password, nor the query, where pgx also reads
// password and sslpassword. For SQLite it is the path. ok is false, and
// shown the scheme alone, if rawURL's parts can't be told apart for sure
// (see ambiguousURL), or it can't be parsed; Open refuses such a URL.
func RedactedURL(rawURL string) (shown string, ok bool) {
	const redacted = "[REDACTED]"
	if path, isSQLite := strings.CutPrefix(rawURL, "sqlite:"); isSQLite {
		if i := strings.IndexAny(path, "?#"); i >= 0 {
			return "sqlite:" + path[:i] + redacted, false
		}
		return rawURL, true
	}
	scheme, _, found := strings.Cut(rawURL, "://")
	if !found || (scheme != "postgres" && scheme != "postgresql") {
		return redacted, false
	}
	u, err := url.Parse(rawURL)
	socket := u != nil && u.Host == "" && u.Query().Get("host") != ""
	if err != nil || (u.Host == "" && !socket) || ambiguousURL(rawURL) {
		return scheme + "://" + redacted, false
	}
	v := url.URL{Scheme: scheme, Host: u.Host, Path: u.Path}
	if socket {
		// A Unix socket directory (or a host) given as host= in the query.
		v.RawQuery = "host=" + url.QueryEscape(u.Query().Get("host"))
	}
	if u.User != nil {
		v.User = url.User(u.User.Username())
	}
	shown = v.String()
	// A last guard, should net/url and the hand parse in secrets ever
	// disagree about where the password is.
	for _, s := range secrets(rawURL) {
		if strings.Contains(shown, s) {
			return scheme + "://" + redacted, true
		}
	}
	return shown, true
}

// ambiguousURL reports whether a PostgreSQL URL's password may have been
// taken for part of its host, path or query, as pgx would take it: the URL
// holds a '#' (after which pgx reads nothing, so it can only be part of a
// password, unescaped), or an '@' in the path or in a query parameter's
// name, or a query parameter with no value (where a password's unescaped
// '/' or '?' ended the authority early). Such a URL names another host or
// database than the one meant, and errors that quote those would quote
// part of the password.
//
// errAmbiguousURL is Open's refusal of one; like every error of Open's it
// does not quote the URL.
var errAmbiguousURL = errors.New("PostgreSQL URL holds a '#', or an '@' in its path or a query parameter's name: percent-encode any of # / ? @ in the user name and password (%23 %2F %3F %40)")

func ambiguousURL(rawURL string) bool {
	_, rest, _ := strings.Cut(rawURL, "://")
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		return false
	}
	rest = rest[end:]
	if strings.Contains(rest, "#") {
		return true
	}
	path, query, _ := strings.Cut(rest, "?")
	if strings.Contains(path, "@") {
		return true
	}
	// In the query an '@' may be part of a value (user=alice@server), but
	// never of a parameter's name: a password's '?' ended the host early.
	for _, param := range strings.Split(query, "&") {
		name, _, hasValue := strings.Cut(param, "=")
		if param != "" && (!hasValue || strings.Contains(name, "@")) {
			return true
		}
	}
	return false
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
			}
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
	case context.Canceled, context.DeadlineExceeded, ErrNotFound, ErrLeaseLost, ErrWrongEnvironment, ErrKeyNotStorable, ErrCommitUnknown, ErrInboxFull:
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
