// Package upstream is the payment provider's REST client: its base URL and
// key, the one request shape the provider documents, and the vocabulary of
// its failures.
//
// The client retries what is safe to retry, always with the caller's
// idempotency key and a byte-identical body, and never past the caller's
// deadline. Every failure is an *Error that says how many attempts were
// made and whether a payment may exist.
package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/sony/gobreaker/v2"
	"google.golang.org/protobuf/types/known/structpb"
)

// Path is the create-payment endpoint, relative to the base URL.
const Path = "/multi-card-payments"

// Defaults for the zero values of Config.
const (
	DefaultMaxAttempts      = 3
	DefaultMaxResponseBytes = 1 << 20
	DefaultBackoffBase      = 100 * time.Millisecond
	DefaultBackoffMax       = 2 * time.Second
	DefaultMaxRetryAfter    = 5 * time.Second
	DefaultBreakerFailures  = 5
	DefaultBreakerCooldown  = 5 * time.Second

	// maxErrorBody bounds how much of a non-2xx reply is kept for callers.
	maxErrorBody = 8 << 10
	// maxEncodedKeyByte is the longest a key's byte can be written in a
	// form the redactor decodes.
	maxEncodedKeyByte = maxEncodedByte
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

// Config configures a Client. BaseURL, HTTPClient, and APIKey or APIKeys
// are required.
type Config struct {
	// BaseURL is the environment's base URL, ending in /v1.
	BaseURL string
	// APIKey is the environment's key, sent as x-api-key. It is a password.
	APIKey string
	// APIKeys, set instead of APIKey, are the environment's keys: one, or
	// two while rotating, the one to use first first. A request refused
	// with 401 or 403 is sent once more with the other key, which then
	// stays in use if it was not refused. Client.SetKeys replaces them.
	APIKeys []string
	// HTTPClient makes the requests. Its transport's pool is what keeps
	// connections to the provider open between calls.
	HTTPClient *http.Client
	// MaxAttempts counts the first try; 1 disables retries.
	MaxAttempts int
	// Timeout bounds a whole call, retries included, when the caller's
	// context has no earlier deadline. Zero means no bound of its own.
	Timeout time.Duration
	// MaxResponseBytes bounds how much of a reply is read.
	MaxResponseBytes int64
	// BackoffBase and BackoffMax shape the exponential backoff between
	// attempts, with full jitter.
	BackoffBase, BackoffMax time.Duration
	// MaxRetryAfter caps how long a provider's Retry-After is honoured.
	MaxRetryAfter time.Duration
	// BreakerFailures consecutive failed attempts (transport failures and
	// 5xx) open the circuit; it stays open for BreakerCooldown, then lets one
	// probe through.
	BreakerFailures int
	BreakerCooldown time.Duration
	// Metrics, if not nil, records every attempt.
	Metrics *Metrics
	// UserAgent, if set, is every request's User-Agent (paymentsd sends
	// paymentsd/<version>); unset, Go's default.
	UserAgent string
	// Logger, if not nil, gets a warning for every failed attempt with its
	// real cause (DNS, refused connection, TLS, a key that is not a valid
	// header value, the provider's status), which the caller-facing error
	// leaves generic. The key is never logged.
	Logger *slog.Logger
}

// Client calls the payment provider. It is safe for concurrent use.
type Client struct {
	url     string
	keys    atomic.Pointer[keySet]
	keyMu   sync.Mutex // orders updates of the key metric
	http    *http.Client
	cfg     Config
	breaker *gobreaker.TwoStepCircuitBreaker[struct{}]
	metrics *Metrics
	logger  *slog.Logger
	// openUntil is when the breaker last opened plus its cooldown.
	openUntil atomic.Pointer[time.Time]
}

// New returns a client for cfg. It fails if cfg is incomplete; the error
// never contains the key.
func New(cfg Config) (*Client, error) {
	if cfg.HTTPClient == nil {
		return nil, errors.New("upstream: no HTTP client")
	}
	keys := cfg.APIKeys
	if cfg.APIKey != "" || len(keys) == 0 {
		keys = []string{cfg.APIKey}
	}
	if err := checkKeys(keys); err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	// Errors never quote the URL: the key may be where the URL should be,
	// as when the two are swapped.
	if err := CheckBaseURL(cfg.BaseURL); err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	setDefaults(&cfg)
	// Never follow a redirect: a redirected POST may become a GET, and Go
	// would resend x-api-key to wherever the redirect points.
	hc := *cfg.HTTPClient
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	c := &Client{
		url:     strings.TrimSuffix(cfg.BaseURL, "/") + Path,
		http:    &hc,
		cfg:     cfg,
		metrics: cfg.Metrics,
		logger:  cfg.Logger,
	}
	c.keys.Store(newKeySet(slices.Clone(keys), 0))
	c.keysChanged()
	c.breaker = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:    "provider",
		Timeout: cfg.BreakerCooldown,
		ReadyToTrip: func(counts gobreaker.Counts) bool {
			return counts.ConsecutiveFailures >= uint32(cfg.BreakerFailures)
		},
		IsExcluded: func(err error) bool {
			return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
		},
		OnStateChange: func(_ string, _, to gobreaker.State) {
			if to == gobreaker.StateOpen {
				until := time.Now().Add(cfg.BreakerCooldown)
				c.openUntil.Store(&until)
			}
		},
	})
	return c, nil
}

// CheckBaseURL reports what is wrong with a base URL for the provider: it
// must be an absolute http or https URL with a host, a port (if any) from 1
// to 65535, and no credentials, query or fragment, not even an empty one
// (a bare "?" or "#"), since the request path is appended to it. The error
// never quotes the URL.
func CheckBaseURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Opaque != "":
		return errors.New("base URL is not an http or https URL")
	case u.User != nil:
		return errors.New("base URL must not carry credentials")
	case u.RawQuery != "" || u.ForceQuery:
		return errors.New("base URL must not have a query")
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return errors.New("base URL must not have a fragment")
	case u.Hostname() == "":
		return errors.New("base URL has no host")
	}
	if port := u.Port(); port != "" || strings.HasSuffix(u.Host, ":") {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return errors.New("base URL has a bad port: want a number from 1 to 65535, or none")
		}
	}
	return nil
}

func setDefaults(cfg *Config) {
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.MaxResponseBytes <= 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = DefaultBackoffBase
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = DefaultBackoffMax
	}
	if cfg.MaxRetryAfter <= 0 {
		cfg.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if cfg.BreakerFailures <= 0 {
		cfg.BreakerFailures = DefaultBreakerFailures
	}
	if cfg.BreakerCooldown <= 0 {
		cfg.BreakerCooldown = DefaultBreakerCooldown
	}
}

// Payment is a create-payment request, in the provider's terms.
type Payment struct {
	Currency       string
	Amount         int64
	IdempotencyKey string
}

// Reply is the provider's answer to a payment that succeeded.
type Reply struct {
	// Status is the provider's 2xx status.
	Status int
	// Body is the reply body exactly as received (key redacted): a JSON
	// object that DecodeReply accepts. Payment decodes it.
	Body []byte
	// Attempts is how many requests were sent, counting the first.
	Attempts int
}

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

// Error is the failure of a call, after every attempt it made.
type Error struct {
	// Attempts is how many requests were sent or tried, counting the first.
	Attempts int
	// MaybeCreated reports that some attempt may have created a payment: the
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
	// done: the client makes no further attempt, and callers must wait a
	// quiet period from LastAttemptStart before sending the key again.
	AtProvider bool
	// LastAttemptStart is when the last attempt began, on this process's
	// monotonic clock.
	LastAttemptStart time.Time
	// Err is the last attempt's failure: a *StatusError, a sentinel of this
	// package, or a context error.
	Err error
}

func (e *Error) Error() string {
	s := fmt.Sprintf("create multi-card payment: %d attempt(s): %v", e.Attempts, e.Err)
	if e.MaybeCreated {
		s += " (a payment may have been created)"
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// CreateMultiCardPayment asks the provider to create a payment. Every
// attempt carries p.IdempotencyKey and the same body. A request that never
// reached the provider (the connection could not be made), a 2xx whose
// reply was cut off, and a 429 are retried, with backoff, while the next
// wait fits in the context's deadline. A request that may still be at the
// provider (see Error.AtProvider: any other status, or none) is never
// followed by another: the two would be at the provider at once with one
// key. A 401 or 403 with the API key in use is sent once more, at once,
// with the other key if the client holds two (see Config.APIKeys); that
// attempt counts like any other. On failure the error is an *Error.
func (c *Client) CreateMultiCardPayment(ctx context.Context, p Payment) (*Reply, error) {
	body, err := EncodeRequest(p)
	if err != nil {
		return nil, &Error{Err: err}
	}
	return c.Send(ctx, body)
}

// Send is CreateMultiCardPayment with a body already encoded by
// EncodeRequest, sent byte for byte: the way to re-send a recorded request
// with its idempotency key.
func (c *Client) Send(ctx context.Context, body []byte) (*Reply, error) {
	if c.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
	}

	failure := &Error{}
	// switched is the key a request was re-sent with after the key in
	// use was refused; refused, the key that was. From then on the call
	// keeps the set it switched in, so that the key it sends is always
	// one the set redacts, even if a reload drops it.
	var switched, refused string
	var keys *keySet
	for {
		key := switched
		if switched == "" {
			keys = c.keys.Load()
			key = keys.current()
		}
		done, err := c.breaker.Allow()
		if err != nil {
			c.metrics.observe(outcomeCircuitOpen, 0)
			if failure.Attempts == 0 {
				var left time.Duration
				if until := c.openUntil.Load(); until != nil {
					left = max(time.Until(*until), 0)
				}
				failure.Err = &CircuitOpenError{RetryAfter: left}
			}
			return nil, failure
		}
		failure.Attempts++
		if failure.Attempts > 1 {
			c.metrics.retry()
		}
		failure.LastAttemptStart = time.Now()
		reply, sent, answered, err := c.attempt(ctx, body, keys, key)
		done(breakerVerdict(err))
		if switched != "" && answered && !authRefusal(err) {
			c.promote(switched, refused)
		}
		if err == nil {
			reply.Attempts = failure.Attempts
			return reply, nil
		}
		failure.Err = err
		failure.MaybeCreated = failure.MaybeCreated || maybeCreated(err, sent)
		failure.AtProvider = sent && (!answered || mayStillBeWorkedOn(err))
		if other, ok := keys.other(key); ok && switched == "" && authRefusal(err) {
			// A 401 or 403 is a refusal before any work: nothing was
			// created and the provider is done with the request, so the
			// other key may be tried at once, once.
			c.logAttempt(ctx, keys, failure.Attempts, err, sent, "0s: with the other API key")
			switched, refused = other, key
			continue
		}
		switch {
		case failure.AtProvider:
			c.logAttempt(ctx, keys, failure.Attempts, err, sent, "none: the request may still be at the provider")
			return nil, failure
		case !retryable(err) || failure.Attempts >= c.cfg.MaxAttempts:
			c.logAttempt(ctx, keys, failure.Attempts, err, sent, "none")
			return nil, failure
		}
		wait := c.backoff(failure.Attempts, err)
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			c.logAttempt(ctx, keys, failure.Attempts, err, sent, "none: the deadline is too near")
			return nil, failure
		}
		c.logAttempt(ctx, keys, failure.Attempts, err, sent, wait.String())
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			failure.Err = ctx.Err()
			return nil, failure
		case <-t.C:
		}
	}
}

// authRefusal reports whether err is the provider's 401 or 403: the key
// was refused, before any work.
func authRefusal(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && (se.Status == http.StatusUnauthorized || se.Status == http.StatusForbidden)
}

// logAttempt logs a failed attempt with its real cause: the provider's
// status, or the transport's own error text (which names a DNS failure, a
// refused connection, a certificate problem or an invalid header value,
// where the caller-facing error says only "unreachable").
func (c *Client) logAttempt(ctx context.Context, keys *keySet, attempt int, err error, sent bool, retry string) {
	if c.logger == nil || !c.logger.Enabled(ctx, slog.LevelWarn) {
		return
	}
	attrs := []slog.Attr{
		slog.Int("attempt", attempt),
		slog.Bool("request_sent", sent),
		slog.String("retry_in", retry),
	}
	var se *StatusError
	if errors.As(err, &se) {
		attrs = append(attrs, slog.Int("provider_status", se.Status))
	} else {
		attrs = append(attrs, slog.String("outcome", transportLabel(err)))
	}
	attrs = append(attrs, slog.String("cause", keys.redactString(causeOf(err).Error())))
	c.logger.LogAttrs(ctx, slog.LevelWarn, "provider attempt failed", attrs...)
}

// causeOf is the error beneath this package's sentinel, if the attempt
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

// attempt makes one request. sent reports that the whole request was
// written, so the provider may have acted on it; answered, that a status
// came back, so the provider is done with it.
func (c *Client) attempt(ctx context.Context, body []byte, keys *keySet, key string) (_ *Reply, sent, answered bool, _ error) {
	var wrote, connected atomic.Bool
	trace := &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			connected.Store(true)
			if !info.Reused {
				c.metrics.connOpened()
			}
		},
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				wrote.Store(true)
			}
		},
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return nil, false, false, fmt.Errorf("build request: %w", err)
	}
	req.Header = http.Header{
		"X-Api-Key":    {key},
		"Content-Type": {"application/json"},
		"Accept":       {"application/json"},
	}
	if c.cfg.UserAgent != "" {
		req.Header["User-Agent"] = []string{c.cfg.UserAgent}
	}
	// Without GetBody the transport can't re-send the request on its own
	// (HTTP/2 does, after some stream errors and GOAWAYs): every request
	// the provider may see is an attempt this client counts and judges.
	req.GetBody = nil

	start := time.Now()
	c.metrics.start()
	defer c.metrics.end()
	resp, err := c.http.Do(req)
	if err != nil {
		// A request cut off by the context once it had a connection may
		// have been written whole just as the context ended, before the
		// transport reported it: it may be at the provider.
		sent := wrote.Load() || (ctx.Err() != nil && connected.Load())
		err = c.transportError(ctx, keys, err, sent)
		c.metrics.observe(transportLabel(err), time.Since(start))
		return nil, sent, false, err
	}
	reply, err := c.readReply(ctx, keys, resp)
	c.metrics.observe(strconv.Itoa(resp.StatusCode), time.Since(start))
	return reply, true, true, err
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

// readReply turns a response into a Reply or an error, and always closes
// the body, draining what is left of it (up to the limit) so the connection
// can be reused.
func (c *Client) readReply(ctx context.Context, keys *keySet, resp *http.Response) (*Reply, error) {
	defer func() {
		io.Copy(io.Discard, io.LimitReader(resp.Body, c.cfg.MaxResponseBytes))
		resp.Body.Close()
	}()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		// Read past the limit by the longest encoding of the key, so that
		// a key across the cut is redacted whole rather than left in part.
		limit := maxErrorBody + int64(maxEncodedKeyByte*keys.longest)
		b, _ := io.ReadAll(io.LimitReader(resp.Body, limit))
		cut := int64(len(b)) == limit // the body may go on
		b = keys.redact(b)
		if len(b) > maxErrorBody {
			b, cut = b[:maxErrorBody], true
		}
		if cut {
			// A key that starts just before the end of what was read
			// (which redacting keys before it may have brought under
			// the limit) was not seen whole: drop its first part.
			b = keys.trimPartial(b)
		}
		return nil, &StatusError{
			Status:     resp.StatusCode,
			Body:       b,
			RetryAfter: retryAfter(resp.Header.Get("Retry-After"), time.Now(), c.cfg.MaxRetryAfter),
		}
	}
	b, err := readAll(io.LimitReader(resp.Body, c.cfg.MaxResponseBytes+1), resp.ContentLength, c.cfg.MaxResponseBytes)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: reading %d reply: %v", ErrConnectionLost, resp.StatusCode, err)
	}
	if int64(len(b)) > c.cfg.MaxResponseBytes {
		return nil, fmt.Errorf("%w: %d reply over %d bytes", ErrReplyTooLarge, resp.StatusCode, c.cfg.MaxResponseBytes)
	}
	// Redact before checking, so that Payment, decoded from the redacted
	// body, holds the key nowhere either.
	b = keys.redact(b)
	// The reply is judged here as DecodeReply judges it, but the Struct is
	// built only for a caller that wants one (Payment): a REST caller gets
	// the exact bytes and never needs it.
	if err := CheckReply(b); err != nil {
		return nil, err
	}
	return &Reply{Status: resp.StatusCode, Body: b}, nil
}

// readAll is io.ReadAll of r, into a buffer sized for the reply when its
// length (n, -1 if unknown) is known and at most max: the reply is kept
// (in the record, and by the outbox for a while after it is written), and
// io.ReadAll's growing buffer would hold up to twice its size (a 300-byte
// reply in 512 bytes), and copy a longer one several times over.
func readAll(r io.Reader, n, max int64) ([]byte, error) {
	if n < 0 || n > max {
		return io.ReadAll(r)
	}
	// One byte more, so that the end of the body is read without growing
	// the buffer; a body longer than it said still grows it, and is read
	// whole (up to the limit).
	b := make([]byte, 0, n+1)
	for {
		m, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+m]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}

// Payment is the reply body as a Struct. Numbers in it are doubles; Body
// is exact. The body has passed CheckReply, so DecodeReply accepts it; were
// it ever to refuse it, Payment would be nil.
func (r *Reply) Payment() *structpb.Struct {
	p, _ := DecodeReply(r.Body)
	return p
}

// CheckReply returns the error DecodeReply would return for b, without
// decoding it. DecodeReply refuses b exactly when it is not valid UTF-8,
// not valid JSON (json.Unmarshal checks the whole of b with the scanner
// json.Valid uses, depth limit included), not an object (null included),
// or holds a number that overflows a float64: those are the only ways
// json.Unmarshal into a map[string]any can fail on valid JSON, and
// structpb.NewStruct never fails on what that gives. FuzzCheckReply
// checks that the two agree.
func CheckReply(b []byte) error {
	if !utf8.Valid(b) {
		return fmt.Errorf("%w (%d bytes): invalid UTF-8", ErrMalformedReply, len(b))
	}
	if !json.Valid(b) || !isObject(b) || !numbersFit(b) {
		return fmt.Errorf("%w (%d bytes)", ErrMalformedReply, len(b))
	}
	return nil
}

// isObject reports whether valid JSON b is an object.
func isObject(b []byte) bool {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return c == '{'
	}
	return false
}

// numbersFit reports whether every number in valid JSON b parses as a
// float64 without overflow, as json.Unmarshal into an any requires.
func numbersFit(b []byte) bool {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			// Skip the string; b is valid JSON, so it ends.
			for i++; b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
		case c == '-' || ('0' <= c && c <= '9'):
			j := i + 1
			for j < len(b) && isNumberByte(b[j]) {
				j++
			}
			if _, err := strconv.ParseFloat(string(b[i:j]), 64); err != nil {
				return false
			}
			i = j - 1
		}
	}
	return true
}

func isNumberByte(c byte) bool {
	return ('0' <= c && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'
}

// DecodeReply decodes a 2xx reply body, which must be a JSON object.
// encoding/json then structpb is about twice as fast as protojson here, and
// gives the same Struct for every valid JSON object without duplicate keys
// (where protojson refuses the reply and this keeps the last value).
// Invalid UTF-8 is refused rather than silently replaced.
func DecodeReply(b []byte) (*structpb.Struct, error) {
	var m map[string]any
	if !utf8.Valid(b) {
		return nil, fmt.Errorf("%w (%d bytes): invalid UTF-8", ErrMalformedReply, len(b))
	}
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		// The decoder's message quotes part of the body, which is the
		// provider's and harmless, but keep the error short and stable.
		return nil, fmt.Errorf("%w (%d bytes)", ErrMalformedReply, len(b))
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		return nil, fmt.Errorf("%w (%d bytes): %v", ErrMalformedReply, len(b), err)
	}
	return s, nil
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

// backoff returns how long to wait before the attempt after the n-th: the
// provider's Retry-After if it sent one, else exponential backoff with full
// jitter.
func (c *Client) backoff(n int, err error) time.Duration {
	var se *StatusError
	if errors.As(err, &se) && se.RetryAfter > 0 {
		return se.RetryAfter
	}
	ceiling := c.cfg.BackoffBase << (n - 1)
	if ceiling > c.cfg.BackoffMax || ceiling <= 0 {
		ceiling = c.cfg.BackoffMax
	}
	return rand.N(ceiling) + 1
}

// retryAfter parses a Retry-After value, in seconds or as an HTTP date,
// capped at limit.
func retryAfter(v string, now time.Time, limit time.Duration) time.Duration {
	if v == "" {
		return 0
	}
	var d time.Duration
	if secs, err := parseSeconds(v); err == nil {
		d = secs
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), limit)
}

func parseSeconds(v string) (time.Duration, error) {
	// RFC 9110 delay-seconds: 1*DIGIT, so "01" is one second, and a number
	// too big for ParseInt is a long wait.
	if v == "" || strings.Trim(v, "0123456789") != "" {
		return 0, errors.New("not seconds")
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n > int64(time.Hour/time.Second) {
		n = int64(time.Hour / time.Second)
	}
	return time.Duration(n) * time.Second, nil
}

// retryable reports whether another attempt may succeed where this failed,
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

// maybeCreated reports whether a failed attempt may have created a payment.
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

// breakerVerdict is what an attempt tells the circuit breaker: transport
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

// wireRequest is the provider's documented request body. encoding/json
// writes Amount as a JSON integer, exact for every int64.
type wireRequest struct {
	AmountMoney struct {
		Currency string `json:"currency"`
		Amount   int64  `json:"amount"`
	} `json:"amountMoney"`
	IdempotencyKey string `json:"idempotencyKey"`
}

// EncodeRequest returns the provider's request body for p: the documented
// JSON shape, with Amount as an exact JSON integer. The same p always gives
// the same bytes.
func EncodeRequest(p Payment) ([]byte, error) {
	var w wireRequest
	w.AmountMoney.Currency = p.Currency
	w.AmountMoney.Amount = p.Amount
	w.IdempotencyKey = p.IdempotencyKey
	return json.Marshal(&w)
}
