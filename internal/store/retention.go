package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"example.com/paymentsd/internal/record"
)

// Retention says how long the store keeps what it keeps.
type Retention struct {
	// Records is how long a record is kept after its last change, and a
	// webhook event after it arrived.
	Records time.Duration
	// Tombstones is how long a deleted record's tombstone is kept.
	Tombstones time.Duration
}

// tombstoneGrace is how long a record outlives its tombstone. A record is
// deleted in two steps: its tombstone is committed first, and the record
// only tombstoneGrace later. Begin's INSERT looks for a tombstone in the
// snapshot its statement started with; were the two written together, an
// INSERT that started before they committed, and then waited on the
// record's deletion, could recreate the record without seeing the
// tombstone (PostgreSQL, READ COMMITTED). Statements are cut off after
// statementTimeout and a tombstoning transaction after tombstoneTxTimeout,
// so by the time a record is deleted every statement that could miss its
// tombstone has ended. (SQLite writes one transaction at a time and can't
// race; the two steps are the same code.)
const (
	tombstoneGrace     = 5 * time.Minute
	tombstoneTxTimeout = 30 * time.Second
)

// DeleteExpired does one round of retention, by the store's clock, each
// step bounded by limit rows and each in a transaction of its own:
//   - deletes records tombstoned at least tombstoneGrace ago;
//   - writes tombstones for records last changed more than r.Records ago
//     (never InProgress ones), marking them for deletion: from then on
//     their keys are expired (Begin answers Expired, Get ErrNotFound);
//   - deletes webhook events received more than r.Records ago;
//   - deletes tombstones written more than r.Tombstones ago.
//
// It returns how many rows it changed in all; call it again while that is
// not zero. A zero duration keeps that kind of thing forever.
func (s *Store) DeleteExpired(ctx context.Context, r Retention, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	var total int
	steps := []struct {
		name string
		run  func(context.Context, *sql.Tx, time.Time) (int64, error)
		keep time.Duration
	}{
		{"delete tombstoned records", s.deleteTombstoned(limit), r.Records},
		{"tombstone records", s.tombstoneRecords(r.Records, limit), r.Records},
		{"delete events", s.deleteEvents(r.Records, limit), r.Records},
		{"delete tombstones", s.deleteTombstones(r.Tombstones, limit), r.Tombstones},
	}
	for _, step := range steps {
		if step.keep <= 0 {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, tombstoneTxTimeout)
		var n int64
		err := s.transact(sctx, func(tx *sql.Tx, now time.Time) error {
			var err error
			n, err = step.run(sctx, tx, now)
			if err == nil && n == 0 {
				return errNoWrite
			}
			return err
		})
		cancel()
		if err != nil {
			return total, s.wrap(fmt.Errorf("retention: %s: %w", step.name, err))
		}
		total += int(n)
	}
	return total, nil
}

func (s *Store) deleteTombstoned(limit int) func(context.Context, *sql.Tx, time.Time) (int64, error) {
	d := s.d
	return func(ctx context.Context, tx *sql.Tx, now time.Time) (int64, error) {
		res, err := tx.ExecContext(ctx, d.q(`
			DELETE FROM records WHERE `+d.keyCol+` IN (
				SELECT `+d.keyCol+` FROM records
				WHERE tombstoned_at IS NOT NULL AND tombstoned_at <= $1 AND state <> $2
				ORDER BY tombstoned_at LIMIT $3 `+d.skipLocked+`)`),
			d.t(now.Add(-tombstoneGrace)), int(record.InProgress), limit)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
}

func (s *Store) tombstoneRecords(keep time.Duration, limit int) func(context.Context, *sql.Tx, time.Time) (int64, error) {
	d := s.d
	return func(ctx context.Context, tx *sql.Tx, now time.Time) (int64, error) {
		rows, err := tx.QueryContext(ctx, d.q(`
			SELECT key, body_sha256, state, gave_up, created_at, updated_at, caller FROM records
			WHERE updated_at < $1 AND state <> $2 AND tombstoned_at IS NULL
			ORDER BY updated_at LIMIT $3 `+d.skipLocked),
			d.t(now.Add(-keep)), int(record.InProgress), limit)
		if err != nil {
			return 0, err
		}
		type expiring struct {
			key string
			t   Tombstone
		}
		var es []expiring
		func() {
			defer rows.Close()
			for rows.Next() {
				var e expiring
				var state int
				if err = rows.Scan(&e.key, shaCol{&e.t.BodySHA256}, &state, &e.t.GaveUp,
					timeCol{&e.t.CreatedAt}, timeCol{&e.t.UpdatedAt}, &e.t.Caller); err != nil {
					return
				}
				e.t.State, e.t.KeySHA256, e.t.ExpiredAt, e.t.CallerKnown = record.State(state), keySHA256(e.key), now, true
				es = append(es, e)
			}
			err = rows.Err()
		}()
		if err != nil {
			return 0, err
		}
		for _, e := range es {
			t := e.t
			if _, err := tx.ExecContext(ctx, d.q(`
				INSERT INTO tombstones (`+tombstoneRead+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
				ON CONFLICT (key_sha256) DO UPDATE SET body_sha256 = excluded.body_sha256,
					state = excluded.state, gave_up = excluded.gave_up, created_at = excluded.created_at,
					updated_at = excluded.updated_at, expired_at = excluded.expired_at, caller = excluded.caller`),
				t.KeySHA256[:], t.BodySHA256[:], int(t.State), t.GaveUp, d.t(t.CreatedAt), d.t(t.UpdatedAt), d.t(t.ExpiredAt), t.Caller); err != nil {
				return 0, fmt.Errorf("write tombstone: %w", err)
			}
			if _, err := tx.ExecContext(ctx, d.q(`UPDATE records SET tombstoned_at = $2 WHERE `+d.keyCol+` = $1`),
				d.k(e.key), d.t(now)); err != nil {
				return 0, fmt.Errorf("mark tombstoned: %w", err)
			}
		}
		return int64(len(es)), nil
	}
}

func (s *Store) deleteEvents(keep time.Duration, limit int) func(context.Context, *sql.Tx, time.Time) (int64, error) {
	d := s.d
	return func(ctx context.Context, tx *sql.Tx, now time.Time) (int64, error) {
		res, err := tx.ExecContext(ctx, d.q(`
			DELETE FROM events WHERE seq IN (
				SELECT seq FROM events WHERE received_at < $1
				ORDER BY seq LIMIT $2 `+d.skipLocked+`)`),
			d.t(now.Add(-keep)), limit)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
}

func (s *Store) deleteTombstones(keep time.Duration, limit int) func(context.Context, *sql.Tx, time.Time) (int64, error) {
	d := s.d
	return func(ctx context.Context, tx *sql.Tx, now time.Time) (int64, error) {
		res, err := tx.ExecContext(ctx, d.q(`
			DELETE FROM tombstones WHERE key_sha256 IN (
				SELECT key_sha256 FROM tombstones WHERE expired_at < $1
				ORDER BY expired_at LIMIT $2 `+d.skipLocked+`)`),
			d.t(now.Add(-keep)), limit)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
}
