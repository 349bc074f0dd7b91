package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"example.com/paymentsd/internal/record"
)

// Settlement reads its candidates a page at a time, and no more than
// settleScan of each kind per pass.
const (
	settlePage = 32
	settleScan = 512
)

// SettleDue is one pass of settlement, in one transaction, by the store's
// clock: for each candidate, record.Step decides on ev (the store sets
// ev.Settled; ev.Pending is pending(key)) whether to acquire it for
// settlement (Acquired: WriteAcquire, or WriteTakeOver with its
// holder's attempt ended, abandoned), to give up on it (GaveUp:
// WriteGiveUp, or WriteAbandon), or to leave it. It acquires at most
// acquire records, all under ev.Owner, and gives up on any number; it
// returns both as written. With acquire 0 it only gives up.
//
// The candidates are OutcomeUnknown records not given up whose next
// settlement or window's end has come, and InProgress records whose lease
// has expired, read in that order (by time, then key), a page at a time,
// until acquire are acquired or settleScan of each were read: so that
// candidates Step leaves (quiet, held by this process, pending) never keep
// the others waiting. In PostgreSQL a replica skips the records another
// has locked; no record is acquired by two at once.
func (s *Store) SettleDue(ctx context.Context, ev record.Settle, pending func(key string) bool, acquire int) (acquired, gaveUp []record.Record, err error) {
	err = s.transact(ctx, func(tx *sql.Tx, now time.Time) error {
		acquired, gaveUp = nil, nil
		wrote := false
		ev.Settled = s.writesSettled()
		full := func() bool { return acquire > 0 && len(acquired) >= acquire }
		for _, q := range []string{s.stmts.dueLeases, s.stmts.dueUnknown} {
			if full() {
				break
			}
			err := s.scanDue(ctx, tx, q, now, func(r *record.Record) (bool, error) {
				ev.Pending = pending != nil && pending(r.Key)
				n, eff := record.Step(r, ev, now)
				switch eff.Verdict {
				case record.GaveUp:
					gaveUp = append(gaveUp, n)
				case record.Acquired:
					if acquire <= 0 {
						return true, nil // it only gives up
					}
					acquired = append(acquired, n)
				default:
					return true, nil
				}
				wrote = true
				return !full(), s.apply(ctx, tx, r, &n, eff, 0)
			})
			if err != nil {
				return err
			}
		}
		if !wrote {
			return errNoWrite
		}
		return nil
	})
	if err != nil {
		return nil, nil, s.wrap(fmt.Errorf("settle: %w", err))
	}
	return acquired, gaveUp, nil
}

// scanDue reads the candidates query q finds at now, a page at a time,
// each read and locked, calling each (in order) until it reports false,
// or settleScan were read.
func (s *Store) scanDue(ctx context.Context, tx *sql.Tx, q string, now time.Time, each func(*record.Record) (bool, error)) error {
	d := s.d
	st, err := s.txStmt(ctx, tx, q)
	if err != nil {
		return err
	}
	// Before every candidate: before the zero time, which some hold.
	at, key := time.Time{}.Add(-time.Microsecond), d.tie([]byte{})
	for read := 0; read < settleScan; {
		rows, err := st.QueryContext(ctx, d.t(now), d.t(at), key, settlePage)
		if err != nil {
			return err
		}
		page, err := scanRecords(rows, now)
		if err != nil {
			return err
		}
		for i := range page {
			r := &page[i]
			more, err := each(r)
			if err != nil || !more {
				return err
			}
			at, key = r.NextSettleAt, d.k(r.Key)
			if r.State == record.InProgress {
				at = r.LeaseExpiresAt
			}
		}
		if len(page) < settlePage {
			return nil
		}
		read += len(page)
	}
	return nil
}
