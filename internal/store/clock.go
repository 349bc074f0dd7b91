package store

import (
	"context"
	"time"
)

// The store's clock. Every time the store decides by (leases, settlement
// windows, quiet periods, retention) comes from one clock, read as each
// write transaction begins (transact): for SQLite, whose database lives on
// this host, this process's (Options.Now, by default time.Now); for
// PostgreSQL, whose replicas may run on hosts whose clocks disagree, the
// database server's (now(), the transaction's start, read by the round
// trip that begins it: pgtx.go). So two replicas whose clocks are apart
// still agree on whether a lease has expired, and never both hold a key.
// Callers pass durations, never times, and compare a record's times only
// with its ReadAt.

// readNow is the store's clock as a read in a transaction that began at
// now came back, a read run from ran (this process's clock, taken once
// the transaction had begun): the store's own clock read again, or, for
// the database server's, now plus the time since ran as this process
// measured it.
func (s *Store) readNow(now, ran time.Time) time.Time {
	var t time.Time
	if s.clock != nil {
		t = s.clock().Truncate(time.Microsecond).UTC()
	} else {
		t = now.Add(time.Since(ran)).Truncate(time.Microsecond)
	}
	if t.Before(now) {
		return now
	}
	return t
}

// readClock is the SQL expression a read adds to its columns for the
// database server's clock, or NULL when the store keeps its own.
func (s *Store) readClock() string {
	if s.clock != nil {
		return "NULL"
	}
	return "now()"
}

// readTime is the store's clock for a read whose readClock column held
// server.
func (s *Store) readTime(server time.Time) time.Time {
	if s.clock != nil {
		return s.clock().Truncate(time.Microsecond).UTC()
	}
	return server
}

// ClockOffset measures how far local, this process's clock, is ahead of
// the store's (negative if behind). For PostgreSQL it asks the server for
// its clock and takes the midpoint of the round trip, so the result is
// good to about half of it; for a store that keeps its own clock it
// compares the two directly.
func (s *Store) ClockOffset(ctx context.Context, local func() time.Time) (time.Duration, error) {
	if s.clock != nil {
		return local().Sub(s.clock()), nil
	}
	before := local()
	var server time.Time
	if err := s.w.QueryRowContext(ctx, `SELECT clock_timestamp()`).Scan(&server); err != nil {
		return 0, s.wrap(err)
	}
	after := local()
	mid := before.Add(after.Sub(before) / 2)
	return mid.Sub(server), nil
}
