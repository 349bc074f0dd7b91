package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"example.com/paymentsd/internal/record"
)

// Tombstone is what is kept of a record once retention has deleted it, so
// that its key is never sent to the provider again: the provider does not
// say how long it remembers a key, and a key re-sent after paymentsd forgot
// it could pay twice, or be answered with another request's payment. It
// holds hashes, not the key or the request, and is kept for
// Retention.Tombstones.
type Tombstone struct {
	// KeySHA256 and BodySHA256 are the SHA-256 of the key and of the
	// request body.
	KeySHA256  [32]byte
	BodySHA256 [32]byte
	// State and GaveUp are the record's, when it was deleted.
	State  record.State
	GaveUp bool
	// CreatedAt and UpdatedAt are the record's; ExpiredAt is when
	// retention wrote the tombstone.
	CreatedAt time.Time
	UpdatedAt time.Time
	ExpiredAt time.Time
	// Caller is the record's caller, when CallerKnown (tombstones written
	// before migration 5 don't know it).
	Caller      string
	CallerKnown bool
}

// keySHA256 is the SHA-256 of a key's bytes, the tombstones' key (and
// PostgreSQL's records key).
func keySHA256(key string) [32]byte { return sha256.Sum256([]byte(key)) }

const tombstoneColumns = `key_sha256, body_sha256, state, gave_up, created_at, updated_at, expired_at`

// tombstoneRead is what scanTombstone reads.
const tombstoneRead = tombstoneColumns + `, caller`

func scanTombstone(row scanner) (Tombstone, error) {
	var t Tombstone
	var state int
	var caller sql.NullString
	err := row.Scan(shaCol{&t.KeySHA256}, shaCol{&t.BodySHA256}, &state, &t.GaveUp,
		timeCol{&t.CreatedAt}, timeCol{&t.UpdatedAt}, timeCol{&t.ExpiredAt}, &caller)
	t.Caller, t.CallerKnown = caller.String, caller.Valid
	if errors.Is(err, sql.ErrNoRows) {
		return Tombstone{}, ErrNotFound
	}
	t.State = record.State(state)
	return t, err
}

// Tombstone returns key's tombstone, or ErrNotFound if it has none (it
// was never used, its record still exists, or the tombstone too has
// expired).
func (s *Store) Tombstone(ctx context.Context, key string) (Tombstone, error) {
	sum := keySHA256(key)
	st, err := s.prepared(ctx, s.r, s.d.q(`SELECT `+tombstoneRead+` FROM tombstones WHERE key_sha256 = $1`))
	if err != nil {
		return Tombstone{}, s.wrap(fmt.Errorf("tombstone %.64q: %w", key, err))
	}
	t, err := scanTombstone(st.QueryRowContext(ctx, sum[:]))
	if err != nil {
		return Tombstone{}, s.wrap(fmt.Errorf("tombstone %.64q: %w", key, err))
	}
	return t, nil
}

func (s *Store) tombstoneTx(ctx context.Context, tx *sql.Tx, sum [32]byte) (Tombstone, error) {
	return scanTombstone(tx.QueryRowContext(ctx, s.d.q(`SELECT `+tombstoneRead+` FROM tombstones WHERE key_sha256 = $1`), sum[:]))
}
