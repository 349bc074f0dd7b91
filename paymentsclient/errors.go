package paymentsclient

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// errorDomain is the domain of paymentsd's google.rpc.ErrorInfo details.
const errorDomain = "paymentsd.example.com"

// ErrorInfo reasons paymentsd sends (service.Reason*). They are repeated
// here rather than imported: the service package links in the server.
const (
	ReasonNotCreated       = "PAYMENT_NOT_CREATED"
	ReasonOutcomeUnknown   = "PAYMENT_OUTCOME_UNKNOWN"
	ReasonNotSent          = "REQUEST_NOT_SENT"
	ReasonInProgress       = "PAYMENT_IN_PROGRESS"
	ReasonKeyReused        = "IDEMPOTENCY_KEY_REUSED"
	ReasonKeyExpired       = "IDEMPOTENCY_KEY_EXPIRED"
	ReasonKeyNotOwned      = "IDEMPOTENCY_KEY_NOT_OWNED"
	ReasonCallerNotAllowed = "CALLER_NOT_ALLOWED"
)

// Sentinels for errors.Is. Every error Create and Get return is an *Error
// that matches exactly one of the "what happened to the money" sentinels
// (ErrNotCreated, ErrOutcomeUnknown, ErrInProgress, ErrKeyReused,
// ErrKeyExpired, ErrKeyNotOwned, ErrCallerNotAllowed, ErrNotFound,
// ErrNotReached), and
// possibly ErrInvalidRequest as well. One from a call that ran out of time
// matches the context's error too: context.DeadlineExceeded or
// context.Canceled.
var (
	// ErrNotCreated: paymentsd knows no payment exists for the key, and
	// every attempt the call made was answered, so none is still on its
	// way to paymentsd. It is the only error after which the caller may
	// pay again under a new key.
	ErrNotCreated = errors.New("no payment was created")
	// ErrOutcomeUnknown: a payment may have been created. Retry later with
	// the same idempotency key (or look it up with Get) to learn the
	// outcome; never pay again under a new key.
	ErrOutcomeUnknown = errors.New("the payment's outcome is unknown: retry with the same idempotency key, or look it up later; never pay again under a new key")
	// ErrInProgress: a request with the key is at the provider now, or may
	// still be. Check later with Get, or retry with the same key; never
	// pay again under a new key.
	ErrInProgress = errors.New("the payment is in progress: check later with the same idempotency key; never pay again under a new key")
	// ErrKeyReused: the key was first used for a different request; nothing
	// was sent for this one. The first request's payment may exist.
	ErrKeyReused = errors.New("the idempotency key was first used for a different request")
	// ErrKeyExpired: the key's record was deleted by paymentsd's retention
	// and the key is refused for good; nothing was sent. Look the payment
	// up in the provider's dashboard.
	ErrKeyExpired = errors.New("the idempotency key has expired")
	// ErrKeyNotOwned: the key belongs to another caller; nothing was sent.
	ErrKeyNotOwned = errors.New("the idempotency key belongs to another caller")
	// ErrCallerNotAllowed: this caller's certificate is not on the
	// deployment's allowlist; nothing was sent by this call.
	ErrCallerNotAllowed = errors.New("the caller is not allowed")
	// ErrInvalidRequest: the request is invalid (paymentsd's validation,
	// an empty idempotency key, or the provider's 400). Fix it.
	ErrInvalidRequest = errors.New("the request is invalid")
	// ErrNotFound: Get found no record of the key.
	ErrNotFound = errors.New("no record of the idempotency key")
	// ErrNotReached: no attempt reached a paymentsd, so nothing was sent
	// by this call. Usually the client's configuration is wrong: its
	// target is not paymentsd's gRPC port (the REST port, another gRPC
	// server, a host that does not exist, nothing listening), or TLS does
	// not match the port (TLS to a plaintext port, a certificate the
	// client does not trust). The error's Err says which. Earlier calls
	// with the key stand: fix the configuration and retry with the same
	// key; never pay again under a new one.
	ErrNotReached = errors.New("paymentsd was not reached, so nothing was sent: check the client's target address, port and TLS settings, then retry with the same idempotency key")
)

// Error is the error Create and Get return. It matches its sentinel with
// errors.Is, and the context's error too when the call stopped because its
// context ended or its deadline drew near (errors.Is(err,
// context.DeadlineExceeded), errors.Is(err, context.Canceled)). It unwraps
// to the last gRPC status error (status.FromError and status.Code see
// through it).
type Error struct {
	// Code is the last gRPC code paymentsd (or the transport) answered.
	Code codes.Code
	// Reason is the last ErrorInfo reason paymentsd gave, or "".
	Reason string
	// IdempotencyKey is the key the call was made with.
	IdempotencyKey string
	// State is the key's record state, when Create looked the key up after
	// its context ended; PAYMENT_STATE_UNSPECIFIED otherwise.
	State paymentsv1.PaymentState
	// Attempts is how many calls Create or Get made to paymentsd.
	Attempts int
	// RetryAfter is paymentsd's last RetryInfo delay, or 0.
	RetryAfter time.Duration
	// Err is the last error from the transport or paymentsd (a gRPC status
	// error), or nil when nothing was sent.
	Err error

	kind error
	// ctxErr is the context's error when the call stopped for lack of
	// time, else nil.
	ctxErr error
	// unanswered: an attempt ended without paymentsd's answer (a
	// transport failure, or cut off) after it may have left this process,
	// so it may reach paymentsd yet.
	unanswered bool
	// reached: an attempt reached paymentsd, or may have.
	reached bool
	// target is the client connection's target, for ErrNotReached.
	target string
	// lookup: the error is Get's, whose ErrOutcomeUnknown means the
	// record could not be read, and is said so.
	lookup bool
}

// lookupFailed is what Get's ErrOutcomeUnknown says: the lookup's own
// words, not Create's advice on paying.
const lookupFailed = "paymentsd's record of the key could not be read, so what it says is not known: look the key up again later"

// Error says what happened to the money, for the key, and why.
func (e *Error) Error() string {
	var b strings.Builder
	what := fmt.Sprint(e.kind)
	if e.lookup && e.kind == ErrOutcomeUnknown {
		what = lookupFailed
	}
	fmt.Fprintf(&b, "paymentsclient: idempotency key %q: %s", e.IdempotencyKey, what)
	if e.kind == ErrNotReached && e.target != "" {
		fmt.Fprintf(&b, " (target %q)", e.target)
	}
	if e.State != paymentsv1.PaymentState_PAYMENT_STATE_UNSPECIFIED {
		fmt.Fprintf(&b, " (record state %s)", e.State)
	}
	if e.Attempts > 0 {
		fmt.Fprintf(&b, " after %d attempt(s)", e.Attempts)
	}
	if e.unanswered {
		b.WriteString(", one of them unanswered and perhaps still on its way to paymentsd")
	}
	if e.ctxErr != nil {
		fmt.Fprintf(&b, " (%v)", e.ctxErr)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

// Is reports whether target is the error's sentinel, or the context's
// error that stopped the call. A request the provider refused as invalid
// is both ErrNotCreated and ErrInvalidRequest; a lookup of an expired key
// is both ErrKeyExpired and ErrNotFound.
func (e *Error) Is(target error) bool {
	if e.ctxErr != nil && target == e.ctxErr {
		return true
	}
	switch target {
	case e.kind:
		return true
	case ErrInvalidRequest:
		return e.kind == ErrNotCreated && e.Code == codes.InvalidArgument
	case ErrNotFound:
		return e.kind == ErrKeyExpired && e.Code == codes.NotFound
	}
	return false
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// answer is what one attempt's error says.
type answer struct {
	st         *status.Status
	reason     string
	retryAfter time.Duration // RetryInfo, 0 if none
}

func readAnswer(err error) answer {
	st := status.Convert(err)
	a := answer{st: st}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == errorDomain {
				a.reason = d.GetReason()
			}
		case *errdetails.RetryInfo:
			a.retryAfter = d.GetRetryDelay().AsDuration()
		}
	}
	return a
}

// verdict is what Create does after an answer.
type verdict int

const (
	retry  verdict = iota // retry with the same key
	stop                  // terminal: return kind
	lookUp                // stop, and answer from the key's record
)

// classify decides what an answer to CreateMultiCardPayment means. It is
// the client's retry table (see the package comment).
func classify(a answer) (verdict, error) {
	code := a.st.Code()
	switch a.reason {
	case ReasonKeyReused:
		return stop, ErrKeyReused
	case ReasonKeyExpired:
		return stop, ErrKeyExpired
	case ReasonKeyNotOwned:
		return stop, ErrKeyNotOwned
	case ReasonCallerNotAllowed:
		return stop, ErrCallerNotAllowed
	case ReasonNotCreated:
		// A transient refusal (provider unreachable, circuit open, rate
		// limited) is worth another try with the same key; any other is
		// final.
		if code == codes.Unavailable || code == codes.ResourceExhausted {
			return retry, nil
		}
		return stop, ErrNotCreated
	case ReasonNotSent:
		if code == codes.InvalidArgument {
			return stop, ErrInvalidRequest
		}
		return retry, nil
	case ReasonOutcomeUnknown, ReasonInProgress:
		return retry, nil
	case "":
	default:
		// A reason this client does not know: whatever it means for the
		// money, the key's record says.
		return lookUp, nil
	}
	// No reason: the transport's answer, or paymentsd's before it read
	// the request. A request that may have reached paymentsd may have
	// been sent on, so a retry with the same key is the only safe move.
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted, codes.Internal, codes.Unknown, codes.Canceled:
		return retry, nil
	case codes.InvalidArgument:
		return stop, ErrInvalidRequest
	}
	return lookUp, nil
}
