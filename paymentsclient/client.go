// Package paymentsclient is the Go client for paymentsd's PaymentsService.
// It turns paymentsd's answers, whose ErrorInfo reasons say what happened
// to the money, into the retries that are safe and the errors a caller can
// act on. docs/client.md is its contract in full.
//
// The idempotency key is the caller's: choose one with NewIdempotencyKey
// when the customer decides to pay, keep it with the order, and use it for
// every retry of that payment, in this process or after a restart. Create
// sends it unchanged and never makes up a key of its own; a request with
// an empty key is refused before anything is sent (ErrInvalidRequest).
//
// Create retries with the same key until its context is nearly over, and
// then looks the key up to answer from paymentsd's record:
//
//	answer                                            Create
//	success                                           returns the payment
//	PAYMENT_OUTCOME_UNKNOWN, PAYMENT_IN_PROGRESS      retries, same key
//	REQUEST_NOT_SENT (but not INVALID_ARGUMENT)       retries, same key
//	PAYMENT_NOT_CREATED with UNAVAILABLE or
//	  RESOURCE_EXHAUSTED (provider unreachable,
//	  circuit open, rate limited)                     retries, same key
//	no reason: UNAVAILABLE, DEADLINE_EXCEEDED,
//	  RESOURCE_EXHAUSTED, ABORTED, INTERNAL,
//	  UNKNOWN, CANCELED (transport failures)          retries, same key
//	PAYMENT_NOT_CREATED otherwise                     ErrNotCreated (see below)
//	REQUEST_NOT_SENT or no reason, INVALID_ARGUMENT   ErrInvalidRequest
//	IDEMPOTENCY_KEY_REUSED                            ErrKeyReused
//	IDEMPOTENCY_KEY_EXPIRED                           ErrKeyExpired
//	IDEMPOTENCY_KEY_NOT_OWNED                         ErrKeyNotOwned
//	CALLER_NOT_ALLOWED                                ErrCallerNotAllowed
//	anything else                                     looks the key up
//
// A call none of whose attempts reached a paymentsd returns ErrNotReached,
// a configuration error: nothing was sent, so it says nothing of the money.
// It stops at once when what answered is certainly not paymentsd's gRPC
// port (paymentsd's REST port, another gRPC server, a certificate the
// client does not trust, TLS to a plaintext port). When nothing answers at
// all (nothing listening, a name that does not resolve), paymentsd may be
// starting: a Client that has never reached paymentsd goes on trying for
// WithNotReachedTimeout (10 s by default), one that has (an outage) until
// its deadline, as for any UNAVAILABLE. An attempt that had a connection
// to paymentsd and lost it may have reached it, and is never
// ErrNotReached.
//
// ErrNotCreated is said only when every attempt Create made was answered
// by paymentsd. An attempt that got no answer after it may have left this
// process (cut off by a timeout, a connection lost under it) may reach
// paymentsd later, even after another attempt's PAYMENT_NOT_CREATED, and
// create the payment then: while one is unaccounted for, Create says
// ErrOutcomeUnknown instead, whatever paymentsd or its record said.
//
// Retries wait for paymentsd's RetryInfo delay when it gives one, else a
// jittered exponential backoff (100 ms doubling to 5 s by default). Create
// returns no later than its context's deadline. It makes attempts until
// the lookup's reserve before the deadline (WithLookupTimeout, 2 s by
// default, but never more than a quarter of the time the context had when
// Create was called), or until the attempts allowed by WithMaxAttempts are
// spent, and then looks the key up within what is left: a SUCCEEDED record
// returns the payment, NOT_CREATED is ErrNotCreated (if every attempt was
// answered), IN_PROGRESS is ErrInProgress, a record of another request
// under the key (a different amount or currency) is ErrKeyReused, and
// anything else, a failed lookup included, is ErrOutcomeUnknown. A
// cancelled context ends Create at once, without a lookup. An error from a
// Create that ran out of time also matches the context's error
// (context.DeadlineExceeded or context.Canceled) with errors.Is. Only
// ErrNotCreated allows paying again under a new key.
//
// Give Create a context with a deadline: without one it retries until the
// context is cancelled.
package paymentsclient

import (
	"context"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// Defaults for the options.
const (
	DefaultBackoffBase   = 100 * time.Millisecond
	DefaultBackoffMax    = 5 * time.Second
	DefaultLookupTimeout = 2 * time.Second
)

// Client calls paymentsd. It is safe for concurrent use.
type Client struct {
	rpc               paymentsv1.PaymentsServiceClient
	backoffBase       time.Duration
	backoffMax        time.Duration
	lookupTimeout     time.Duration
	attemptTimeout    time.Duration
	maxAttempts       int
	notReachedTimeout time.Duration
	callOpts          []grpc.CallOption
	// target is conn's target, for ErrNotReached's message; "" if conn
	// does not say.
	target string
	// reached is set once a call has reached paymentsd.
	reached atomic.Bool
}

// Option configures a Client.
type Option func(*Client)

// WithBackoff sets the backoff between attempts when paymentsd gives no
// RetryInfo: a random delay up to base, doubling each attempt, capped at
// max.
func WithBackoff(base, max time.Duration) Option {
	return func(c *Client) {
		if base > 0 {
			c.backoffBase = base
		}
		if max >= c.backoffBase {
			c.backoffMax = max
		}
	}
}

// WithLookupTimeout bounds the lookup Create makes when its attempts end
// without a verdict. When Create's context has a deadline, the attempts
// stop that long before it (but never more than a quarter of the time the
// context had when Create was called), so that the lookup fits before the
// deadline. Zero means no lookup.
func WithLookupTimeout(d time.Duration) Option {
	return func(c *Client) { c.lookupTimeout = d }
}

// WithAttemptTimeout bounds each attempt, so that one lost on a dead
// connection is retried within the context's deadline. paymentsd detaches
// the provider's request from the caller, so an attempt cut off is retried
// with the same key and gets the request's outcome. Zero (the default)
// means attempts are bounded by the context only.
func WithAttemptTimeout(d time.Duration) Option {
	return func(c *Client) { c.attemptTimeout = d }
}

// WithMaxAttempts caps the attempts Create makes; once spent it looks the
// key up as when the context ends. Zero (the default) means no cap.
func WithMaxAttempts(n int) Option {
	return func(c *Client) { c.maxAttempts = n }
}

// WithCallOptions adds gRPC call options to every call.
func WithCallOptions(opts ...grpc.CallOption) Option {
	return func(c *Client) { c.callOpts = append(c.callOpts, opts...) }
}

// New returns a Client that calls paymentsd over conn, for example a
// *grpc.ClientConn from DialTLS or grpc.NewClient.
func New(conn grpc.ClientConnInterface, opts ...Option) *Client {
	c := &Client{
		rpc:               paymentsv1.NewPaymentsServiceClient(conn),
		backoffBase:       DefaultBackoffBase,
		backoffMax:        DefaultBackoffMax,
		lookupTimeout:     DefaultLookupTimeout,
		notReachedTimeout: DefaultNotReachedTimeout,
	}
	if t, ok := conn.(interface{ Target() string }); ok {
		c.target = t.Target()
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Create creates a multi-card payment with req's idempotency key, retrying
// with the same key as the package comment says, and returns no later than
// ctx's deadline. It never changes req, and never sends another key. A
// payment replayed from paymentsd's record, or read from it at the end,
// comes back with Replayed set. Every error is an *Error.
func (c *Client) Create(ctx context.Context, req *paymentsv1.CreateMultiCardPaymentRequest) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	key := req.GetIdempotencyKey()
	if key == "" {
		return nil, &Error{
			Code: codes.InvalidArgument,
			Err:  status.Error(codes.InvalidArgument, "the idempotency key is empty: choose one with NewIdempotencyKey when the payment is decided, and keep it for every retry of that payment; nothing was sent"),
			kind: ErrInvalidRequest,
		}
	}
	e := &Error{IdempotencyKey: key, target: c.target}
	// Attempts, and the waits between them, end in time for the lookup.
	actx, cancel := c.attemptWindow(ctx)
	defer cancel()
	var notConnectedSince time.Time
	for {
		var at peer.Peer
		resp, err := c.attempt(actx, req, grpc.Peer(&at))
		e.Attempts++
		if err == nil {
			c.reached.Store(true)
			return resp, nil
		}
		a := readAnswer(err)
		r := reachOf(a, at)
		if r == reachedPaymentsd {
			c.reached.Store(true)
			e.reached = true
			if a.reason == "" {
				// No answer from paymentsd, and the attempt had a
				// connection to go out on: it may have been cut off on
				// its way, and may reach paymentsd yet. (One refused
				// before it had a connection never left this process.)
				e.unanswered = true
			}
		}
		e.Code, e.Reason, e.RetryAfter, e.Err = a.st.Code(), a.reason, a.retryAfter, err
		if r != reachedPaymentsd && !e.reached && (r == notPaymentsd || c.gaveUpReaching(&notConnectedSince)) {
			// Nothing this call sent has reached paymentsd, and
			// retrying won't reach it.
			e.kind = ErrNotReached
			return nil, e
		}
		if r == notPaymentsd {
			// An earlier attempt reached paymentsd: its record speaks.
			return c.fromRecord(ctx, actx, req, e)
		}
		v, kind := classify(a)
		switch {
		case v == stop:
			e.kind = kind
			if kind == ErrNotCreated && e.unanswered {
				// paymentsd's NOT_CREATED covers the attempts it has
				// seen; one still on its way may create the payment.
				e.kind = ErrOutcomeUnknown
			}
			return nil, e
		case v == lookUp, ended(actx), c.maxAttempts > 0 && e.Attempts >= c.maxAttempts:
			return c.fromRecord(ctx, actx, req, e)
		}
		if !sleep(actx, c.delay(e.Attempts, a.retryAfter)) {
			return c.fromRecord(ctx, actx, req, e)
		}
	}
}

// attemptWindow returns the context Create's attempts run in: ctx, less
// the lookup's reserve before ctx's deadline. The reserve is the lookup
// timeout, but at most a quarter of the time ctx has left now: a lookup
// reads one record and never calls the provider, so a healthy paymentsd
// answers it in milliseconds, and a short deadline is better spent on
// attempts.
func (c *Client) attemptWindow(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return ctx, func() {}
	}
	reserve := min(c.lookupTimeout, time.Until(deadline)/4)
	if reserve <= 0 {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, deadline.Add(-reserve))
}

func (c *Client) attempt(ctx context.Context, req *paymentsv1.CreateMultiCardPaymentRequest, opts ...grpc.CallOption) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	if c.attemptTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.attemptTimeout)
		defer cancel()
	}
	return c.rpc.CreateMultiCardPayment(ctx, req, append(opts, c.callOpts...)...)
}

// fromRecord answers a Create that stopped without a verdict from the
// key's record, read within what is left of ctx (actx, the attempts'
// window, may have closed). The record speaks for req only if it holds
// req: a record of another request under the key (a caller reusing a key,
// whose every attempt was lost) says nothing of req, whose own answer
// would have been ErrKeyReused.
func (c *Client) fromRecord(ctx, actx context.Context, req *paymentsv1.CreateMultiCardPaymentRequest, e *Error) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	var rec *paymentsv1.GetMultiCardPaymentResponse
	err := ctx.Err()
	if err == nil && c.lookupTimeout > 0 {
		lctx, cancel := context.WithTimeout(ctx, c.lookupTimeout)
		var at peer.Peer
		rec, err = c.rpc.GetMultiCardPayment(lctx, &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: e.IdempotencyKey}, append(c.callOpts, grpc.Peer(&at))...)
		cancel()
		if err == nil || reachOf(readAnswer(err), at) == reachedPaymentsd {
			c.reached.Store(true)
		}
	}
	e.ctxErr = outOfTime(ctx, actx)
	if err != nil || rec == nil {
		// The last answer stands; a failed (or cancelled) lookup proves
		// nothing.
		e.kind = ErrOutcomeUnknown
		switch {
		case e.Reason == ReasonInProgress:
			e.kind = ErrInProgress
		case !e.reached && !c.reached.Load():
			// No attempt, nor the lookup, ever reached paymentsd.
			e.kind = ErrNotReached
		}
		return nil, e
	}
	e.State = rec.GetState()
	switch r := rec.GetRequest(); {
	case r == nil:
		// A record that does not say what it holds can't speak for req.
		e.kind = ErrOutcomeUnknown
		return nil, e
	case !sameRequest(r, req):
		e.kind = ErrKeyReused
		return nil, e
	}
	switch rec.GetState() {
	case paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED:
		return &paymentsv1.CreateMultiCardPaymentResponse{
			Payment:            rec.GetPayment(),
			PaymentJson:        rec.GetPaymentJson(),
			ProviderHttpStatus: rec.GetProviderHttpStatus(),
			Environment:        rec.GetEnvironment(),
			Replayed:           true,
		}, nil
	case paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED:
		// The record covers the attempts paymentsd has seen. One that
		// got no answer (cut off by the deadline, a lost connection)
		// may still be on its way, through a proxy say, and create the
		// payment after this lookup: then no one knows it was not.
		e.kind = ErrNotCreated
		if e.unanswered {
			e.kind = ErrOutcomeUnknown
		}
	case paymentsv1.PaymentState_PAYMENT_STATE_IN_PROGRESS:
		e.kind = ErrInProgress
	default:
		e.kind = ErrOutcomeUnknown
	}
	return nil, e
}

// sameRequest reports whether a record's request is req, as paymentsd
// compares them: the same amount, currency and key.
func sameRequest(recorded, req *paymentsv1.CreateMultiCardPaymentRequest) bool {
	return recorded.GetIdempotencyKey() == req.GetIdempotencyKey() &&
		recorded.GetAmountMoney().GetCurrency() == req.GetAmountMoney().GetCurrency() &&
		recorded.GetAmountMoney().GetAmount() == req.GetAmountMoney().GetAmount()
}

// Get returns paymentsd's record of the payment made with key. It retries
// while paymentsd is unreachable or busy, until ctx ends (its error then
// matches ctx's error too). A key paymentsd
// has no record of is ErrNotFound (and ErrKeyExpired too when retention
// deleted it). It never calls the provider.
func (c *Client) Get(ctx context.Context, key string) (*paymentsv1.GetMultiCardPaymentResponse, error) {
	e := &Error{IdempotencyKey: key, target: c.target, lookup: true}
	if key == "" {
		e.Code, e.kind = codes.InvalidArgument, ErrInvalidRequest
		e.Err = status.Error(codes.InvalidArgument, "the idempotency key is empty; nothing was sent")
		return nil, e
	}
	var notConnectedSince time.Time
	for {
		var at peer.Peer
		rec, err := c.rpc.GetMultiCardPayment(ctx, &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key}, append(c.callOpts, grpc.Peer(&at))...)
		e.Attempts++
		if err == nil {
			c.reached.Store(true)
			return rec, nil
		}
		a := readAnswer(err)
		r := reachOf(a, at)
		if r == reachedPaymentsd {
			c.reached.Store(true)
			e.reached = true
		}
		e.Code, e.Reason, e.RetryAfter, e.Err = a.st.Code(), a.reason, a.retryAfter, err
		if r != reachedPaymentsd && !e.reached && (r == notPaymentsd || c.gaveUpReaching(&notConnectedSince)) {
			e.kind = ErrNotReached
			return nil, e
		}
		switch {
		case a.reason == ReasonKeyExpired:
			e.kind = ErrKeyExpired
			return nil, e
		case a.reason == ReasonCallerNotAllowed:
			e.kind = ErrCallerNotAllowed
			return nil, e
		case a.reason == ReasonKeyNotOwned:
			e.kind = ErrKeyNotOwned
			return nil, e
		case e.Code == codes.NotFound:
			e.kind = ErrNotFound
			return nil, e
		case e.Code == codes.InvalidArgument:
			e.kind = ErrInvalidRequest
			return nil, e
		}
		transient := e.Code == codes.Unavailable || e.Code == codes.ResourceExhausted || e.Code == codes.Aborted
		if !transient || ended(ctx) || !sleep(ctx, c.delay(e.Attempts, a.retryAfter)) {
			// What the record says is not known.
			e.kind = ErrOutcomeUnknown
			if !e.reached && !c.reached.Load() {
				e.kind = ErrNotReached
			}
			e.ctxErr = outOfTime(ctx, ctx)
			return nil, e
		}
	}
}

// gaveUpReaching reports whether a call whose attempts have found no
// connection since *since (set now, if zero) should stop: only a Client
// that has never reached paymentsd gives up, once WithNotReachedTimeout's
// time has passed.
func (c *Client) gaveUpReaching(since *time.Time) bool {
	if c.reached.Load() || c.notReachedTimeout <= 0 {
		return false
	}
	if since.IsZero() {
		*since = time.Now()
	}
	return time.Since(*since) >= c.notReachedTimeout
}

// delay is how long to wait before the attempt after attempt n: the
// RetryInfo's delay if paymentsd gave one, with up to 10% added so that
// callers told the same delay don't return together; else full jitter over
// an exponential backoff.
func (c *Client) delay(n int, retryAfter time.Duration) time.Duration {
	if retryAfter > 0 {
		// A RetryInfo near the largest Duration would wrap negative, and
		// a negative wait ends Create at once, with time left.
		return retryAfter + min(rand.N(retryAfter/10+1), math.MaxInt64-retryAfter)
	}
	ceiling := c.backoffBase
	for i := 1; i < n && ceiling < c.backoffMax; i++ {
		ceiling *= 2
	}
	ceiling = min(ceiling, c.backoffMax)
	return rand.N(ceiling) + 1
}

// sleep waits d, or until ctx ends; it reports whether ctx is still live.
// It never waits past ctx's deadline.
func sleep(ctx context.Context, d time.Duration) bool {
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < d {
		d = time.Until(deadline)
	}
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return !ended(ctx)
	}
}

// outOfTime is why a call stopped for lack of time: ctx's error, or
// context.DeadlineExceeded once ctx's deadline or the attempts' window
// (actx, which ends no later) has passed; nil while time was left.
func outOfTime(ctx, actx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ended(ctx) || ended(actx) {
		return context.DeadlineExceeded
	}
	return nil
}

// ended reports whether ctx is done or its deadline has passed: a context's
// Err can lag its deadline by a moment, while gRPC refuses a call at once.
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	deadline, ok := ctx.Deadline()
	return ok && !time.Now().Before(deadline)
}
