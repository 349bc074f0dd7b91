// Package upstream is the payment provider's REST client: its base URL and
// key, the one request shape the provider documents, and the vocabulary of
// its failures.
//
// The client retries what is safe to retry, always with the caller's
// idempotency key and a byte-identical body, and never past the caller's
// deadline. Every failure is an *Error that says how many requests were
// made and whether a payment may exist.
package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// Path is the create-payment endpoint, relative to the base URL.
const Path = "/multi-card-payments"

// Defaults for the zero values of Config.
const (
	DefaultMaxRequests      = 3
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
	// MaxRequests is how many requests a call may send, counting the
	// first; 1 disables retries.
	MaxRequests int
	// Timeout bounds a whole call, retries included, when the caller's
	// context has no earlier deadline. Zero means no bound of its own.
	Timeout time.Duration
	// MaxResponseBytes bounds how much of a reply is read.
	MaxResponseBytes int64
	// BackoffBase and BackoffMax shape the exponential backoff between
	// requests, with full jitter.
	BackoffBase, BackoffMax time.Duration
	// MaxRetryAfter caps how long a provider's Retry-After is honoured.
	MaxRetryAfter time.Duration
	// BreakerFailures consecutive failed requests (transport failures and
	// 5xx) open the circuit; it stays open for BreakerCooldown, then lets one
	// probe through.
	BreakerFailures int
	BreakerCooldown time.Duration
	// Metrics, if not nil, records every request.
	Metrics *Metrics
	// UserAgent, if set, is every request's User-Agent (paymentsd sends
	// paymentsd/<version>); unset, Go's default.
	UserAgent string
	// Logger, if not nil, gets a warning for every failed request with its
	// real cause (DNS, refused connection, TLS, a key that is not a valid
	// header value, the provider's status), which the caller-facing error
	// leaves generic. The key is never logged.
	Logger *slog.Logger
}

// Client calls the payment provider. It is safe for concurrent use.
type Client struct {
	// target is the endpoint's URL, parsed once; requests only read it.
	target  *url.URL
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
	target, err := url.Parse(strings.TrimSuffix(cfg.BaseURL, "/") + Path)
	if err != nil {
		return nil, errors.New("upstream: base URL is not an http or https URL")
	}
	c := &Client{
		target:  target,
		http:    &hc,
		cfg:     cfg,
		metrics: cfg.Metrics,
		logger:  cfg.Logger,
	}
	c.keys.Store(newKeySet(slices.Clone(keys), 0, cfg.UserAgent))
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
	if cfg.MaxRequests <= 0 {
		cfg.MaxRequests = DefaultMaxRequests
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
