package config

import (
	"strings"
	"time"

	"example.com/paymentsd/internal/service"
)

// Hooks are the settings a test binary may change (testhooks_on.go, built
// only with -tags paymentsd_testhooks, or a test that starts the daemon in
// its own process); their zero values mean "as in production".
type Hooks struct {
	// Clock, if set, is this process's clock, as if the host's were off
	// by some amount (or, in a test, as the test moves it). The record
	// store goes by it only for SQLite, whose database is on this host;
	// PostgreSQL goes by its server's clock.
	Clock service.Clock
	// RetentionInterval, if set, is how often retention runs.
	RetentionInterval time.Duration
}

// Now is the hooked clock's Now, or nil, its users' own default, when the
// clock is not hooked.
func (h Hooks) Now() func() time.Time {
	if h.Clock == nil {
		return nil
	}
	return h.Clock.Now
}

// StoreClock is the clock the record store at databaseURL should decide
// by: nil, its own default, unless this process's clock is hooked and the
// store is SQLite (whose default is this host's clock).
func (h Hooks) StoreClock(databaseURL string) func() time.Time {
	if h.Clock != nil && strings.HasPrefix(databaseURL, "sqlite:") {
		return h.Clock.Now
	}
	return nil
}

// offsetClock is the host's clock off by a fixed amount.
type offsetClock time.Duration

func (c offsetClock) Now() time.Time { return time.Now().Add(time.Duration(c)) }

func (c offsetClock) AfterFunc(at time.Time, f func()) (stop func() bool) {
	return time.AfterFunc(at.Sub(c.Now()), f).Stop
}
