package inbox

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"example.com/paymentsd/internal/store"
)

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
