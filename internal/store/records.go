package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"example.com/paymentsd/internal/record"
)

// Get returns the record for key, or ErrNotFound (see Tombstone for a key
// whose record retention deleted, or has tombstoned and is about to).
// Record.ReadAt is the store's clock at the read.
func (s *Store) Get(ctx context.Context, key string) (record.Record, error) {
	if !s.d.storable(key) {
		return record.Record{}, fmt.Errorf("get %.64q: %w", key, ErrNotFound)
	}
	r, err := func() (record.Record, error) {
		st, err := s.prepared(ctx, s.r, s.stmts.get)
		if err != nil {
			return record.Record{}, err
		}
		var readAt time.Time
		r, err := scanRecord(st.QueryRowContext(ctx, s.d.k(key)), timeCol{&readAt})
		if errors.Is(err, sql.ErrNoRows) {
			return record.Record{}, ErrNotFound
		}
		r.ReadAt = s.readTime(readAt)
		return r, err
	}()
	if err != nil {
		return record.Record{}, s.wrap(fmt.Errorf("get %.64q: %w", key, err))
	}
	return r, nil
}

// lockedRecord reads and locks key's record in tx, read at now, or
// returns ErrNotFound.
func (s *Store) lockedRecord(ctx context.Context, tx *sql.Tx, key string, now time.Time) (record.Record, error) {
	st, err := s.txStmt(ctx, tx, s.stmts.locked)
	if err != nil {
		return record.Record{}, err
	}
	r, err := scanRecord(st.QueryRowContext(ctx, s.d.k(key)))
	if errors.Is(err, sql.ErrNoRows) {
		return record.Record{}, ErrNotFound
	}
	r.ReadAt = now
	return r, err
}

type scanner interface{ Scan(dest ...any) error }

// scanRecord reads a row of recordColumns, then extra.
func scanRecord(row scanner, extra ...any) (record.Record, error) {
	var r record.Record
	dest := make([]any, 0, len(recordCols)+len(extra))
	for _, c := range recordCols {
		dest = append(dest, c.dest(&r))
	}
	err := row.Scan(append(dest, extra...)...)
	return r, err
}

// scanRecords reads rows of recordColumns, each read at now.
func scanRecords(rows *sql.Rows, now time.Time) ([]record.Record, error) {
	defer rows.Close()
	var out []record.Record
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, err
		}
		r.ReadAt = now
		out = append(out, r)
	}
	return out, rows.Err()
}

// byteCol scans an integer column into a small enum (a state, a kind).
type byteCol[T ~uint8] struct{ p *T }

func (c byteCol[T]) Scan(src any) error {
	v, ok := src.(int64)
	if !ok || v < 0 || v > 255 {
		return fmt.Errorf("enum column holds %T %v", src, src)
	}
	*c.p = T(v)
	return nil
}
