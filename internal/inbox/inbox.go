// Package inbox receives the payment provider's webhook deliveries and
// stores each one durably before acknowledging it.
//
// The provider documents that webhooks exist but not their kinds, payload,
// retry rules or signatures, so the inbox invents nothing about them: it
// authenticates the URL's secret token, keeps the raw delivery (body byte for
// byte, content type and headers as bytes, less hop-by-hop headers), and
// answers 2xx only once the store has committed it. Internal services read
// the inbox through service.Events, never through this handler.
//
// The handler is internet-facing: it serves only POST /webhooks/{token} and
// belongs on a listener of its own (Server), never on a mux with the
// internal API. Nothing a sender without the token can do holds more than
// a connection for a few seconds, and nothing a sender with it can do takes
// more than the deliveries' byte budget or the inbox's quota.
package inbox

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/semaphore"

	"example.com/paymentsd/internal/store"
)

// PathPrefix is where deliveries arrive: PathPrefix + token.
const PathPrefix = "/webhooks/"

// DefaultMaxBytes is the default largest delivery body.
const DefaultMaxBytes = 256 << 10

// LargestMaxBytes is the largest MaxBytes allowed. Every event must fit one
// response to the inbox's readers with room to spare (a page is at most 3
// MiB, a gRPC client's default limit 4 MiB), and the memory budget (docs/security.md,
// "Memory budget of the inbox") counts two such events for each of 64 watches whose
// callers stop reading: 64 MiB.
const LargestMaxBytes = 512 << 10

// DefaultMaxInFlight is how many bodies of MaxBytes may be held at once by
// default: with DefaultMaxBytes, 4 MiB of bodies in memory.
const DefaultMaxInFlight = 16

// MinTokenLength is the shortest token accepted: 32 characters from the
// URL-unreserved set carry at least 190 bits when generated at random.
const MinTokenLength = 32

// Config configures New.
type Config struct {
	// Tokens are the secret path segments accepted: one, or two while the
	// provider's dashboard is switched from an old token to a new one.
	Tokens []string
	// Store keeps the deliveries.
	Store *store.Store
	// MaxBytes is the largest body accepted (413 beyond), at most
	// LargestMaxBytes; 0 means DefaultMaxBytes.
	MaxBytes int64
	// MaxInFlight bounds the bodies held at once, read or being stored, to
	// MaxInFlight × MaxBytes bytes (503 beyond, which the provider
	// retries). A body holds only the bytes that have arrived, so slow
	// senders hold little. 0 means DefaultMaxInFlight.
	MaxInFlight int
	// StoreTimeout bounds one commit; 0 means 10s.
	StoreTimeout time.Duration
	// Appended, if set, is called after each event is committed, to wake
	// watchers in this process.
	Appended func(store.Event)
	// Logger gets one line per request, with the path redacted: the
	// deliveries' path as /webhooks/[REDACTED], any other as [other].
	Logger *slog.Logger
	// Metrics, if set, counts deliveries.
	Metrics *Metrics
	// TracerProvider, if set, gets one span per delivery, which never
	// carries the path.
	TracerProvider trace.TracerProvider
}

// Handler is the webhook intake.
type Handler struct {
	tokens       atomic.Pointer[tokenSet]
	tokenMu      sync.Mutex // serialises SetTokens
	store        *store.Store
	maxBytes     int64
	bodies       *semaphore.Weighted // MaxInFlight × MaxBytes
	storeTimeout time.Duration
	appended     func(store.Event)
	logger       *slog.Logger
	metrics      *Metrics
	tracer       trace.Tracer
}

// New returns the intake handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Store == nil {
		return nil, errors.New("inbox: no store")
	}
	if cfg.MaxBytes > LargestMaxBytes {
		return nil, fmt.Errorf("inbox: MaxBytes %d is over %d", cfg.MaxBytes, LargestMaxBytes)
	}
	h := &Handler{
		store:        cfg.Store,
		maxBytes:     cfg.MaxBytes,
		storeTimeout: cfg.StoreTimeout,
		appended:     cfg.Appended,
		logger:       cfg.Logger,
		metrics:      cfg.Metrics,
	}
	if err := h.SetTokens(cfg.Tokens); err != nil {
		return nil, err
	}
	if h.maxBytes <= 0 {
		h.maxBytes = DefaultMaxBytes
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	h.bodies = semaphore.NewWeighted(int64(cfg.MaxInFlight) * h.maxBytes)
	if h.storeTimeout <= 0 {
		h.storeTimeout = 10 * time.Second
	}
	if h.logger == nil {
		h.logger = slog.New(slog.DiscardHandler)
	}
	if cfg.TracerProvider != nil {
		h.tracer = cfg.TracerProvider.Tracer("example.com/paymentsd/internal/inbox")
	}
	if m := h.metrics; m != nil {
		m.quotaBytes.Set(float64(cfg.Store.InboxQuota()))
	}
	return h, nil
}
