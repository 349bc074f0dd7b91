//go:build paymentsd_testhooks

package config

import (
	"time"
)

// loadHooks reads what this test binary (built with -tags
// paymentsd_testhooks) lets a test change, from PAYMENTSD_TESTHOOK_*
// variables. A production build has none of them.
func loadHooks(getenv func(string) string, problem func(string, ...any)) Hooks {
	var h Hooks
	if v := getenv("PAYMENTSD_TESTHOOK_CLOCK_OFFSET"); v != "" {
		// A replica whose clock is this far from the true time.
		off, err := time.ParseDuration(v)
		if err != nil {
			problem("PAYMENTSD_TESTHOOK_CLOCK_OFFSET: want a duration")
		}
		h.Clock = offsetClock(off)
	}
	if v := getenv("PAYMENTSD_TESTHOOK_RETENTION_INTERVAL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			problem("PAYMENTSD_TESTHOOK_RETENTION_INTERVAL: want a duration")
		}
		h.RetentionInterval = d
	}
	return h
}
