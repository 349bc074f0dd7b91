package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// transact runs fn in a transaction on the writer, committing if fn returns
// nil and rolling back otherwise (as in pkgsite's database.Transact). In
// SQLite the transaction starts with BEGIN IMMEDIATE, taking the write lock
// at once.
//
// fn gets the store's clock as the transaction began (clock.go): on
// PostgreSQL the server's, read by the round trip that began the
// transaction (pgtx.go). Its statements run with ctx, and stop when it
// ends; the COMMIT, once sent, is never cancelled (commit.go): a caller
// whose ctx ends while it waits is told ErrCommitUnknown, and the store
// waits on for the answer.
// A caller whose ctx can end first waits for the answers of the COMMITs
// other callers left.
//
// Every outcome but a caller's giving up and the store's own refusals
// goes into the store's write health (see writeHealth); but fn returns
// errNoWrite when it wrote nothing, and then the transaction is rolled
// back, transact returns nil, and only on SQLite (whose transaction took
// the write lock) does it count as a commit.
func (s *Store) transact(ctx context.Context, fn func(tx *sql.Tx, now time.Time) error) (err error) {
	if err := s.unanswered.wait(ctx); err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	tc := newTransactionContext(ctx)
	tctx := tc.ctx
	var pt *pgTx
	if s.pg != nil {
		pt = &pgTx{begin: s.pg.begin()}
		tctx = context.WithValue(tctx, pgTxKey{}, pt)
	}
	tx, err := s.w.BeginTx(tctx, nil)
	if err != nil {
		tc.end()
		s.noteWrite(err)
		return fmt.Errorf("begin transaction: %w", err)
	}
	var now time.Time
	switch {
	case s.clock != nil:
		now = s.clock().Truncate(time.Microsecond).UTC()
	case pt.now.IsZero():
		// Begun by a connection that is not the store's (pgConn), so
		// without the clock (nor, through a pooler, the statement
		// timeout): nothing may run in it.
		tx.Rollback()
		tc.end()
		return errors.New("begin transaction: the transaction began without reading the server's clock")
	default:
		now = pt.now
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
			err = s.commit(ctx, tx, tc, pt)
		} else {
			tx.Rollback()
			tc.end()
		}
		s.noteWrite(err)
	}()
	return fn(tx, now)
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
