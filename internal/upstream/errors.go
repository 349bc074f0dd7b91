package upstream

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Sentinel causes, found in an *Error with errors.Is.
var (
	// ErrUnreachable means no request reached the provider: the connection
	// could not be made, or failed before the request was written.
	ErrUnreachable = errors.New("provider unreachable")
	// ErrConnectionLost means the request was written but no complete reply
	// came back: the connection was reset or closed, or the reply was cut off.
	ErrConnectionLost = errors.New("connection to provider lost")
	// ErrMalformedReply means a 2xx reply body was not a JSON object.
	ErrMalformedReply = errors.New("provider reply is not a JSON object")
	// ErrReplyTooLarge means a 2xx reply body was over the size limit.
	ErrReplyTooLarge = errors.New("provider reply too large")
	// ErrCircuitOpen means the client refused to call a provider that keeps
	// failing, without sending anything.
	ErrCircuitOpen = errors.New("provider circuit breaker open")
)

// CircuitOpenError is ErrCircuitOpen (errors.Is finds it) with how long
// the breaker stays open: until then every call is refused at once.
type CircuitOpenError struct {
	// RetryAfter is what is left of the breaker's cooldown; zero while
	// its probe is in flight, whose outcome decides.
	RetryAfter time.Duration
}

func (e *CircuitOpenError) Error() string { return ErrCircuitOpen.Error() }

func (e *CircuitOpenError) Unwrap() error { return ErrCircuitOpen }

// StatusError is a provider reply with a non-2xx status.
type StatusError struct {
	Status int
	// Body is the start of the reply body, with the key redacted.
	Body []byte
	// RetryAfter is the provider's Retry-After, capped; zero if absent.
	RetryAfter time.Duration
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("provider answered %d %s", e.Status, http.StatusText(e.Status))
}

// Error is the failure of a call, after every request it made.
type Error struct {
	// Requests is how many requests were sent or tried, counting the first.
	Requests int
	// MaybeCreated reports that some request may have created a payment: the
	// request was written and no definite refusal came back. A retry with
	// the same idempotency key settles it.
	MaybeCreated bool
	// AtProvider reports that the last request may still be at the
	// provider: it was written whole and ended without the provider's
	// answer (a deadline or cancellation cut it off, or the connection was
	// lost before a status came back), or was answered with a status that
	// proves nothing (anything but a 2xx or a refusal before processing:
	// a proxy's 408, a load balancer's 502 or 503, a gateway's 504 may
	// come while the provider works on). Cutting off our side
	// of a request does not stop the provider working on it, so nothing
	// more may be sent with its key until the provider can be presumed
	// done: the client sends no further request, and callers must wait a
	// quiet period from LastRequestStart before sending the key again.
	AtProvider bool
	// LastRequestStart is when the last request began, on this process's
	// monotonic clock.
	LastRequestStart time.Time
	// Err is the last request's failure: a *StatusError, a sentinel of this
	// package, or a context error.
	Err error
}

func (e *Error) Error() string {
	s := fmt.Sprintf("create multi-card payment: %d attempt(s): %v", e.Requests, e.Err)
	if e.MaybeCreated {
		s += " (a payment may have been created)"
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// causeOf is the error beneath this package's sentinel, if the request
// kept it, else err.
func causeOf(err error) error {
	var ce *causeError
	if errors.As(err, &ce) {
		return ce.cause
	}
	return err
}

// causeError is a transport failure: a sentinel of this package, for
// callers, and the transport's own error, for the log.
type causeError struct {
	sentinel error
	cause    error
}

func (e *causeError) Error() string { return e.sentinel.Error() + ": " + e.cause.Error() }

// Unwrap exposes only the sentinel: callers classify by it, and the cause
// (which may wrap a context error from the transport's own timeout) would
// make the classification depend on transport details.
func (e *causeError) Unwrap() error { return e.sentinel }
