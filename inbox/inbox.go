// Package inbox receives the payment provider's webhook deliveries and
// stores each one durably before acknowledging it.
//
// The provider documents that webhooks exist but not their kinds, payload,
// retry rules or signatures, so the inbox invents nothing about them: it
// authenticates the URL's secret token, keeps the raw delivery (body byte for
// byte, content type, headers less hop-by-hop ones), and answers 2xx only
// once the store has committed it. Internal services read the inbox through
// service.Events, never through this handler.
//
// The handler is internet-facing: it serves only POST /webhooks/{token} and
// belongs on a listener of its own, never on a mux with the internal API.
package inbox

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"example.com/paymentsd/store"
)

// PathPrefix is where deliveries arrive: PathPrefix + token.
const PathPrefix = "/webhooks/"

// DefaultMaxBytes is the default largest delivery body.
const DefaultMaxBytes = 256 << 10

// DefaultMaxInFlight is how many deliveries may be read and stored at once
// by default: with DefaultMaxBytes, at most 4 MiB of bodies in memory.
const DefaultMaxInFlight = 16

// MinTokenLength is the shortest token accepted: 32 characters from the
// URL-unreserved set carry at least 190 bits when generated at random.
const MinTokenLength = 32

// redactedPath is the deliveries' path as it may appear in any output.
const redactedPath = PathPrefix + "[REDACTED]"

// otherPath is every other path as it may appear in any output. A near miss
// (//webhooks/…, /webhook/…, /Webhooks/…, the token percent-encoded or
// anywhere else) may hold a token, right or nearly so, so no part of any
// path but the deliveries' own is kept.
const otherPath = "[other]"

// otherMethod stands for a method HTTP does not define, which is whatever
// the sender put there (the token, even), as OpenTelemetry's
// http.request.method does.
const otherMethod = "_OTHER"

// methodOf is r's method as it may appear in any output.
func methodOf(r *http.Request) string {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return r.Method
	}
	return otherMethod
}

// Outcomes of a delivery, the values of the outcome label.
const (
	OutcomeStored       = "stored"
	OutcomeDuplicate    = "duplicate"
	OutcomeBadToken     = "bad_token"
	OutcomeTooLarge     = "too_large"
	OutcomeStoreFailure = "store_failure"
	OutcomeBadMethod    = "bad_method"
	// OutcomeBadRequest: the body could not be read (cut off, or too slow).
	OutcomeBadRequest = "bad_request"
	// OutcomeBusy: too many deliveries were in progress; 503, and the
	// provider retries.
	OutcomeBusy = "busy"
)

// Metrics counts deliveries.
type Metrics struct {
	deliveries *prometheus.CounterVec
	inProgress prometheus.Gauge
}

// NewMetrics registers the inbox's metrics on reg; labels common to every
// series, such as the environment, belong on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "paymentsd_webhook_deliveries_total",
		Help: "Webhook deliveries received, by outcome: stored, duplicate (stored, same body as an earlier event), bad_token, bad_method, too_large, bad_request, store_failure, busy.",
	}, []string{"outcome"}),
		inProgress: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paymentsd_webhook_deliveries_in_progress",
			Help: "Webhook deliveries being read and stored now.",
		}),
	}
	reg.MustRegister(m.deliveries, m.inProgress)
	for _, o := range []string{OutcomeStored, OutcomeDuplicate, OutcomeBadToken, OutcomeTooLarge, OutcomeStoreFailure, OutcomeBadMethod, OutcomeBadRequest, OutcomeBusy} {
		m.deliveries.WithLabelValues(o)
	}
	return m
}

// Config configures New.
type Config struct {
	// Tokens are the secret path segments accepted: one, or two while the
	// provider's dashboard is switched from an old token to a new one.
	Tokens []string
	// Store keeps the deliveries.
	Store *store.Store
	// MaxBytes is the largest body accepted (413 beyond); 0 means
	// DefaultMaxBytes.
	MaxBytes int64
	// MaxInFlight bounds the deliveries read and stored at once (503
	// beyond, which the provider retries); 0 means DefaultMaxInFlight.
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
	tokens       [][sha256.Size]byte
	store        *store.Store
	maxBytes     int64
	slots        chan struct{}
	storeTimeout time.Duration
	appended     func(store.Event)
	logger       *slog.Logger
	metrics      *Metrics
	tracer       trace.Tracer
}

// ValidateToken reports what is wrong with a token, without the token.
func ValidateToken(tok string) error {
	if len(tok) < MinTokenLength {
		return fmt.Errorf("a token has %d characters, want at least %d", len(tok), MinTokenLength)
	}
	for i := 0; i < len(tok); i++ {
		if !unreserved(tok[i]) {
			return fmt.Errorf("a token has a character other than A-Z, a-z, 0-9, '-', '.', '_' and '~' at position %d", i+1)
		}
	}
	return nil
}

// unreserved reports whether c is an RFC 3986 unreserved character, which
// reads the same in a URL escaped or not.
func unreserved(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

// New returns the intake handler.
func New(cfg Config) (*Handler, error) {
	if len(cfg.Tokens) == 0 || len(cfg.Tokens) > 2 {
		return nil, fmt.Errorf("inbox: %d tokens, want 1 or 2", len(cfg.Tokens))
	}
	if cfg.Store == nil {
		return nil, errors.New("inbox: no store")
	}
	h := &Handler{
		store:        cfg.Store,
		maxBytes:     cfg.MaxBytes,
		storeTimeout: cfg.StoreTimeout,
		appended:     cfg.Appended,
		logger:       cfg.Logger,
		metrics:      cfg.Metrics,
	}
	for _, tok := range cfg.Tokens {
		if err := ValidateToken(tok); err != nil {
			return nil, fmt.Errorf("inbox: %w", err)
		}
		h.tokens = append(h.tokens, sha256.Sum256([]byte(tok)))
	}
	if h.maxBytes <= 0 {
		h.maxBytes = DefaultMaxBytes
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	h.slots = make(chan struct{}, cfg.MaxInFlight)
	if h.storeTimeout <= 0 {
		h.storeTimeout = 10 * time.Second
	}
	if h.logger == nil {
		h.logger = slog.New(slog.DiscardHandler)
	}
	if cfg.TracerProvider != nil {
		h.tracer = cfg.TracerProvider.Tracer("example.com/paymentsd/inbox")
	}
	return h, nil
}

// NewServer returns an http.Server for h with the bounds an internet-facing
// listener needs: small headers, and deadlines on reading them, on reading
// the body and on idle connections.
func NewServer(h http.Handler, errorLog *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		MaxHeaderBytes:    8 << 10,
		ReadHeaderTimeout: 5 * time.Second,
		// Headers and body together; a delivery is at most a few hundred
		// KiB, so a sender that takes longer is stalling.
		ReadTimeout:  30 * time.Second,
		WriteTimeout: 30 * time.Second,
		IdleTimeout:  60 * time.Second,
		// net/http's own messages (TLS handshakes, bad requests) name no
		// path.
		ErrorLog: slog.NewLogLogger(errorLog.Handler(), slog.LevelWarn),
	}
}

// ServeHTTP answers one request:
//   - 404, with the body of any unknown path, for every path other than
//     /webhooks/{a configured token}, whatever the method, so a wrong token
//     learns nothing;
//   - 405 with Allow: POST for a configured token and another method;
//   - 413 for a body over the limit;
//   - 503 when the store can't commit the delivery (the provider retries);
//   - 200 with an empty body once the delivery is committed.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ctx := r.Context()
	var span trace.Span
	if h.tracer != nil {
		// A new root: the sender's trace context is not ours to join. The
		// span's name and attributes never carry the path.
		ctx, span = h.tracer.Start(ctx, "webhook delivery",
			trace.WithNewRoot(),
			trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", methodOf(r)), attribute.String("http.route", redactedPath)))
		defer span.End()
	}
	d := h.serve(ctx, w, r)
	h.metrics.count(d.outcome)
	attrs := []slog.Attr{
		slog.String("method", methodOf(r)),
		slog.String("path", d.path),
		slog.Int("status", d.status),
		slog.String("outcome", d.outcome),
		slog.Int("bytes", d.bytes),
		slog.String("remote_addr", r.RemoteAddr),
		slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
	}
	if d.event.Sequence != 0 {
		attrs = append(attrs, slog.Int64("sequence", d.event.Sequence))
		if d.event.DuplicateOf != 0 {
			attrs = append(attrs, slog.Int64("duplicate_of", d.event.DuplicateOf))
		}
	}
	level := slog.LevelInfo
	if d.err != nil {
		level = slog.LevelError
		attrs = append(attrs, slog.String("error", d.err.Error()))
	}
	h.logger.LogAttrs(ctx, level, "webhook", attrs...)
	if span != nil {
		span.SetAttributes(attribute.Int("http.response.status_code", d.status), attribute.String("paymentsd.webhook.outcome", d.outcome))
		if d.event.Sequence != 0 {
			span.SetAttributes(attribute.Int64("paymentsd.webhook.sequence", d.event.Sequence))
		}
		if d.err != nil {
			span.SetStatus(codes.Error, d.err.Error())
		}
	}
}

// delivery is what ServeHTTP logs about a request.
type delivery struct {
	path    string // redactedPath or otherPath, never the path itself
	status  int
	outcome string
	bytes   int
	event   store.Event
	err     error // a failure of ours, never the sender's
}

func (h *Handler) serve(ctx context.Context, w http.ResponseWriter, r *http.Request) delivery {
	tok, ours := strings.CutPrefix(r.URL.Path, PathPrefix)
	d := delivery{path: otherPath}
	if ours {
		// Whatever follows the prefix may be a token, right or nearly so.
		d.path = redactedPath
	}
	if !ours || !h.valid(tok) {
		// The same answer as for any unknown path, whatever the method.
		d.status, d.outcome = http.StatusNotFound, OutcomeBadToken
		http.NotFound(w, r)
		return d
	}
	if r.Method != http.MethodPost {
		d.status, d.outcome = http.StatusMethodNotAllowed, OutcomeBadMethod
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed: deliveries are POST", d.status)
		return d
	}
	if r.ContentLength > h.maxBytes {
		d.status, d.outcome = http.StatusRequestEntityTooLarge, OutcomeTooLarge
		http.Error(w, fmt.Sprintf("body over the limit of %d bytes", h.maxBytes), d.status)
		return d
	}
	// Only a caller holding the token gets this far, but its bodies are
	// still bounded in number as well as size.
	select {
	case h.slots <- struct{}{}:
		h.metrics.started()
		defer func() {
			<-h.slots
			h.metrics.ended()
		}()
	default:
		d.status, d.outcome = http.StatusServiceUnavailable, OutcomeBusy
		w.Header().Set("Retry-After", "1")
		http.Error(w, "too many deliveries in progress: retry", d.status)
		return d
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.maxBytes))
	d.bytes = len(body)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			d.status, d.outcome = http.StatusRequestEntityTooLarge, OutcomeTooLarge
			http.Error(w, fmt.Sprintf("body over the limit of %d bytes", h.maxBytes), d.status)
			return d
		}
		d.status, d.outcome = http.StatusBadRequest, OutcomeBadRequest
		http.Error(w, "could not read the body", d.status)
		return d
	}

	e := store.Event{
		ReceivedAt:  time.Now().UTC(),
		ContentType: r.Header.Get("Content-Type"),
		Headers:     h.headers(r),
		Body:        body,
		BodySHA256:  sha256.Sum256(body),
	}
	// The sender hanging up must not cancel a commit half way: it either
	// lands or fails on its own terms.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.storeTimeout)
	defer cancel()
	e, err = h.store.AppendEvent(sctx, e)
	if err != nil {
		d.status, d.outcome = http.StatusServiceUnavailable, OutcomeStoreFailure
		d.err = fmt.Errorf("store the delivery: %w", err)
		http.Error(w, "the delivery could not be stored; send it again", d.status)
		return d
	}
	d.event = e
	d.status, d.outcome = http.StatusOK, OutcomeStored
	if e.DuplicateOf != 0 {
		d.outcome = OutcomeDuplicate
	}
	if h.appended != nil {
		h.appended(e)
	}
	w.WriteHeader(http.StatusOK)
	return d
}

// valid compares tok with every configured token in constant time: both
// sides are hashed first, so neither the comparison nor its length says
// anything about a configured token.
func (h *Handler) valid(tok string) bool {
	sum := sha256.Sum256([]byte(tok))
	ok := 0
	for _, want := range h.tokens {
		ok |= subtle.ConstantTimeCompare(sum[:], want[:])
	}
	return ok == 1
}

// hopByHop are the headers that describe one connection, not the delivery
// (RFC 9110 section 7.6.1), and are not kept.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// headers returns r's headers less hop-by-hop ones, by name in canonical
// form, each name's values in the order received. net/http does not keep
// the order of different names, so they are sorted. Host is included. A
// header value that carries the webhook path with a configured token (a
// proxy's X-Original-URI, say) has the token replaced.
func (h *Handler) headers(r *http.Request) []store.Header {
	drop := map[string]bool{}
	for _, v := range r.Header.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				drop[http.CanonicalHeaderKey(name)] = true
			}
		}
	}
	for _, name := range hopByHop {
		drop[name] = true
	}
	names := make([]string, 0, len(r.Header)+1)
	for name := range r.Header {
		if !drop[name] && !strings.HasPrefix(name, "Proxy-") {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	out := make([]store.Header, 0, len(names)+1)
	if r.Host != "" {
		out = append(out, store.Header{Name: "Host", Value: h.redact(r.Host)})
	}
	for _, name := range names {
		for _, v := range r.Header[name] {
			out = append(out, store.Header{Name: name, Value: h.redact(v)})
		}
	}
	return out
}

// redact replaces a configured token that follows /webhooks/ in v.
func (h *Handler) redact(v string) string {
	i := strings.Index(v, PathPrefix)
	if i < 0 {
		return v
	}
	// Only a path segment after /webhooks/ can be a token.
	var b strings.Builder
	for i >= 0 {
		b.WriteString(v[:i+len(PathPrefix)])
		v = v[i+len(PathPrefix):]
		end := strings.IndexFunc(v, func(c rune) bool { return c > 0x7f || !unreserved(byte(c)) })
		if end < 0 {
			end = len(v)
		}
		if h.valid(v[:end]) {
			b.WriteString("[REDACTED]")
		} else {
			b.WriteString(v[:end])
		}
		v = v[end:]
		i = strings.Index(v, PathPrefix)
	}
	b.WriteString(v)
	return b.String()
}

func (m *Metrics) count(outcome string) {
	if m != nil {
		m.deliveries.WithLabelValues(outcome).Inc()
	}
}

func (m *Metrics) started() {
	if m != nil {
		m.inProgress.Inc()
	}
}

func (m *Metrics) ended() {
	if m != nil {
		m.inProgress.Dec()
	}
}
