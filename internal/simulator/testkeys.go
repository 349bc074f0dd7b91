package simulator

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Test keys: an idempotency key that starts with one of these prefixes
// makes the fake answer its own way, so that a caller can rehearse every
// outcome against paymentsd --simulate, as card networks' test card
// numbers do. They are the simulator's rules, not the provider's: the
// provider documents none of this. Any other key gets the default
// behaviour.
const (
	// KeyDecline: every request is refused 400, and no payment is made.
	KeyDecline = "sim-decline-"
	// KeyStatus, followed by an HTTP status from 400 to 599 and a hyphen
	// (sim-status-503-…): every request is answered with that status, and
	// no payment is made.
	KeyStatus = "sim-status-"
	// KeySlow: the payment is made, and every answer comes after
	// SlowDelay.
	KeySlow = "sim-slow-"
	// KeyHang: the first request makes the payment, but its answer never
	// comes: the fake holds it until the client gives up. Later requests
	// get the payment it made.
	KeyHang = "sim-hang-"
	// KeyReset: the first request's connection is reset as it arrives,
	// before any payment is made. Later requests make it as usual.
	KeyReset = "sim-reset-"
	// KeyLost: the first request makes the payment, then its connection
	// is reset: the answer is lost. Later requests get the payment it
	// made.
	KeyLost = "sim-lost-"
	// KeyInDoubt: every request is answered 409 Conflict, as a provider
	// still working on an earlier request with the key might answer, and
	// no payment is made: the client can never learn the outcome.
	KeyInDoubt = "sim-in-doubt-"
)

// SlowDelay is how long a KeySlow answer takes.
const SlowDelay = time.Second

// TestKeys returns the script that plays the test keys (see KeyDecline and
// the rest); it is paymentsd --simulate's. Use it on an Idempotent server:
// the keys whose later requests get the payment an earlier one made rely
// on the server remembering it.
func (s *Server) TestKeys() Script {
	return func(_ int, r Request) Reply {
		key := idempotencyKey(r.Body)
		first := s.KeyStats(key).Requests == 1
		switch {
		case strings.HasPrefix(key, KeyDecline):
			return errorReply(http.StatusBadRequest, "declined by the simulator: the idempotency key starts with "+KeyDecline)
		case strings.HasPrefix(key, KeyStatus):
			code, ok := testKeyStatus(strings.TrimPrefix(key, KeyStatus))
			if !ok {
				return errorReply(http.StatusBadRequest, "the simulator's test key "+KeyStatus+"NNN- needs a status NNN from 400 to 599, then a hyphen")
			}
			return errorReply(code, "answered "+strconv.Itoa(code)+" by the simulator: the idempotency key starts with "+KeyStatus+strconv.Itoa(code)+"-")
		case strings.HasPrefix(key, KeySlow):
			return Reply{Delay: SlowDelay}
		case strings.HasPrefix(key, KeyHang) && first:
			// The payment is made on arrival; the answer waits until the
			// client has gone.
			return Reply{Wait: make(chan struct{})}
		case strings.HasPrefix(key, KeyReset) && first:
			// A scripted Status stops the payment being made; it is
			// never sent, since the connection is reset instead.
			return Reply{Status: http.StatusInternalServerError, Fault: Reset}
		case strings.HasPrefix(key, KeyLost) && first:
			return Reply{Fault: Reset}
		case strings.HasPrefix(key, KeyInDoubt):
			return errorReply(http.StatusConflict, "still working on an earlier request with this idempotency key (the simulator's "+KeyInDoubt+" test key: it never answers otherwise)")
		}
		return Reply{}
	}
}

// testKeyStatus reads the NNN- after KeyStatus.
func testKeyStatus(rest string) (int, bool) {
	digits, _, ok := strings.Cut(rest, "-")
	if !ok || len(digits) != 3 {
		return 0, false
	}
	code, err := strconv.Atoi(digits)
	if err != nil || code < 400 || code > 599 {
		return 0, false
	}
	return code, true
}
