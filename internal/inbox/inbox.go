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
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
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
	OutcomeStored    = "stored"
	OutcomeDuplicate = "duplicate"
	// OutcomeBadToken: a path under /webhooks/ without a configured token.
	OutcomeBadToken = "bad_token"
	// OutcomeNotFound: any other path (probes, scanners, /healthz).
	OutcomeNotFound     = "not_found"
	OutcomeTooLarge     = "too_large"
	OutcomeStoreFailure = "store_failure"
	OutcomeBadMethod    = "bad_method"
	// OutcomeBadRequest: the body could not be read (cut off, or too slow).
	OutcomeBadRequest = "bad_request"
	// OutcomeBusy: the bodies being read and stored hold the deliveries'
	// byte budget; 503, and the provider retries.
	OutcomeBusy = "busy"
	// OutcomeOverQuota: the inbox holds its quota, or the database's volume
	// is down to the reserve kept for payments; 503, and the provider
	// retries.
	OutcomeOverQuota = "over_quota"
)

// Values of the token label: which configured token a delivery carried,
// in the order configured, so a rotation shows when the old one falls
// silent.
const (
	TokenFirst  = "first"
	TokenSecond = "second"
	TokenNone   = "none"
)

// Metrics counts deliveries and connections.
type Metrics struct {
	deliveries  *prometheus.CounterVec
	inProgress  prometheus.Gauge
	storedBytes prometheus.Gauge
	quotaBytes  prometheus.Gauge
	dropped     *prometheus.CounterVec
}

// NewMetrics registers the inbox's metrics on reg; labels common to every
// series, such as the environment, belong on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paymentsd_webhook_deliveries_total",
			Help: "Requests to the webhook port, by outcome (stored, duplicate: stored with the same body as an earlier event, bad_token, not_found, bad_method, too_large, bad_request, store_failure, busy, over_quota) and token (first or second configured; none without one).",
		}, []string{"outcome", "token"}),
		inProgress: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paymentsd_webhook_deliveries_in_progress",
			Help: "Webhook deliveries being read and stored now.",
		}),
		storedBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paymentsd_webhook_stored_bytes",
			Help: "Bytes the webhook inbox holds (bodies, content types and headers), as of the last count.",
		}),
		quotaBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paymentsd_webhook_max_stored_bytes",
			Help: "PAYMENTS_WEBHOOK_MAX_STORED_BYTES: past it, deliveries are refused (over_quota).",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paymentsd_webhook_connections_dropped_total",
			Help: "Webhook port connections closed by paymentsd, by reason: per_ip (the address had its share), full (every connection had shown a token), evicted (the oldest that had shown none, for a new one).",
		}, []string{"reason"}),
	}
	reg.MustRegister(m.deliveries, m.inProgress, m.storedBytes, m.quotaBytes, m.dropped)
	for _, o := range []string{OutcomeBadToken, OutcomeNotFound} {
		m.deliveries.WithLabelValues(o, TokenNone)
	}
	for _, r := range []string{dropPerIP, dropFull, dropEvicted} {
		m.dropped.WithLabelValues(r)
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

// tokenSet is the tokens accepted, as hashes, and the tokens redact
// removes: those accepted and those accepted before, whose deliveries the
// provider may still be retrying.
type tokenSet struct {
	sums   [][sha256.Size]byte
	redact []string
	folded []string // redact in lower case, for redactName
}

// SetTokens replaces the accepted tokens: one, or two while the
// provider's dashboard is switched from an old token to a new one.
// Deliveries under way finish with the tokens they started with. Tokens
// accepted before are still redacted wherever they turn up. The error
// never quotes a token.
func (h *Handler) SetTokens(tokens []string) error {
	switch {
	case len(tokens) == 0 || len(tokens) > 2:
		return fmt.Errorf("inbox: %d tokens, want 1 or 2", len(tokens))
	case len(tokens) == 2 && tokens[0] == tokens[1]:
		return errors.New("inbox: the same token twice")
	}
	next := &tokenSet{}
	for _, tok := range tokens {
		if err := ValidateToken(tok); err != nil {
			return fmt.Errorf("inbox: %w", err)
		}
		next.sums = append(next.sums, sha256.Sum256([]byte(tok)))
		next.redact = append(next.redact, tok)
	}
	h.tokenMu.Lock()
	defer h.tokenMu.Unlock()
	if old := h.tokens.Load(); old != nil {
		for _, tok := range old.redact {
			if !slices.Contains(next.redact, tok) {
				next.redact = append(next.redact, tok)
			}
		}
	}
	// Two rotations back is long enough for the provider's retries.
	next.redact = next.redact[:min(len(next.redact), 6)]
	for _, tok := range next.redact {
		next.folded = append(next.folded, strings.ToLower(tok))
	}
	h.tokens.Store(next)
	if m := h.metrics; m != nil {
		for i := range next.sums {
			for _, o := range []string{OutcomeStored, OutcomeDuplicate, OutcomeTooLarge, OutcomeStoreFailure, OutcomeBadMethod, OutcomeBadRequest, OutcomeBusy, OutcomeOverQuota} {
				m.deliveries.WithLabelValues(o, tokenLabel(i))
			}
		}
	}
	return nil
}

// tokenLabel names the i'th configured token.
func tokenLabel(i int) string {
	switch i {
	case 0:
		return TokenFirst
	case 1:
		return TokenSecond
	}
	return TokenNone
}

// ServeHTTP answers one request:
//   - 404, with the body of any unknown path, for every request target
//     other than exactly /webhooks/{a configured token} (an optional query
//     aside): escaped forms, absolute URLs and other paths included,
//     whatever the method, so a wrong token learns nothing;
//   - 405 with Allow: POST for a configured token and another method;
//   - 413 for a body over the limit;
//   - 503 with Retry-After when the deliveries' byte budget is held, the
//     inbox is over its quota, or the store can't commit the delivery (the
//     provider retries);
//   - 200 with an empty body once the delivery is committed.
//
// A connection that has not shown a configured token is closed after its
// answer.
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
	h.metrics.count(d.outcome, d.token)
	attrs := []slog.Attr{
		slog.String("method", methodOf(r)),
		slog.String("path", d.path),
		slog.Int("status", d.status),
		slog.String("outcome", d.outcome),
		slog.String("token", d.token),
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
	switch {
	case d.err != nil && d.outcome == OutcomeOverQuota:
		// Expected once the inbox is full; the metric is what alerts.
		level = slog.LevelWarn
		attrs = append(attrs, slog.String("error", d.err.Error()))
	case d.err != nil:
		level = slog.LevelError
		attrs = append(attrs, slog.String("error", d.err.Error()))
	}
	h.logger.LogAttrs(ctx, level, "webhook", attrs...)
	if span != nil {
		span.SetAttributes(attribute.Int("http.response.status_code", d.status), attribute.String("paymentsd.webhook.outcome", d.outcome),
			attribute.String("paymentsd.webhook.token", d.token))
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
	token   string // TokenFirst, TokenSecond or TokenNone
	status  int
	outcome string
	bytes   int
	event   store.Event
	err     error // a failure of ours, never the sender's
}

func (h *Handler) serve(ctx context.Context, w http.ResponseWriter, r *http.Request) delivery {
	d := delivery{path: otherPath, token: TokenNone}
	// The request target exactly as sent: r.URL.Path is decoded, so
	// /webhooks%2F{token} and /webhooks/%61… would match it, and an
	// absolute URL would put its own host in place of the Host header.
	target, _, _ := strings.Cut(r.RequestURI, "?")
	tok, ours := strings.CutPrefix(target, PathPrefix)
	if !ours {
		d.status, d.outcome = http.StatusNotFound, OutcomeNotFound
		notFound(w, r)
		return d
	}
	// Whatever follows the prefix may be a token, right or nearly so.
	d.path = redactedPath
	i := h.match(tok)
	if i < 0 {
		// The same answer as for any unknown path, whatever the method.
		d.status, d.outcome = http.StatusNotFound, OutcomeBadToken
		notFound(w, r)
		return d
	}
	d.token = tokenLabel(i)
	trust(ctx)
	if r.Method != http.MethodPost {
		d.status, d.outcome = http.StatusMethodNotAllowed, OutcomeBadMethod
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed: deliveries are POST", d.status)
		return d
	}
	if r.ContentLength > h.maxBytes {
		d.status, d.outcome = http.StatusRequestEntityTooLarge, OutcomeTooLarge
		closeAfter(w, r)
		http.Error(w, fmt.Sprintf("body over the limit of %d bytes", h.maxBytes), d.status)
		return d
	}
	h.metrics.started()
	defer h.metrics.ended()
	body, held, err := h.readBody(r)
	defer h.bodies.Release(held)
	d.bytes = len(body)
	switch {
	case errors.Is(err, errBusy):
		d.status, d.outcome = http.StatusServiceUnavailable, OutcomeBusy
		closeAfter(w, r)
		w.Header().Set("Retry-After", "1")
		http.Error(w, "too many deliveries in progress: retry", d.status)
		return d
	case errors.Is(err, errTooLarge):
		d.status, d.outcome = http.StatusRequestEntityTooLarge, OutcomeTooLarge
		closeAfter(w, r)
		http.Error(w, fmt.Sprintf("body over the limit of %d bytes", h.maxBytes), d.status)
		return d
	case err != nil:
		d.status, d.outcome = http.StatusBadRequest, OutcomeBadRequest
		closeAfter(w, r)
		http.Error(w, "could not read the body", d.status)
		return d
	}

	headers := h.headers(r)
	e := store.Event{
		ReceivedAt:  time.Now().UTC(),
		ContentType: h.redact(r.Header.Get("Content-Type")),
		Headers:     headers,
		Body:        body,
		BodySHA256:  sha256.Sum256(body),
	}
	// The sender hanging up must not cancel a commit half way: it either
	// lands or fails on its own terms.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.storeTimeout)
	defer cancel()
	e, err = h.store.AppendEvent(sctx, e)
	switch {
	case errors.Is(err, store.ErrInboxFull):
		d.status, d.outcome = http.StatusServiceUnavailable, OutcomeOverQuota
		d.err = fmt.Errorf("store the delivery: %w", err)
		// Room comes back as retention deletes old events, every 10
		// minutes, or when an operator raises the quota.
		w.Header().Set("Retry-After", "60")
		http.Error(w, "the inbox is full; send it again later", d.status)
		return d
	case err != nil:
		d.status, d.outcome = http.StatusServiceUnavailable, OutcomeStoreFailure
		d.err = fmt.Errorf("store the delivery: %w", err)
		http.Error(w, "the delivery could not be stored; send it again", d.status)
		return d
	}
	d.event = e
	h.metrics.stored(e.Size)
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

// notFound answers a request that is no delivery, and ends its connection
// if it has not shown a token.
func notFound(w http.ResponseWriter, r *http.Request) {
	if !trusted(r.Context()) {
		w.Header().Set("Connection", "close")
	}
	http.NotFound(w, r)
}

// closeAfter ends an HTTP/1 connection with this answer, rather than
// drain a body the handler won't read. Over HTTP/2 only the stream ends:
// "Connection: close" there would close the whole connection, with the
// sender's other deliveries on it.
func closeAfter(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
}

var (
	errBusy     = errors.New("the deliveries' byte budget is held")
	errTooLarge = errors.New("body over the limit")
)

// firstRead is the most a body holds before more of it has arrived: most
// deliveries fit.
const firstRead = 4 << 10

// readBody reads r's body, holding its bytes against the deliveries' budget
// as they arrive: a body that trickles in holds only what has come, so slow
// senders can't keep the others out. It returns the body and the bytes it
// holds, to be released once the delivery is answered, even on error.
func (h *Handler) readBody(r *http.Request) (body []byte, held int64, err error) {
	// With a Content-Length the body is read to exactly that; without
	// one, a byte past MaxBytes shows it too large.
	target := h.maxBytes + 1
	if r.ContentLength >= 0 {
		target = r.ContentLength
	}
	grow := func(size int64) bool {
		if !h.bodies.TryAcquire(size - held) {
			return false
		}
		nb := make([]byte, len(body), size)
		copy(nb, body)
		body, held = nb, size
		return true
	}
	if !grow(min(target, firstRead)) {
		return nil, held, errBusy
	}
	for {
		if len(body) == cap(body) {
			if int64(cap(body)) >= target {
				if r.ContentLength >= 0 {
					return body, held, nil
				}
				return nil, held, errTooLarge
			}
			if !grow(min(2*int64(cap(body)), target)) {
				return nil, held, errBusy
			}
		}
		n, err := r.Body.Read(body[len(body):cap(body)])
		body = body[:len(body)+n]
		if errors.Is(err, io.EOF) {
			switch {
			case int64(len(body)) > h.maxBytes:
				return nil, held, errTooLarge
			case r.ContentLength >= 0 && int64(len(body)) < r.ContentLength:
				return nil, held, io.ErrUnexpectedEOF
			}
			return body, held, nil
		}
		if err != nil {
			return nil, held, err
		}
	}
}

// match compares tok with every configured token in constant time and
// returns the index of the one it is, or -1: both sides are hashed first,
// so neither the comparison nor its length says anything about a
// configured token.
func (h *Handler) match(tok string) int {
	sum := sha256.Sum256([]byte(tok))
	found := -1
	for i, want := range h.tokens.Load().sums {
		if subtle.ConstantTimeCompare(sum[:], want[:]) == 1 {
			found = i
		}
	}
	return found
}

// hopByHop are the headers that describe one connection, not the delivery
// (RFC 9110 section 7.6.1), and are not kept.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// headers returns r's headers less hop-by-hop ones, by name in canonical
// form, each name's values in the order received, as bytes. net/http does
// not keep the order of different names, so they are sorted. Host is
// included. A configured token anywhere in a value (a proxy's
// X-Original-URI, say), as written or percent-encoded, is replaced, and so
// is one in a name, in any case.
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
			out = append(out, store.Header{Name: h.redactName(name), Value: h.redact(v)})
		}
	}
	return out
}

func (m *Metrics) count(outcome, token string) {
	if m != nil {
		m.deliveries.WithLabelValues(outcome, token).Inc()
	}
}

// stored adds an event's bytes to the stored-bytes gauge, which WatchUsage
// sets right as it counts (retention deletes without the intake knowing).
func (m *Metrics) stored(size int64) {
	if m != nil {
		m.storedBytes.Add(float64(size))
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

// WatchUsage sets the inbox's stored-bytes gauge now and every interval
// until ctx ends; retention deletes events without the intake knowing.
func (h *Handler) WatchUsage(ctx context.Context, interval time.Duration) {
	if h.metrics == nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		uctx, cancel := context.WithTimeout(ctx, interval)
		u, err := h.store.InboxUsage(uctx)
		cancel()
		if err == nil {
			h.metrics.storedBytes.Set(float64(u.StoredBytes))
		} else if ctx.Err() == nil {
			h.logger.WarnContext(ctx, "count the webhook inbox's bytes", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
