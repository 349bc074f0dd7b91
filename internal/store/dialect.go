package store

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
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
	// planner, with no statistics, prefers an index that begins with
	// state (records_list_state), which holds every given-up record too.
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
