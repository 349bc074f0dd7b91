package upstream

import (
	"context"
	"errors"
	"net/http"
	"net/url"
)

// authRefusal reports whether err is the provider's 401 or 403: the key
// was refused, before any work.
func authRefusal(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && (se.Status == http.StatusUnauthorized || se.Status == http.StatusForbidden)
}

// mayStillBeWorkedOn reports whether a request answered with err may
// still be worked on at the provider. Only a 2xx (here, one whose reply
// could not be read) and the refusals that prove the request was not
// acted on say the provider is done with it. Any other status may come
// from something in front of the provider (a proxy's 408, a load
// balancer's 502 or 503, a gateway's 504 or 500) while the request goes
// on behind it.
func mayStillBeWorkedOn(err error) bool {
	var se *StatusError
	if !errors.As(err, &se) {
		return false // a 2xx whose reply was cut off or unreadable
	}
	return !refusedUnprocessed(se.Status)
}

// transportError classifies a failed round trip.
func (c *Client) transportError(ctx context.Context, keys *keySet, err error, wrote bool) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	// url.Error quotes the URL, which holds no secret; the key is in a
	// header and never in an error.
	var uerr *url.Error
	if errors.As(err, &uerr) {
		err = uerr.Err
	}
	sentinel := ErrConnectionLost
	if !wrote {
		sentinel = ErrUnreachable
	}
	// No transport error is known to quote a header value, but the text
	// reaches logs and callers, so make sure.
	if msg := err.Error(); keys.redactString(msg) != msg {
		err = errors.New(keys.redactString(msg))
	}
	return &causeError{sentinel: sentinel, cause: err}
}

// retryable reports whether another request may succeed where this failed,
// and may be made at once: the provider is certainly done with the failed
// request (see mayStillBeWorkedOn). That leaves a request that never reached
// the provider, a 2xx whose reply was cut off (the request again gets the
// same answer from an idempotent provider), and a 429, a refusal before
// any work.
func retryable(err error) bool {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Status == http.StatusTooManyRequests
	}
	return errors.Is(err, ErrUnreachable) || errors.Is(err, ErrConnectionLost)
}

// maybeCreated reports whether a failed request may have created a payment.
func maybeCreated(err error, sent bool) bool {
	if !sent {
		return false
	}
	var se *StatusError
	if errors.As(err, &se) {
		return !refusedUnprocessed(se.Status)
	}
	return true
}

// refusedUnprocessed reports whether a non-2xx status proves that the
// provider did not act on the request, so no payment exists. The provider
// documents only 401 and 403; for the rest this goes by what RFC 9110 and
// RFC 6585 say a status means.
//
// Refusals that happen before the request is acted on prove it: a request
// that is malformed (400), unauthenticated (401), not permitted (403),
// aimed at no resource (404) or with the wrong method (405), that asks for
// a representation the server cannot give (406), lacks a length (411), is
// too large in its body, URI or headers (413, 414, 431), has an unsupported
// media type (415), or is rate-limited (429).
//
// Everything else proves nothing, so a payment may exist: 409 is what a
// provider answers while another request with the same idempotency key is
// in flight, and that request may create the payment; 412, 422, 423 and 425
// may come after some processing; 408 contradicts the whole request having
// been written (ours always is) and is what some proxies send when the
// server behind them is slow; a 3xx is never followed, and says nothing of
// what happened; any other or unknown status, and 5xx, may come after the
// work was done.
func refusedUnprocessed(status int) bool {
	switch status {
	case http.StatusBadRequest,
		http.StatusUnauthorized,
		http.StatusForbidden,
		http.StatusNotFound,
		http.StatusMethodNotAllowed,
		http.StatusNotAcceptable,
		http.StatusLengthRequired,
		http.StatusRequestEntityTooLarge,
		http.StatusRequestURITooLong,
		http.StatusUnsupportedMediaType,
		http.StatusTooManyRequests,
		http.StatusRequestHeaderFieldsTooLarge:
		return true
	}
	return false
}

// breakerVerdict is what a request tells the circuit breaker: transport
// failures and 5xx count against the provider; refusals and the caller's
// own deadline do not.
func breakerVerdict(err error) error {
	if err == nil {
		return nil
	}
	var se *StatusError
	if errors.As(err, &se) {
		if se.Status >= 500 {
			return err
		}
		return nil
	}
	if errors.Is(err, ErrUnreachable) || errors.Is(err, ErrConnectionLost) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err // excluded by the breaker's settings
	}
	return nil
}
