package main

import (
	"strings"
	"time"
)

// hookValues are the settings a test binary may change (testhooks_on.go);
// their zero values mean "as in production".
type hookValues struct {
	// clock, if set, is this process's clock, as if the host's were off
	// by some amount. The record store goes by it only for SQLite, whose
	// database is on this host; PostgreSQL goes by its server's clock.
	clock func() time.Time
	// retentionInterval, if set, is how often retention runs.
	retentionInterval time.Duration
}

// storeClock is the clock the record store at databaseURL should decide
// by: nil, its own default, unless this process's clock is hooked and the
// store is SQLite (whose default is this host's clock).
func (h hookValues) storeClock(databaseURL string) func() time.Time {
	if h.clock != nil && strings.HasPrefix(databaseURL, "sqlite:") {
		return h.clock
	}
	return nil
}
