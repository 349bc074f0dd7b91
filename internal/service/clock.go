package service

import "time"

// A Clock is the time callers' certificates are judged by (see
// Options.Clock): what time it is, and a call back once it is a given time,
// so that an open stream ends when its caller's certificate expires.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f, in its own goroutine, once Now reads at or later.
	// stop cancels the call; it reports whether it did so before f was
	// called.
	AfterFunc(at time.Time, f func()) (stop func() bool)
}

// SystemClock is the host's clock.
type SystemClock struct{}

// Now is time.Now.
func (SystemClock) Now() time.Time { return time.Now() }

// AfterFunc calls f once the host's clock reads at.
func (SystemClock) AfterFunc(at time.Time, f func()) (stop func() bool) {
	return time.AfterFunc(time.Until(at), f).Stop
}
