package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"example.com/paymentsd/internal/simulator"
)

func scrape(t *testing.T, in *instance) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	resp, err := in.http.Get("http://" + in.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(raw)))
	if err != nil {
		t.Fatalf("/metrics is not Prometheus text: %v", err)
	}
	return families, string(raw)
}

// sample returns the value of the series in family with the labels.
func sample(families map[string]*dto.MetricFamily, family string, labels map[string]string) (float64, bool) {
	f, ok := families[family]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	p.SetScript(perKey(simulator.Reply{Status: 429}, simulator.Reply{}))
	in := start(t, sandboxEnv(p))
	if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-metrics")); err != nil {
		t.Fatalf("CreateMultiCardPayment() = %v", err)
	}
	in.rest(t, `{}`, nil) // InvalidArgument, through the REST gateway

	families, raw := scrape(t, in)
	method := map[string]string{"grpc_service": "payments.v1.PaymentsService", "grpc_method": "CreateMultiCardPayment", "environment": "sandbox"}
	checks := []struct {
		family string
		labels map[string]string
		want   float64 // at least
	}{
		{"grpc_server_handled_total", with(method, "grpc_code", "OK"), 1},
		{"grpc_server_handled_total", with(method, "grpc_code", "InvalidArgument"), 1},
		{"grpc_server_handling_seconds", method, 2},
		{"paymentsd_provider_requests_total", map[string]string{"outcome": "429", "environment": "sandbox"}, 1},
		{"paymentsd_provider_requests_total", map[string]string{"outcome": "200", "environment": "sandbox"}, 1},
		{"paymentsd_provider_request_duration_seconds", map[string]string{"environment": "sandbox"}, 2},
		{"paymentsd_provider_retries_total", map[string]string{"environment": "sandbox"}, 1},
		{"paymentsd_provider_requests_in_flight", map[string]string{"environment": "sandbox"}, 0},
		{"paymentsd_provider_connections_opened_total", map[string]string{"environment": "sandbox"}, 1},
	}
	for _, c := range checks {
		got, ok := sample(families, c.family, c.labels)
		if !ok || got < c.want {
			t.Errorf("%s%v = %v (present %v), want at least %v", c.family, c.labels, got, ok, c.want)
		}
	}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			found := false
			for _, l := range m.GetLabel() {
				found = found || (l.GetName() == "environment" && l.GetValue() == "sandbox")
			}
			if !found {
				t.Errorf("series of %s has no environment label", name)
				break
			}
		}
	}
	if strings.Contains(raw, sandboxKey) {
		t.Errorf("/metrics contains the API key")
	}
}

func TestHealth(t *testing.T) {
	t.Parallel()
	in := start(t, nil, "--simulate")
	health := healthpb.NewHealthClient(in.conn)
	for _, service := range []string{"", "payments.v1.PaymentsService", "liveness"} {
		resp, err := health.Check(t.Context(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q = %v, %v, want SERVING", service, resp.GetStatus(), err)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := in.http.Get("http://" + in.httpAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s = %d, want 200", path, resp.StatusCode)
		}
	}
}

// TestReadyzWhileDraining holds a payment in flight during shutdown, with a
// shutdown delay, and checks that readiness fails while liveness holds.
func TestReadyzWhileDraining(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	p.SetScript(func(int, simulator.Request) simulator.Reply {
		arrived <- struct{}{}
		return simulator.Reply{Wait: release}
	})
	in := start(t, with(sandboxEnv(p), "PAYMENTS_SHUTDOWN_DELAY", "3s", "PAYMENTS_SHUTDOWN_TIMEOUT", "30s"))
	go in.client.CreateMultiCardPayment(context.Background(), validRequest("k-drain"))
	<-arrived
	go in.stop()
	in.logs.waitFor(t, "draining", nil)

	// During the shutdown delay the listeners are still open.
	get := func(path string) int {
		resp, err := in.http.Get("http://" + in.httpAddr + path)
		if err != nil {
			t.Fatalf("GET %s while draining: %v", path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get("/readyz"); got != http.StatusServiceUnavailable {
		t.Errorf("GET /readyz while draining = %d, want 503", got)
	}
	if got := get("/healthz"); got != http.StatusOK {
		t.Errorf("GET /healthz while draining = %d, want 200", got)
	}
	// What the not-ready alerts read.
	families, _ := scrape(t, in)
	if v, ok := sample(families, "paymentsd_ready", nil); !ok || v != 0 {
		t.Errorf("paymentsd_ready while draining = %v (present %v), want 0", v, ok)
	}
	health := healthpb.NewHealthClient(in.conn)
	if resp, err := health.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health while draining = %v, %v, want NOT_SERVING", resp.GetStatus(), err)
	}
	if resp, err := health.Check(t.Context(), &healthpb.HealthCheckRequest{Service: "liveness"}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC liveness while draining = %v, %v, want SERVING", resp.GetStatus(), err)
	}
	close(release)
}

func TestAccessLog(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	p.SetScript(perKey(simulator.Reply{Status: 429}, simulator.Reply{Status: 201, Body: okBody}))
	in := start(t, sandboxEnv(p))
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-request-id", "rid-log-1")
	if _, err := in.client.CreateMultiCardPayment(ctx, validRequest("k-log-line")); err != nil {
		t.Fatal(err)
	}
	lines := in.logs.lines("call")
	if len(lines) != 1 {
		t.Fatalf("logged %d call lines, want 1", len(lines))
	}
	got := lines[0]
	want := map[string]any{
		"method":            "/payments.v1.PaymentsService/CreateMultiCardPayment",
		"code":              "OK",
		"provider_status":   float64(201),
		"attempts":          float64(2),
		"idempotency_key":   "k-log-line",
		"caller_request_id": "rid-log-1",
		"environment":       "sandbox",
		"level":             "INFO",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("call line %s = %v, want %v", k, got[k], v)
		}
	}
	// The call's own request ID is always paymentsd's, beside the
	// caller's.
	if id, _ := got["request_id"].(string); len(id) != 32 || id == "rid-log-1" {
		t.Errorf("call line request_id = %v, want paymentsd's own", got["request_id"])
	}
	if d, ok := got["duration_ms"].(float64); !ok || d <= 0 {
		t.Errorf("call line duration_ms = %v, want a positive number", got["duration_ms"])
	}
}

func TestLogLevel(t *testing.T) {
	t.Parallel()
	in := start(t, map[string]string{"PAYMENTS_LOG_LEVEL": "error"}, "--simulate")
	in.client.CreateMultiCardPayment(t.Context(), validRequest("k-quiet"))
	if n := len(in.logs.lines("call")); n != 0 {
		t.Errorf("at level error, logged %d info call lines, want 0", n)
	}
}

// TestTracing checks the span tree of a gRPC call and a REST call with an
// in-memory exporter: a server span, a client span for each provider
// attempt as its child, the W3C traceparent sent to the provider, and no
// key in any span.
func TestTracing(t *testing.T) {
	t.Parallel()
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })

	p := fakeProvider(t, "sandbox")
	p.SetScript(perKey(simulator.Reply{Status: 429}, simulator.Reply{}))
	in := startWith(t, sandboxEnv(p), tp)

	if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-trace")); err != nil {
		t.Fatal(err)
	}
	if r := in.rest(t, validBody("k-trace-rest"), nil); r.status != http.StatusOK {
		t.Fatalf("REST status = %d", r.status)
	}

	spans := exporter.GetSpans()
	servers := map[trace.TraceID]tracetest.SpanStub{}
	for _, s := range spans {
		if s.SpanKind == trace.SpanKindServer {
			servers[s.SpanContext.TraceID()] = s
		}
	}
	if len(servers) != 2 {
		t.Fatalf("got %d server spans in %d traces, want one per call (gRPC and REST)", len(servers), len(servers))
	}
	clients := map[trace.TraceID]int{}
	for _, s := range spans {
		if s.SpanKind != trace.SpanKindClient {
			continue
		}
		server, ok := servers[s.SpanContext.TraceID()]
		if !ok || s.Parent.SpanID() != server.SpanContext.SpanID() {
			t.Errorf("client span %q is not a child of its call's server span", s.Name)
		}
		clients[s.SpanContext.TraceID()]++
	}
	for id, server := range servers {
		if clients[id] != 2 {
			t.Errorf("server span %q has %d provider client spans, want 2 (429, then success)", server.Name, clients[id])
		}
	}
	if s := servers[firstKey(servers)]; s.Name == "" {
		t.Errorf("server span has no name")
	}

	// The provider received traceparent for the same traces.
	for _, r := range p.Requests() {
		tp := r.Header.Get("Traceparent")
		parts := strings.Split(tp, "-")
		if len(parts) != 4 {
			t.Errorf("provider request traceparent = %q, want W3C trace context", tp)
			continue
		}
		id, _ := trace.TraceIDFromHex(parts[1])
		if _, ok := servers[id]; !ok {
			t.Errorf("provider request traceparent %q names no traced call", tp)
		}
	}

	// The call log line carries the trace ID.
	for _, line := range in.logs.lines("call") {
		id, _ := trace.TraceIDFromHex(fmt.Sprint(line["trace_id"]))
		if _, ok := servers[id]; !ok {
			t.Errorf("call log line trace_id = %v, want a traced call's", line["trace_id"])
		}
	}
	if dump := fmt.Sprintf("%+v", spans); strings.Contains(dump, sandboxKey) {
		t.Errorf("a span contains the API key")
	}
}

func firstKey[K comparable, V any](m map[K]V) K {
	for k := range m {
		return k
	}
	var zero K
	return zero
}

// TestKeyNeverLeaks runs fault scenarios with a sentinel key, tracing on,
// and checks that the key appears in none of the output: logs, gRPC
// errors and their details, REST bodies, metrics and spans. The provider
// even echoes the key in its error and success bodies, plainly,
// JSON-escaped and percent-encoded.
//
// While rotating, with two keys loaded from a file that is reloaded
// mid-run, the provider echoes both, and neither leaks either.
func TestKeyNeverLeaks(t *testing.T) {
	t.Parallel()
	t.Run("one key", func(t *testing.T) { t.Parallel(); testKeyNeverLeaks(t, false) })
	t.Run("two keys, reloaded", func(t *testing.T) { t.Parallel(); testKeyNeverLeaks(t, true) })
}

func testKeyNeverLeaks(t *testing.T, rotate bool) {
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })

	p := fakeProvider(t, "sandbox")
	keys := []string{sandboxKey}
	if rotate {
		keys = append(keys, nextSandboxKey)
		p.AllowKey(nextSandboxKey)
	}
	echo := []byte(`{"error":"key ` + strings.Join(keys, " or ") + ` is not allowed here"}`)
	replies := []simulator.Reply{
		{Status: 400, Body: echo},
		{Status: 401, Body: echo},
		{Status: 403, Body: echo},
		{Status: 503, Body: echo},
		{Status: 200, Body: echo[:10]},
		{Fault: simulator.Reset},
		{Fault: simulator.CutBody, Status: 200, Body: okBody},
		{Delay: time.Minute},
		{},
	}
	// The one-key run covers the first key's encodings; this covers the
	// second's.
	for _, key := range keys[len(keys)-1:] {
		for _, enc := range keyEncodings(key) {
			for _, status := range []int{200, 201, 400, 409, 502} {
				body := `{"id":"pay_1","echo":"key ` + enc + `","` + enc + `":["` + enc + `"]}`
				replies = append(replies, simulator.Reply{Status: status, Body: []byte(body)})
			}
			replies = append(replies, simulator.Reply{Status: 500, Body: []byte("<html>key=" + enc + "</html>")})
		}
	}
	p.SetScript(func(n int, _ simulator.Request) simulator.Reply { return replies[(n-1)%len(replies)] })
	env := with(sandboxEnv(p),
		"PAYMENTS_UPSTREAM_MAX_ATTEMPTS", "1",
		"PAYMENTS_UPSTREAM_TIMEOUT", "500ms",
		"PAYMENTS_LOG_LEVEL", "debug",
	)
	keyFile := filepath.Join(t.TempDir(), "api-key")
	if rotate {
		if err := os.WriteFile(keyFile, []byte(sandboxKey+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		env = with(env, "PAYMENTS_SANDBOX_API_KEY_FILE", keyFile, "PAYMENTS_SECRET_RELOAD_INTERVAL", "20ms")
		delete(env, "PAYMENTS_SANDBOX_API_KEY")
	}
	in := startWith(t, env, tp)

	var out strings.Builder
	for i := range len(replies) {
		if rotate && i == 0 {
			// The next key joins once serving (paymentsd can only redact
			// a key it holds): from here on a 401 or 403 is re-sent with
			// the other key.
			if err := os.WriteFile(keyFile, []byte(sandboxKey+"\n"+nextSandboxKey+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			in.logs.waitLines(t, "secret file reloaded", 1)
		}
		_, err := in.client.CreateMultiCardPayment(t.Context(), validRequest(fmt.Sprint("k-leak-", i)))
		if st, ok := status.FromError(err); ok && err != nil {
			b, _ := protojson.Marshal(st.Proto())
			out.Write(b)
			out.WriteString(err.Error())
		}
	}
	for i := range len(replies) {
		out.Write(in.rest(t, validBody(fmt.Sprint("k-leak-rest-", i)), nil).raw)
	}
	if rotate {
		// The old key is revoked, and the provider echoes both keys in
		// the refusal and in the reply to the re-send with the new one.
		p.SetScript(func(_ int, r simulator.Request) simulator.Reply {
			if r.Header.Get("X-Api-Key") == sandboxKey {
				return simulator.Reply{Status: 403, Body: echo}
			}
			return simulator.Reply{Status: 200, Body: []byte(`{"id":"pay_2","echo":"` + sandboxKey + ` ` + nextSandboxKey + `"}`)}
		})
		resp, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-leak-switch"))
		if err != nil {
			t.Fatalf("CreateMultiCardPayment after the revocation = %v, want OK with the new key", err)
		}
		b, _ := protojson.Marshal(resp)
		out.Write(b)
		out.Write(in.rest(t, validBody("k-leak-switch-rest"), nil).raw)
	}
	_, raw := scrape(t, in)
	out.WriteString(raw)
	if err := in.stop(); err != nil {
		t.Errorf("run() = %v", err)
	}
	out.WriteString(in.logs.String())
	out.WriteString(fmt.Sprintf("%+v", exporter.GetSpans()))

	for _, key := range keys {
		if holdsKey(out.String(), key) {
			t.Errorf("an API key (%d bytes) appears in paymentsd's output, in some encoding", len(key))
		}
	}
	if rotate && !strings.Contains(out.String(), "provider API key switched") {
		t.Errorf("no 401 or 403 moved requests to the other key: the test did not exercise the re-send")
	}
	if !strings.Contains(out.String(), "[REDACTED]") {
		t.Errorf("the provider's echo of the key was not passed through redacted")
	}
}

// TestTracingFromEnvironment checks that OTEL_* configures tracing through
// run: console spans on stdout, and a refusal for an unknown exporter.
func TestTracingFromEnvironment(t *testing.T) {
	t.Parallel()
	stdout, logs := newLogBuffer(), newLogBuffer()
	ctx, cancel := context.WithCancel(t.Context())
	env := map[string]string{
		"PAYMENTS_GRPC_ADDR": "127.0.0.1:0", "PAYMENTS_HTTP_ADDR": "127.0.0.1:0",
		"OTEL_TRACES_EXPORTER": "console",
	}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"paymentsd", "--simulate"}, envList(env), stdout, logs)
	}()
	serving := logs.waitFor(t, "serving", done)
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	r := postREST(t, &http.Client{Transport: transport}, "http://"+serving["http_addr"].(string), validBody("k-console"), nil)
	if r.status != http.StatusOK {
		t.Fatalf("REST status = %d", r.status)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run() = %v", err)
	}
	if out := stdout.String(); !strings.Contains(out, `"SpanKind":2`) || !strings.Contains(out, `"SpanKind":3`) {
		t.Errorf("console exporter wrote no server and client spans:\n%.500s", out)
	}

	err := run(t.Context(), []string{"paymentsd", "--simulate"}, []string{"OTEL_TRACES_EXPORTER=zipkin"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "OTEL_TRACES_EXPORTER") {
		t.Errorf("run() with OTEL_TRACES_EXPORTER=zipkin = %v, want a refusal naming it", err)
	}
}

// keyEncodings are ways a provider might echo key: plainly, JSON-escaped
// (every character, lower and upper hex, or some), percent-encoded (every
// character, lower and upper hex, or some), and percent-encoded with the
// percent signs JSON-escaped.
func keyEncodings(key string) []string {
	every := func(format string) string {
		var b strings.Builder
		for i := 0; i < len(key); i++ {
			fmt.Fprintf(&b, format, key[i])
		}
		return b.String()
	}
	return []string{
		key,
		every(`\u%04x`),
		every(`\u%04X`),
		strings.NewReplacer("s", `\u0073`, "_", `\u005F`).Replace(key),
		every("%%%02x"),
		every("%%%02X"),
		strings.NewReplacer("_", "%5f", "S", "%53").Replace(key),
		every(`\u0025%02x`),
	}
}

// holdsKey reports whether key can be read from s: plainly, or after
// decoding JSON escapes, percent-encoding, or both.
func holdsKey(s, key string) bool {
	for _, f := range []string{s, unescapeJSON(s), unpercent(s), unpercent(unescapeJSON(s)), unescapeJSON(unpercent(s))} {
		if strings.Contains(f, key) {
			return true
		}
	}
	return false
}

func unescapeJSON(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+5 < len(s) && s[i+1] == 'u' {
			if v, err := strconv.ParseUint(s[i+2:i+6], 16, 16); err == nil {
				b.WriteRune(rune(v))
				i += 5
				continue
			}
		}
		if s[i] == '\\' && i+1 < len(s) && strings.IndexByte(`"\\/`, s[i+1]) >= 0 {
			b.WriteByte(s[i+1])
			i++
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func unpercent(s string) string {
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

// TestAttemptCauseLogged checks, through run, that a failed provider
// attempt is logged at warn with its real cause, which the caller's error
// does not carry.
func TestAttemptCauseLogged(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	in := start(t, map[string]string{
		"PAYMENTS_SANDBOX_BASE_URL":      "http://" + addr + "/v1",
		"PAYMENTS_SANDBOX_API_KEY":       sandboxKey,
		"PAYMENTS_UPSTREAM_MAX_ATTEMPTS": "2",
	})
	_, err = in.client.CreateMultiCardPayment(t.Context(), validRequest("k-cause"))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("CreateMultiCardPayment() to a closed port = %v, want Unavailable", err)
	}
	lines := in.logs.lines("provider attempt failed")
	if len(lines) != 2 {
		t.Fatalf("logged %d failed attempts, want 2:\n%s", len(lines), in.logs.String())
	}
	for i, line := range lines {
		cause, _ := line["cause"].(string)
		if line["level"] != "WARN" || line["attempt"] != float64(i+1) || line["outcome"] != "unreachable" || !strings.Contains(cause, "connection refused") {
			t.Errorf("failed attempt line %v, want WARN, attempt %d, outcome unreachable and the cause", line, i+1)
		}
		if line["environment"] != "sandbox" {
			t.Errorf("failed attempt line has environment %v, want sandbox", line["environment"])
		}
	}
	if strings.Contains(in.logs.String(), sandboxKey) {
		t.Errorf("the log holds the key")
	}
}
