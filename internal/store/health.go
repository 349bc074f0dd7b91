package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"
)

// CheckWrite commits a one-row write, for readiness: a database that
// answers pings may still refuse writes (a full volume, a PostgreSQL
// server turned read-only by a failover), and then no payment can be
// recorded. Every replica writes the same row.
//
// Its COMMIT is never cancelled (commit.go): one that waits for a
// synchronous standby past ctx is reported ErrCommitUnknown, and the
// checks after it fail, with ctx's error, until it has its answer; so
// readiness turns NOT_SERVING while commits wait, rather than reporting a
// write that no standby has.
func (s *Store) CheckWrite(ctx context.Context) error {
	err := s.transact(ctx, func(tx *sql.Tx, _ time.Time) error {
		_, err := tx.ExecContext(ctx, s.d.q(`
			INSERT INTO meta (name, value) VALUES ('write_check', $1)
			ON CONFLICT (name) DO UPDATE SET value = excluded.value`), s.now().UTC().Format(time.RFC3339Nano))
		return err
	})
	if err != nil {
		return s.wrap(fmt.Errorf("write check: %w", err))
	}
	return nil
}

// Write health. A replica whose outcome for a key could not be written
// keeps retrying it (the service's outbox) until the store takes it. Were
// another replica to take the key's record over meanwhile (its lease
// expired while the store was down), it would send the key again after a
// 2xx its holder has received. So the store tracks its own writes: the
// time since which every write transaction it ran committed, with no
// failure and no gap of more than maxWriteGap between commits (a
// heartbeat write keeps it measured when nothing else writes). Taking over
// an expired lease is allowed only once that has lasted TakeoverGrace,
// more than the outbox's longest retry interval plus a write's latency:
// after any outage that this replica saw too, the holder's pending
// outcome lands first (record.Claim.Settled, record.Settle.Settled). Gaps
// are measured on this process's clock (Options.Now, or time.Now's
// monotonic reading), so that tests move it rather than wait.
//
// A replica cut off from the database alone (a partition, not an outage)
// is seen by the others as a dead one: they take its records over once
// its leases and quiet periods end. That, and a holder dying between the
// provider's answer and its commit, are the windows left.

// DefaultTakeoverGrace is Options.TakeoverGrace's default.
const DefaultTakeoverGrace = 5 * time.Second

const (
	// heartbeatEvery is how long the store goes without a committed write
	// before it commits a heartbeat of its own.
	heartbeatEvery = 500 * time.Millisecond
	// maxWriteGap is the longest time between two commits that still
	// counts as continuous health: a write that waited longer (for
	// SQLite's lock held by another process, say) starts a new run.
	maxWriteGap = 1500 * time.Millisecond
	// heartbeatTimeout bounds one heartbeat.
	heartbeatTimeout = 5 * time.Second
)

// writeHealth tracks the run of successful write transactions.
type writeHealth struct {
	mu sync.Mutex
	// since is when the current run of commits began (zero: none), and
	// last when its latest commit ended.
	since, last time.Time
	// resumed is closed when a run begins, and replaced.
	resumed chan struct{}
}

// committed notes a write transaction that committed at end.
func (h *writeHealth) committed(end time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.since.IsZero() || end.Sub(h.last) > maxWriteGap {
		h.since = end
		if h.resumed != nil {
			close(h.resumed)
			h.resumed = nil
		}
	}
	h.last = end
}

// resumedCh is closed when the next run of commits begins.
func (h *writeHealth) resumedCh() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.resumed == nil {
		h.resumed = make(chan struct{})
	}
	return h.resumed
}

// failed notes a write transaction the database failed.
func (h *writeHealth) failed() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.since, h.last = time.Time{}, time.Time{}
}

// healthyFor is how long, at now, writes have been continuously healthy.
func (h *writeHealth) healthyFor(now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.since.IsZero() || now.Sub(h.last) > maxWriteGap {
		return 0
	}
	return now.Sub(h.since)
}

// idleFor is how long it has been since the last commit.
func (h *writeHealth) idleFor(now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last.IsZero() {
		return time.Duration(1<<63 - 1)
	}
	return now.Sub(h.last)
}

// WritesResumed returns a channel closed when this store's writes next
// commit after a failure or a gap: a writer waiting to try again (the
// service's outbox) need wait no longer. Take it before the write whose
// failure it would wait after.
func (s *Store) WritesResumed() <-chan struct{} { return s.health.resumedCh() }

// WriteHealthyFor is how long every write of this store has been
// committing without a failure or a gap: takeovers of expired leases wait
// until it reaches TakeoverGrace.
func (s *Store) WriteHealthyFor() time.Duration { return s.health.healthyFor(s.now()) }

// noteWrite records a write transaction's outcome in the store's health:
// a commit, or a failure of the database (not a refusal of the store's
// own, nor a caller that gave up).
func (s *Store) noteWrite(err error) {
	switch {
	case err == nil:
		s.health.committed(s.now())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, ErrNotFound), errors.Is(err, ErrNotUnknown),
		errors.Is(err, ErrInFlight), errors.Is(err, ErrChanged), errors.Is(err, ErrInboxFull),
		errors.Is(err, ErrWrongEnvironment):
	default:
		s.health.failed()
	}
}

// writesSettled reports whether this store's writes have been healthy for
// the takeover grace.
func (s *Store) writesSettled() bool {
	return s.grace < 0 || s.health.healthyFor(s.now()) >= s.grace
}

// heartbeat commits a write of no consequence whenever no other write has
// committed for heartbeatEvery, until stop is closed: on PostgreSQL a row
// written (one that a read-only standby refuses, and whose COMMIT waits
// for a synchronous standby as any other write's does), on SQLite a BEGIN
// IMMEDIATE and COMMIT, which fail while another process holds the write
// lock.
//
// A heartbeat whose COMMIT waits (for a synchronous standby that is gone)
// gives up after heartbeatTimeout, and the COMMIT is left to its answer
// (commit.go); the next ones wait for that answer and give up in turn, so
// no more commits pile up, and none is counted until one is answered.
func (s *Store) heartbeat(stop <-chan struct{}) {
	t := time.NewTicker(heartbeatEvery / 2)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if s.health.idleFor(s.now()) < heartbeatEvery {
			continue
		}
		s.beat(heartbeatTimeout)
	}
}

// beat commits one heartbeat, giving up after timeout.
func (s *Store) beat(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return s.transact(ctx, func(tx *sql.Tx, _ time.Time) error {
		if s.d.name != "postgres" {
			return nil
		}
		_, err := tx.ExecContext(ctx, heartbeatQuery, s.now().UTC().Format(time.RFC3339Nano))
		return err
	})
}

// heartbeatQuery is PostgreSQL's heartbeat. It writes a row: a standby
// refuses it, and its COMMIT waits for a synchronous standby. (A
// transaction that only takes a transaction ID, SELECT txid_current(),
// writes no WAL before its commit record, and PostgreSQL commits it at
// once with no standby to wait for: counted as health, such heartbeats
// let a replica take over a lease while every write, the holder's outcome
// among them, waited for the standby, checked on PostgreSQL 15.)
const heartbeatQuery = `INSERT INTO meta (name, value) VALUES ('heartbeat', $1)
	ON CONFLICT (name) DO UPDATE SET value = excluded.value`
