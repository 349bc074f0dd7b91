package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"example.com/paymentsd/internal/record"
)

// The journal: one row in attempts per attempt that has ended, written
// by the statement that ended it (see finishQuery), or beside it in its
// transaction when the attempt was abandoned; a late 2xx rewrites its
// attempt's row. The attempt in flight lives on the record.

// Attempts returns r's attempts (r as Get returned it), oldest first: the
// ended ones, then, while r is InProgress, the one in flight.
func (s *Store) Attempts(ctx context.Context, r record.Record) ([]record.Attempt, error) {
	d := s.d
	out, err := func() ([]record.Attempt, error) {
		st, err := s.prepared(ctx, s.r, d.q(`SELECT `+attemptColumns+` FROM attempts WHERE `+d.keyCol+` = $1 ORDER BY id`))
		if err != nil {
			return nil, err
		}
		rows, err := st.QueryContext(ctx, d.k(r.Key))
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []record.Attempt
		for rows.Next() {
			a, err := scanAttempt(rows)
			if err != nil {
				return nil, err
			}
			out = append(out, a)
		}
		return out, rows.Err()
	}()
	if err != nil {
		return nil, s.wrap(fmt.Errorf("attempts %.64q: %w", r.Key, err))
	}
	if r.State == record.InProgress {
		out = append(out, r.InFlight())
	}
	return out, nil
}

// scanAttempt reads a row of attemptColumns, after the columns of
// before. The replica column is the owner's process, which Attempt
// derives.
func scanAttempt(row scanner, before ...any) (record.Attempt, error) {
	var a record.Attempt
	var replica string
	dest := append(before, &a.Number, byteCol[record.Kind]{&a.Kind}, &a.Owner, &replica, &a.RequestID,
		timeCol{&a.StartedAt}, timeCol{&a.EndedAt}, &a.ProviderStatus, &a.HTTPRequests, &a.Reply,
		byteCol[record.State]{&a.State}, &a.Code, &a.Error, &a.Abandoned)
	return a, row.Scan(dest...)
}

// ownRow is the latest journal row of owner's attempt of key, and its id;
// nil if it has none.
func (s *Store) ownRow(ctx context.Context, tx *sql.Tx, key, owner string) (*record.Attempt, int64, error) {
	st, err := s.txStmt(ctx, tx, s.stmts.ownRow)
	if err != nil {
		return nil, 0, err
	}
	var id int64
	a, err := scanAttempt(st.QueryRowContext(ctx, s.d.k(key), owner), &id)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read attempt: %w", err)
	}
	return &a, id, nil
}

// journal writes the row of key's ended attempt a.
func (s *Store) journal(ctx context.Context, tx *sql.Tx, key string, a *record.Attempt) error {
	st, err := s.txStmt(ctx, tx, s.stmts.journal)
	if err == nil {
		_, err = st.ExecContext(ctx, journalArgs(s.d, key, a)...)
	}
	if err != nil {
		return fmt.Errorf("write attempt: %w", err)
	}
	return nil
}

// rewrite gives the abandoned row id the answer in a (WriteLate).
func (s *Store) rewrite(ctx context.Context, tx *sql.Tx, id int64, a *record.Attempt) error {
	st, err := s.txStmt(ctx, tx, s.stmts.rewrite)
	if err != nil {
		return err
	}
	res, err := st.ExecContext(ctx, id, a.ProviderStatus, a.HTTPRequests, a.Reply, int(a.State), a.Code, a.Error, a.Abandoned, true)
	if err != nil {
		return fmt.Errorf("rewrite attempt: %w", err)
	}
	return oneRow(res, "rewrite attempt")
}

// errChanged: a guarded statement found the record changed since it was
// read in the same transaction, which holds its lock: a bug, never a
// race. The transaction is rolled back.
var errChanged = errors.New("the record changed under its lock")

// oneRow checks that a guarded statement changed its one row.
func oneRow(res sql.Result, what string) error {
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if n != 1 {
		return fmt.Errorf("%s: %w", what, errChanged)
	}
	return nil
}
