package inbox_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"example.com/paymentsd/internal/inbox"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	token    = "tok_SENTINEL_0123456789abcdefghijklmnop"
	oldToken = "old_SENTINEL_zyxwvutsrqponmlkjihgfedcba"
)

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// intake is an inbox served on a loopback listener.
type intake struct {
	addr     string
	store    *store.Store
	logs     *syncBuffer
	registry *prometheus.Registry
	client   *http.Client
	appended chan store.Event
	handler  *inbox.Handler
}

// startIntake serves an inbox accepting tokens, over a fresh SQLite store,
// through inbox.NewServer. It stops when the test ends.
func startIntake(t *testing.T, tokens ...string) *intake {
	t.Helper()
	return startIntakeWith(t, intakeOptions{}, tokens...)
}

// startTracedIntake is startIntake with spans going to tp.
func startTracedIntake(t *testing.T, tp trace.TracerProvider, tokens ...string) *intake {
	t.Helper()
	return startIntakeWith(t, intakeOptions{tp: tp}, tokens...)
}

// intakeOptions vary startIntakeWith's inbox.
type intakeOptions struct {
	tp       trace.TracerProvider
	maxBytes int64 // 0 means 4 KiB
	limits   inbox.ConnLimits
	store    store.Options
}

func startIntakeWith(t *testing.T, opts intakeOptions, tokens ...string) *intake {
	t.Helper()
	if opts.maxBytes == 0 {
		opts.maxBytes = 4 << 10
	}
	st, err := store.Open(t.Context(), storetest.SQLiteURL(t), "sandbox", opts.store)
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	in := &intake{
		store:    st,
		logs:     &syncBuffer{},
		registry: prometheus.NewRegistry(),
		appended: make(chan store.Event, 100),
	}
	logger := slog.New(slog.NewJSONHandler(in.logs, nil))
	h, err := inbox.New(inbox.Config{
		Tokens:         tokens,
		Store:          st,
		MaxBytes:       opts.maxBytes,
		Appended:       func(e store.Event) { in.appended <- e },
		Logger:         logger,
		Metrics:        inbox.NewMetrics(in.registry),
		TracerProvider: opts.tp,
	})
	if err != nil {
		t.Fatalf("inbox.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := inbox.NewServer(h, opts.limits, logger)
	go srv.HTTP.Serve(srv.Listener(ln))
	t.Cleanup(func() {
		// Shutdown, not Close: it waits for connections the server is
		// closing after a refusal (net/http lingers on those), which
		// goleak would otherwise find.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.HTTP.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	in.addr, in.handler = ln.Addr().String(), h
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	in.client = &http.Client{Transport: transport}
	return in
}

// do sends a request and returns the status, headers and body.
func (in *intake) do(t *testing.T, method, path string, body io.Reader, header http.Header) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, "http://"+in.addr+path, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := in.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// raw sends req as written over a new connection and returns the response.
func (in *intake) raw(t *testing.T, req string) *http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", in.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func (in *intake) events(t *testing.T) []store.Event {
	t.Helper()
	evs, err := in.store.ListEvents(t.Context(), store.EventQuery{Limit: 1000})
	if err != nil {
		t.Fatalf("ListEvents: %v", err)
	}
	return evs
}

// deliveries returns paymentsd_webhook_deliveries_total by outcome, over
// both tokens.
func (in *intake) deliveries(t *testing.T) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, s := range in.series(t, "paymentsd_webhook_deliveries_total") {
		if s.value > 0 {
			out[s.labels["outcome"]] += s.value
		}
	}
	return out
}

type series struct {
	labels map[string]string
	value  float64
}

// series returns the series of the counter or gauge name.
func (in *intake) series(t *testing.T, name string) []series {
	t.Helper()
	families, err := in.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []series
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			s := series{labels: map[string]string{}, value: m.GetCounter().GetValue() + m.GetGauge().GetValue()}
			for _, l := range m.GetLabel() {
				s.labels[l.GetName()] = l.GetValue()
			}
			out = append(out, s)
		}
	}
	return out
}

func TestDeliveryStoredByteForByte(t *testing.T) {
	t.Parallel()
	in := startIntake(t, token)
	body := make([]byte, 0, 512)
	for i := range 512 {
		body = append(body, byte(i))
	}
	const contentType = "application/x-provider-thing; charset=binary; q=\"odd\""
	// Written by hand, so the hop-by-hop headers and their order are
	// exactly as a proxy might send them.
	req := "POST /webhooks/" + token + " HTTP/1.1\r\n" +
		"Host: hooks.example.com\r\n" +
		"Content-Type: " + contentType + "\r\n" +
		"X-Provider-Thing: b\r\n" +
		"X-Provider-Thing: a\r\n" +
		"Connection: keep-alive, X-Hop\r\n" +
		"X-Hop: dropped\r\n" +
		"Keep-Alive: timeout=5\r\n" +
		"Proxy-Authorization: Basic Zm9vOmJhcg==\r\n" +
		"Te: trailers\r\n" +
		"Upgrade: example/1\r\n" +
		"X-Original-Uri: /webhooks/" + token + "?x=1\r\n" +
		fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body)) + string(body)
	resp := in.raw(t, req)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /webhooks/{token} = %d, want 200", resp.StatusCode)
	}
	got := in.events(t)
	if len(got) != 1 {
		t.Fatalf("stored %d events, want 1", len(got))
	}
	e := got[0]
	if !bytes.Equal(e.Body, body) {
		t.Errorf("stored body = %x, want %x", e.Body, body)
	}
	if e.BodySHA256 != sha256.Sum256(body) {
		t.Errorf("stored BodySHA256 = %x, want the body's", e.BodySHA256)
	}
	if e.ContentType != contentType {
		t.Errorf("stored ContentType = %q, want %q", e.ContentType, contentType)
	}
	if e.Sequence == 0 || e.DuplicateOf != 0 || e.ReceivedAt.IsZero() {
		t.Errorf("stored Sequence, DuplicateOf, ReceivedAt = %d, %d, %v; want assigned, 0, set", e.Sequence, e.DuplicateOf, e.ReceivedAt)
	}
	want := []store.Header{
		{Name: "Host", Value: "hooks.example.com"},
		{Name: "Content-Length", Value: fmt.Sprint(len(body))},
		{Name: "Content-Type", Value: contentType},
		{Name: "X-Original-Uri", Value: "/webhooks/[REDACTED]?x=1"},
		{Name: "X-Provider-Thing", Value: "b"},
		{Name: "X-Provider-Thing", Value: "a"},
	}
	if diff := cmp.Diff(want, e.Headers); diff != "" {
		t.Errorf("stored headers (-want +got):\n%s", diff)
	}
	if (<-in.appended).Sequence != e.Sequence {
		t.Errorf("Appended was not called with the stored event")
	}
	if d := in.deliveries(t); d[inbox.OutcomeStored] != 1 {
		t.Errorf("deliveries = %v, want stored 1", d)
	}
}

func TestRefusedAndNothingStored(t *testing.T) {
	t.Parallel()
	in := startIntake(t, token)
	_, _, notFoundBody := in.do(t, http.MethodGet, "/no-such-path", nil, nil)
	big := strings.Repeat("x", 4<<10+1)

	tests := []struct {
		name    string
		method  string
		path    string
		body    io.Reader
		want    int
		outcome string
	}{
		{"wrong token", http.MethodPost, "/webhooks/" + strings.Repeat("w", 40), strings.NewReader("{}"), 404, inbox.OutcomeBadToken},
		{"wrong token GET", http.MethodGet, "/webhooks/" + strings.Repeat("w", 40), nil, 404, inbox.OutcomeBadToken},
		{"token prefix", http.MethodPost, "/webhooks/" + token[:len(token)-1], strings.NewReader("{}"), 404, inbox.OutcomeBadToken},
		{"token plus a byte", http.MethodPost, "/webhooks/" + token + "x", strings.NewReader("{}"), 404, inbox.OutcomeBadToken},
		{"token then a segment", http.MethodPost, "/webhooks/" + token + "/x", strings.NewReader("{}"), 404, inbox.OutcomeBadToken},
		{"no token", http.MethodPost, "/webhooks/", strings.NewReader("{}"), 404, inbox.OutcomeBadToken},
		{"no slash", http.MethodPost, "/webhooks", strings.NewReader("{}"), 404, inbox.OutcomeBadToken},
		{"root", http.MethodPost, "/", strings.NewReader("{}"), 404, inbox.OutcomeBadToken},
		{"GET", http.MethodGet, "/webhooks/" + token, nil, 405, inbox.OutcomeBadMethod},
		{"PUT", http.MethodPut, "/webhooks/" + token, strings.NewReader("{}"), 405, inbox.OutcomeBadMethod},
		// Content-Length over the limit: refused before reading.
		{"too large", http.MethodPost, "/webhooks/" + token, strings.NewReader(big), 413, inbox.OutcomeTooLarge},
		// Chunked, no length: refused while reading.
		{"too large chunked", http.MethodPost, "/webhooks/" + token, io.MultiReader(strings.NewReader(big)), 413, inbox.OutcomeTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, header, body := in.do(t, tt.method, tt.path, tt.body, nil)
			if status != tt.want {
				t.Errorf("%s %s = %d, want %d", tt.method, tt.name, status, tt.want)
			}
			if tt.want == 404 && !bytes.Equal(body, notFoundBody) {
				t.Errorf("%s %s body = %q, want the same as any unknown path, %q", tt.method, tt.name, body, notFoundBody)
			}
			if tt.want == 405 && header.Get("Allow") != http.MethodPost {
				t.Errorf("%s %s Allow = %q, want POST", tt.method, tt.name, header.Get("Allow"))
			}
			if bytes.Contains(body, []byte(token)) {
				t.Errorf("%s %s body contains the token", tt.method, tt.name)
			}
		})
	}
	if got := in.events(t); len(got) != 0 {
		t.Errorf("stored %d events after refusals, want 0", len(got))
	}
	// Paths outside /webhooks/ (and the probe for the 404 body) are not
	// counted as bad tokens, which a rotation watches.
	want := map[string]float64{inbox.OutcomeBadToken: 6, inbox.OutcomeNotFound: 3, inbox.OutcomeBadMethod: 2, inbox.OutcomeTooLarge: 2}
	if diff := cmp.Diff(want, in.deliveries(t)); diff != "" {
		t.Errorf("deliveries (-want +got):\n%s", diff)
	}
	if strings.Contains(in.logs.String(), token) || strings.Contains(in.logs.String(), token[:len(token)-1]) {
		t.Errorf("logs contain the token:\n%s", in.logs.String())
	}
}

// leaksToken reports whether s holds any ten bytes of token, in either
// case, as written or once or twice percent-decoded.
func leaksToken(s string) bool {
	for range 3 {
		low := strings.ToLower(s)
		for i := 0; i+10 <= len(token); i++ {
			if strings.Contains(low, strings.ToLower(token[i:i+10])) {
				return true
			}
		}
		s = percentDecode(s)
	}
	return false
}

// percentDecode decodes every well-formed %XX in s and keeps the rest.
func percentDecode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// TestNearMissesNeverLogTheToken sends requests that carry the token where
// the intake does not take it (a path that is nearly the deliveries' own,
// the token escaped, the token as the method): each is refused like any
// unknown path, and neither its access line nor its span holds the token.
func TestNearMissesNeverLogTheToken(t *testing.T) {
	t.Parallel()
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	in := startTracedIntake(t, tp, token)

	escaped := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			fmt.Fprintf(&b, "%%%02X", s[i])
		}
		return b.String()
	}
	requests := []struct{ name, method, target string }{
		{"double slash", "POST", "//webhooks/" + token},
		{"singular", "POST", "/webhook/" + token},
		{"under /v1", "POST", "/v1/webhooks/" + token},
		{"capitalised", "POST", "/Webhooks/" + token},
		{"no slash after the prefix", "POST", "/webhooks" + token},
		{"at the root", "POST", "/" + token},
		{"dot segment", "POST", "/./webhooks/" + token},
		{"escaped token, singular", "POST", "/webhook/" + escaped(token)},
		{"half escaped, capitalised", "POST", "/Webhooks/" + token[:10] + escaped(token[10:])},
		{"escaped twice", "POST", "/webhook/" + strings.ReplaceAll(escaped(token), "%", "%25")},
		{"absolute form", "POST", "http://x//webhooks/" + token},
		{"token as the method", token, "/webhooks/" + strings.Repeat("w", 40)},
	}
	for _, r := range requests {
		resp := in.raw(t, r.method+" "+r.target+" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s (%s) = %d, want 404", r.name, r.target, resp.StatusCode)
		}
	}

	lines := strings.Split(strings.TrimSpace(in.logs.String()), "\n")
	if len(lines) != len(requests) {
		t.Errorf("logged %d lines for %d requests, want one each", len(lines), len(requests))
	}
	for _, l := range lines {
		if leaksToken(l) {
			t.Errorf("access line holds the token: %s", l)
		}
	}
	spans := exporter.GetSpans()
	if len(spans) != len(requests) {
		t.Errorf("recorded %d spans for %d requests, want one each", len(spans), len(requests))
	}
	for _, s := range spans {
		b, _ := json.Marshal(s.Attributes)
		if leaksToken(s.Name + string(b) + s.Status.Description) {
			t.Errorf("span %q holds the token: %s", s.Name, b)
		}
	}
	if d := in.deliveries(t); d[inbox.OutcomeBadToken] != 1 || d[inbox.OutcomeNotFound] != float64(len(requests)-1) {
		t.Errorf("deliveries = %v, want bad_token 1 (the token as the method), not_found %d", d, len(requests)-1)
	}
	if got := in.events(t); len(got) != 0 {
		t.Errorf("stored %d events, want 0", len(got))
	}
}

func TestHugeHeadersRefused(t *testing.T) {
	t.Parallel()
	in := startIntake(t, token)
	resp := in.raw(t, "POST /webhooks/"+token+" HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 16<<10)+"\r\nContent-Length: 0\r\n\r\n")
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("16 KiB of headers = %d, want 431", resp.StatusCode)
	}
	if got := in.events(t); len(got) != 0 {
		t.Errorf("stored %d events, want 0", len(got))
	}
}

func TestRotationAcceptsBothTokens(t *testing.T) {
	t.Parallel()
	in := startIntake(t, oldToken, token)
	for _, tok := range []string{oldToken, token} {
		if status, _, _ := in.do(t, http.MethodPost, "/webhooks/"+tok, strings.NewReader("{}"), nil); status != http.StatusOK {
			t.Errorf("POST with token %d = %d, want 200", len(tok), status)
		}
	}
	if got := in.events(t); len(got) != 2 {
		t.Errorf("stored %d events, want 2", len(got))
	}
	if strings.Contains(in.logs.String(), token) || strings.Contains(in.logs.String(), oldToken) {
		t.Errorf("logs contain a token:\n%s", in.logs.String())
	}
}

func TestDuplicateBodyStoredAndMarked(t *testing.T) {
	t.Parallel()
	in := startIntake(t, token)
	for range 2 {
		if status, _, _ := in.do(t, http.MethodPost, "/webhooks/"+token, strings.NewReader(`{"same":true}`), nil); status != http.StatusOK {
			t.Fatalf("POST = %d, want 200", status)
		}
	}
	got := in.events(t)
	if len(got) != 2 {
		t.Fatalf("stored %d events, want 2", len(got))
	}
	if got[0].DuplicateOf != 0 || got[1].DuplicateOf != got[0].Sequence {
		t.Errorf("DuplicateOf = %d, %d; want 0, %d", got[0].DuplicateOf, got[1].DuplicateOf, got[0].Sequence)
	}
	want := map[string]float64{inbox.OutcomeStored: 1, inbox.OutcomeDuplicate: 1}
	if diff := cmp.Diff(want, in.deliveries(t)); diff != "" {
		t.Errorf("deliveries (-want +got):\n%s", diff)
	}
}

func TestStoreFailureIs503(t *testing.T) {
	t.Parallel()
	in := startIntake(t, token)
	if err := in.store.Close(); err != nil {
		t.Fatal(err)
	}
	status, _, body := in.do(t, http.MethodPost, "/webhooks/"+token, strings.NewReader("{}"), nil)
	if status != http.StatusServiceUnavailable {
		t.Errorf("POST with the store closed = %d %s, want 503", status, body)
	}
	if d := in.deliveries(t); d[inbox.OutcomeStoreFailure] != 1 {
		t.Errorf("deliveries = %v, want store_failure 1", d)
	}
	if strings.Contains(in.logs.String(), token) {
		t.Errorf("logs contain the token:\n%s", in.logs.String())
	}
	if !strings.Contains(in.logs.String(), `"outcome":"store_failure"`) {
		t.Errorf("no store_failure line logged:\n%s", in.logs.String())
	}
}

func TestNewRefusesBadTokens(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		tokens []string
	}{
		{"none", nil},
		{"three", []string{token, oldToken, token + "x"}},
		{"short", []string{strings.Repeat("a", inbox.MinTokenLength-1)}},
		{"slash", []string{token + "/x"}},
		{"percent", []string{token + "%41"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := inbox.New(inbox.Config{Tokens: tt.tokens, Store: &store.Store{}})
			if err == nil {
				t.Fatalf("inbox.New(%s) = nil error, want one", tt.name)
			}
			for _, tok := range tt.tokens {
				if strings.Contains(err.Error(), tok) {
					t.Errorf("inbox.New error %q contains the token", err)
				}
			}
		})
	}
}

// Compile-time check that the handler is what NewServer serves.
var _ http.Handler = (*inbox.Handler)(nil)

// holdBodies opens n connections with the token, each sending a header
// that promises size bytes of body and then sent bytes of it, and never
// the rest; they are closed when the test ends or by the returned func.
func (in *intake) holdBodies(t *testing.T, n, size, sent int) (release func()) {
	t.Helper()
	var held []net.Conn
	for range n {
		conn, err := net.Dial("tcp", in.addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, conn)
		fmt.Fprintf(conn, "POST /webhooks/%s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", token, size, strings.Repeat("x", sent))
	}
	release = func() {
		for _, c := range held {
			c.Close()
		}
	}
	t.Cleanup(release)
	return release
}

// waitGauge waits until the gauge name is want.
func (in *intake) waitGauge(t *testing.T, name string, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for gaugeValue(t, in.registry, name) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s = %d, want %d", name, gaugeValue(t, in.registry, name), want)
		}
		time.Sleep(5 * time.Millisecond) // the gauge is the only signal
	}
}

// TestSlowBodiesDoNotHoldTheOthersOut: bodies that trickle in hold only
// the bytes that have come, not a slot each. The intake took a slot
// before reading, so 16 of them, with the token, made every other
// delivery 503 until they timed out.
func TestSlowBodiesDoNotHoldTheOthersOut(t *testing.T) {
	t.Parallel()
	in := startIntakeWith(t, intakeOptions{maxBytes: inbox.DefaultMaxBytes}, token)
	in.holdBodies(t, inbox.DefaultMaxInFlight, inbox.DefaultMaxBytes, 1)
	in.waitGauge(t, "paymentsd_webhook_deliveries_in_progress", inbox.DefaultMaxInFlight)
	if status, _, _ := in.do(t, http.MethodPost, "/webhooks/"+token, strings.NewReader(`{"n":1}`), nil); status != http.StatusOK {
		t.Errorf("delivery beside %d slow bodies = %d, want 200", inbox.DefaultMaxInFlight, status)
	}
}

// TestBodyBudgetHeld: bodies that have arrived up to the deliveries' byte
// budget (MaxInFlight bodies of MaxBytes) hold it; the next delivery gets
// 503 with Retry-After (the provider retries) and nothing is stored, and
// the budget comes back as they end.
func TestBodyBudgetHeld(t *testing.T) {
	t.Parallel()
	in := startIntake(t, token) // MaxBytes 4 KiB
	release := in.holdBodies(t, inbox.DefaultMaxInFlight, 4<<10, 4<<10-1)
	in.waitGauge(t, "paymentsd_webhook_deliveries_in_progress", inbox.DefaultMaxInFlight)
	status, header, _ := in.do(t, http.MethodPost, "/webhooks/"+token, strings.NewReader(`{"n":1}`), nil)
	if status != http.StatusServiceUnavailable || header.Get("Retry-After") == "" {
		t.Errorf("delivery past the budget = %d (Retry-After %q), want 503 with Retry-After", status, header.Get("Retry-After"))
	}
	if d := in.deliveries(t); d[inbox.OutcomeBusy] != 1 {
		t.Errorf("deliveries = %v, want busy 1", d)
	}
	if n := len(in.events(t)); n != 0 {
		t.Errorf("%d events stored, want none", n)
	}
	release()
	in.waitGauge(t, "paymentsd_webhook_deliveries_in_progress", 0)
	if status, _, _ := in.do(t, http.MethodPost, "/webhooks/"+token, strings.NewReader(`{"n":2}`), nil); status != http.StatusOK {
		t.Errorf("delivery after the budget came back = %d, want 200", status)
	}
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) int {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return int(f.GetMetric()[0].GetGauge().GetValue())
		}
	}
	return -1
}
