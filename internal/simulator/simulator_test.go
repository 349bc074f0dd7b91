package simulator_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"example.com/paymentsd/internal/simulator"
)

const (
	goodKey      = "sk_sandbox_good"
	forbiddenKey = "sk_live_other_environment"
	goodBody     = `{"amountMoney":{"currency":"USD","amount":1234},"idempotencyKey":"idem-1"}`
	paymentsPath = "/multi-card-payments"
)

// newServer starts a fake provider that knows goodKey and forbiddenKey.
func newServer(t *testing.T) *simulator.Server {
	t.Helper()
	srv := simulator.NewServer()
	t.Cleanup(srv.Close)
	srv.AllowKey(goodKey)
	srv.ForbidKey(forbiddenKey)
	return srv
}

// call is one request to the fake, made the way the provider documents.
type call struct {
	method      string // POST if empty
	path        string // paymentsPath if empty
	key         string // no x-api-key header if empty
	contentType string // application/json if empty
	body        string
}

type result struct {
	status int
	header http.Header
	body   []byte
}

func do(t *testing.T, client *http.Client, baseURL string, c call) (result, error) {
	t.Helper()
	method, path, ct := c.method, c.path, c.contentType
	if method == "" {
		method = http.MethodPost
	}
	if path == "" {
		path = paymentsPath
	}
	if ct == "" {
		ct = "application/json"
	}
	req, err := http.NewRequestWithContext(t.Context(), method, baseURL+path, strings.NewReader(c.body))
	if err != nil {
		t.Fatalf("NewRequest: %v", err)
	}
	req.Header.Set("Content-Type", ct)
	req.Header.Set("Accept", "application/json")
	if c.key != "" {
		req.Header.Set("X-Api-Key", c.key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// mustDo is do for requests that must get a complete reply.
func mustDo(t *testing.T, srv *simulator.Server, c call) result {
	t.Helper()
	r, err := do(t, srv.Client(), srv.URL, c)
	if err != nil {
		t.Fatalf("%s %s: %v", c.method, c.path, err)
	}
	return r
}

// decode decodes a JSON object reply, keeping numbers exact.
func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("reply %q is not a JSON object: %v", b, err)
	}
	return m
}

func TestServerURL(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	if !strings.HasPrefix(srv.URL, "http://127.0.0.1:") || !strings.HasSuffix(srv.URL, "/v1") {
		t.Errorf("URL = %q, want http://127.0.0.1:<port>/v1", srv.URL)
	}
}

func TestDefaultAuthentication(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	tests := []struct {
		name       string
		key        string
		wantStatus int
	}{
		{"no key", "", http.StatusUnauthorized},
		{"unknown key", "sk_sandbox_unknown", http.StatusUnauthorized},
		{"key of another case", strings.ToUpper(goodKey), http.StatusUnauthorized},
		{"forbidden key", forbiddenKey, http.StatusForbidden},
		{"allowed key", goodKey, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := mustDo(t, srv, call{key: tt.key, body: goodBody})
			if r.status != tt.wantStatus {
				t.Fatalf("status = %d, want %d (body %s)", r.status, tt.wantStatus, r.body)
			}
			if got := r.header.Get("Content-Type"); got != "application/json" {
				t.Errorf("Content-Type = %q, want application/json", got)
			}
			if m := decode(t, r.body); m["simulated"] != true {
				t.Errorf("reply %s is not marked simulated", r.body)
			}
		})
	}
}

// An unauthenticated request is refused before its body is looked at.
func TestDefaultAuthenticationBeforeBody(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	if r := mustDo(t, srv, call{body: "not json"}); r.status != http.StatusUnauthorized {
		t.Errorf("bad body without key: status = %d, want 401", r.status)
	}
	if r := mustDo(t, srv, call{key: forbiddenKey, body: "not json"}); r.status != http.StatusForbidden {
		t.Errorf("bad body with forbidden key: status = %d, want 403", r.status)
	}
}

// A key can be forbidden after it was allowed, as a revoked key is.
func TestForbidKeyAfterAllow(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	if r := mustDo(t, srv, call{key: goodKey, body: goodBody}); r.status != http.StatusOK {
		t.Fatalf("before ForbidKey: status = %d, want 200", r.status)
	}
	srv.ForbidKey(goodKey)
	if r := mustDo(t, srv, call{key: goodKey, body: goodBody}); r.status != http.StatusForbidden {
		t.Errorf("after ForbidKey: status = %d, want 403", r.status)
	}
}

func TestDefaultRejectsBadBodies(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	tests := []struct {
		name        string
		contentType string
		body        string
	}{
		{"empty", "", ``},
		{"not JSON", "", `amount=12`},
		{"truncated", "", `{"amountMoney":{"currency":"USD","amount":12},"idempotencyKey":"k"`},
		{"null", "", `null`},
		{"array", "", `[` + goodBody + `]`},
		{"string", "", `"hello"`},
		{"trailing value", "", goodBody + ` {}`},
		{"trailing brace", "", goodBody + `}`},
		{"trailing bracket", "", goodBody + `]`},
		{"missing amountMoney", "", `{"idempotencyKey":"k"}`},
		{"missing idempotencyKey", "", `{"amountMoney":{"currency":"USD","amount":12}}`},
		{"missing currency", "", `{"amountMoney":{"amount":12},"idempotencyKey":"k"}`},
		{"missing amount", "", `{"amountMoney":{"currency":"USD"},"idempotencyKey":"k"}`},
		{"extra top-level field", "", `{"amountMoney":{"currency":"USD","amount":12},"idempotencyKey":"k","note":"x"}`},
		{"extra amountMoney field", "", `{"amountMoney":{"currency":"USD","amount":12,"scale":2},"idempotencyKey":"k"}`},
		{"field name in other case", "", `{"AmountMoney":{"currency":"USD","amount":12},"idempotencyKey":"k"}`},
		{"amountMoney null", "", `{"amountMoney":null,"idempotencyKey":"k"}`},
		{"amountMoney array", "", `{"amountMoney":["USD",12],"idempotencyKey":"k"}`},
		{"lower-case currency", "", `{"amountMoney":{"currency":"usd","amount":12},"idempotencyKey":"k"}`},
		{"mixed-case currency", "", `{"amountMoney":{"currency":"Usd","amount":12},"idempotencyKey":"k"}`},
		{"empty currency", "", `{"amountMoney":{"currency":"","amount":12},"idempotencyKey":"k"}`},
		{"currency with digits", "", `{"amountMoney":{"currency":"US1","amount":12},"idempotencyKey":"k"}`},
		{"currency not a string", "", `{"amountMoney":{"currency":840,"amount":12},"idempotencyKey":"k"}`},
		{"amount as a string", "", `{"amountMoney":{"currency":"USD","amount":"12"},"idempotencyKey":"k"}`},
		{"amount fractional", "", `{"amountMoney":{"currency":"USD","amount":1.5},"idempotencyKey":"k"}`},
		{"amount with exponent", "", `{"amountMoney":{"currency":"USD","amount":1e3},"idempotencyKey":"k"}`},
		{"amount over int64", "", `{"amountMoney":{"currency":"USD","amount":9223372036854775808},"idempotencyKey":"k"}`},
		{"amount null", "", `{"amountMoney":{"currency":"USD","amount":null},"idempotencyKey":"k"}`},
		{"amount bool", "", `{"amountMoney":{"currency":"USD","amount":true},"idempotencyKey":"k"}`},
		{"empty idempotencyKey", "", `{"amountMoney":{"currency":"USD","amount":12},"idempotencyKey":""}`},
		{"idempotencyKey not a string", "", `{"amountMoney":{"currency":"USD","amount":12},"idempotencyKey":7}`},
		{"idempotencyKey null", "", `{"amountMoney":{"currency":"USD","amount":12},"idempotencyKey":null}`},
		{"Content-Type not JSON", "text/plain", goodBody},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := mustDo(t, srv, call{key: goodKey, contentType: tt.contentType, body: tt.body})
			if r.status != http.StatusBadRequest {
				t.Fatalf("body %s: status = %d, want 400 (reply %s)", tt.body, r.status, r.body)
			}
			m := decode(t, r.body)
			if m["simulated"] != true {
				t.Errorf("reply %s is not marked simulated", r.body)
			}
			if msg, _ := m["error"].(string); msg == "" {
				t.Errorf("reply %s says nothing about what is wrong", r.body)
			}
		})
	}
}

func TestDefaultAcceptsDocumentedRequest(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	tests := []struct {
		name string
		body string
	}{
		{"compact", goodBody},
		{"indented", "{\n  \"idempotencyKey\": \"idem-1\",\n  \"amountMoney\": {\"amount\": 1234, \"currency\": \"USD\"}\n}\n"},
		{"zero", `{"amountMoney":{"currency":"EUR","amount":0},"idempotencyKey":"k"}`},
		{"negative", `{"amountMoney":{"currency":"EUR","amount":-5},"idempotencyKey":"k"}`},
		{"above 2^53", `{"amountMoney":{"currency":"USD","amount":9007199254740993},"idempotencyKey":"k"}`},
		{"max int64", `{"amountMoney":{"currency":"USD","amount":9223372036854775807},"idempotencyKey":"k"}`},
		{"min int64", `{"amountMoney":{"currency":"USD","amount":-9223372036854775808},"idempotencyKey":"k"}`},
		{"unicode key", `{"amountMoney":{"currency":"JPY","amount":500},"idempotencyKey":"zahlung-日本-🚀"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := mustDo(t, srv, call{key: goodKey, body: tt.body})
			if r.status != http.StatusOK {
				t.Fatalf("status = %d, want 200 (reply %s)", r.status, r.body)
			}
			m := decode(t, r.body)
			if m["simulated"] != true {
				t.Errorf("reply %s is not marked simulated", r.body)
			}
			// The reply echoes the request, exactly, under "request".
			var echo json.RawMessage
			if err := json.Unmarshal(r.body, &struct {
				Request *json.RawMessage `json:"request"`
			}{&echo}); err != nil {
				t.Fatalf("reply %s: %v", r.body, err)
			}
			var want bytes.Buffer
			if err := json.Compact(&want, []byte(tt.body)); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(echo, want.Bytes()) {
				t.Errorf("echoed request = %s, want %s", echo, want.Bytes())
			}
		})
	}
}

func TestDefaultUnknownEndpoint(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	tests := []struct {
		name   string
		method string
		path   string
	}{
		{"GET on payments", http.MethodGet, paymentsPath},
		{"PUT on payments", http.MethodPut, paymentsPath},
		{"other path", http.MethodPost, "/payments"},
		{"payments with trailing slash", http.MethodPost, paymentsPath + "/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := mustDo(t, srv, call{method: tt.method, path: tt.path, key: goodKey, body: goodBody})
			if r.status != http.StatusNotFound {
				t.Errorf("%s %s: status = %d, want 404", tt.method, tt.path, r.status)
			}
		})
	}
	// Outside /v1 too.
	r, err := do(t, srv.Client(), strings.TrimSuffix(srv.URL, "/v1"), call{key: goodKey, body: goodBody})
	if err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusNotFound {
		t.Errorf("POST %s without /v1: status = %d, want 404", paymentsPath, r.status)
	}
}

func TestSequence(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	srv.SetScript(simulator.Sequence(
		simulator.Reply{Status: http.StatusServiceUnavailable, Header: http.Header{"Retry-After": {"7"}}, Body: []byte(`{"busy":true}`)},
		simulator.Reply{Status: http.StatusCreated, Body: []byte(`{"id":"pay_1"}`)},
	))
	want := []struct {
		status     int
		retryAfter string
		body       string
	}{
		{http.StatusServiceUnavailable, "7", `{"busy":true}`},
		{http.StatusCreated, "", `{"id":"pay_1"}`},
		// Then the default behaviour, which checks the key.
		{http.StatusOK, "", ""},
	}
	for i, w := range want {
		r := mustDo(t, srv, call{key: goodKey, body: goodBody})
		if r.status != w.status {
			t.Errorf("request %d: status = %d, want %d", i+1, r.status, w.status)
		}
		if got := r.header.Get("Retry-After"); got != w.retryAfter {
			t.Errorf("request %d: Retry-After = %q, want %q", i+1, got, w.retryAfter)
		}
		if w.body != "" && string(r.body) != w.body {
			t.Errorf("request %d: body = %s, want %s", i+1, r.body, w.body)
		}
	}
	if r := mustDo(t, srv, call{body: goodBody}); r.status != http.StatusUnauthorized {
		t.Errorf("after the sequence, no key: status = %d, want 401", r.status)
	}
}

// A scripted status is sent without checking the key or body.
func TestAlways(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	srv.SetScript(simulator.Always(simulator.Reply{Status: http.StatusAccepted, Body: []byte(`{"ok":true}`)}))
	for i := range 3 {
		r := mustDo(t, srv, call{body: "not even json"})
		if r.status != http.StatusAccepted || string(r.body) != `{"ok":true}` {
			t.Errorf("request %d: got %d %s, want 202 {\"ok\":true}", i+1, r.status, r.body)
		}
		if got := r.header.Get("Content-Length"); got != "11" {
			t.Errorf("request %d: Content-Length = %q, want 11", i+1, got)
		}
	}
	// nil restores the default behaviour.
	srv.SetScript(nil)
	if r := mustDo(t, srv, call{body: goodBody}); r.status != http.StatusUnauthorized {
		t.Errorf("after SetScript(nil), no key: status = %d, want 401", r.status)
	}
}

func TestReplyHeaders(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	srv.SetScript(simulator.Sequence(
		simulator.Reply{Status: http.StatusOK, Body: []byte(`<html></html>`), Header: http.Header{"Content-Type": {"text/html"}, "X-Multi": {"a", "b"}}},
		simulator.Reply{Status: http.StatusOK, Body: []byte(`{}`)},
	))
	r := mustDo(t, srv, call{key: goodKey, body: goodBody})
	if got := r.header.Get("Content-Type"); got != "text/html" {
		t.Errorf("scripted Content-Type = %q, want text/html", got)
	}
	if got := r.header.Values("X-Multi"); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Errorf("X-Multi = %q, want [a b]", got)
	}
	r = mustDo(t, srv, call{key: goodKey, body: goodBody})
	if got := r.header.Get("Content-Type"); got != "application/json" {
		t.Errorf("default Content-Type = %q, want application/json", got)
	}
}

// The script sees each request, numbered from 1, and the requests are
// recorded in arrival order.
func TestScriptAndRequests(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	type seen struct {
		n    int
		key  string
		body string
	}
	var (
		mu  sync.Mutex
		got []seen
	)
	srv.SetScript(func(n int, r simulator.Request) simulator.Reply {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, seen{n, r.Header.Get("X-Api-Key"), string(r.Body)})
		return simulator.Reply{}
	})
	bodies := []string{
		`{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"a"}`,
		`{"amountMoney":{"currency":"USD","amount":2},"idempotencyKey":"b"}`,
		`{"amountMoney":{"currency":"USD","amount":3},"idempotencyKey":"c"}`,
	}
	for _, b := range bodies {
		if r := mustDo(t, srv, call{key: goodKey, body: b}); r.status != http.StatusOK {
			t.Fatalf("status = %d, want 200", r.status)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != len(bodies) {
		t.Fatalf("script saw %d requests, want %d", len(got), len(bodies))
	}
	for i, b := range bodies {
		if got[i] != (seen{i + 1, goodKey, b}) {
			t.Errorf("script call %d = %+v, want %+v", i, got[i], seen{i + 1, goodKey, b})
		}
	}

	reqs := srv.Requests()
	if len(reqs) != len(bodies) {
		t.Fatalf("Requests() has %d requests, want %d", len(reqs), len(bodies))
	}
	for i, r := range reqs {
		if r.Method != http.MethodPost || r.Path != "/v1"+paymentsPath || string(r.Body) != bodies[i] ||
			r.Header.Get("X-Api-Key") != goodKey || r.Header.Get("Accept") != "application/json" {
			t.Errorf("Requests()[%d] = %s %s %q %s, want POST /v1%s with key and body %s",
				i, r.Method, r.Path, r.Header, r.Body, paymentsPath, bodies[i])
		}
	}
	// Requests returns a copy.
	reqs[0].Body = nil
	if string(srv.Requests()[0].Body) != bodies[0] {
		t.Error("changing what Requests returned changed the server's record")
	}
}

func TestKeepRequestsFalse(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	var (
		mu sync.Mutex
		ns []int
	)
	srv.SetScript(func(n int, r simulator.Request) simulator.Reply {
		mu.Lock()
		defer mu.Unlock()
		ns = append(ns, n)
		if string(r.Body) != goodBody {
			t.Errorf("script got body %q, want %q", r.Body, goodBody)
		}
		return simulator.Reply{}
	})
	srv.KeepRequests(false)
	for range 3 {
		if r := mustDo(t, srv, call{key: goodKey, body: goodBody}); r.status != http.StatusOK {
			t.Fatalf("status = %d, want 200", r.status)
		}
	}
	if reqs := srv.Requests(); len(reqs) != 0 {
		t.Errorf("with KeepRequests(false), Requests() = %+v, want none", reqs)
	}
	// Recording again picks up from there.
	srv.KeepRequests(true)
	mustDo(t, srv, call{key: goodKey, body: goodBody})
	if reqs := srv.Requests(); len(reqs) != 1 || string(reqs[0].Body) != goodBody {
		t.Errorf("after KeepRequests(true), Requests() = %+v, want the one request", reqs)
	}
	// Requests are numbered whether recorded or not.
	mu.Lock()
	defer mu.Unlock()
	if want := []int{1, 2, 3, 4}; !slices.Equal(ns, want) {
		t.Errorf("script saw request numbers %v, want %v", ns, want)
	}
}

func TestConnections(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	if got := srv.Connections(); got != 0 {
		t.Fatalf("Connections() before any request = %d, want 0", got)
	}
	// One keep-alive client reuses its connection.
	for range 3 {
		mustDo(t, srv, call{key: goodKey, body: goodBody})
	}
	if got := srv.Connections(); got != 1 {
		t.Errorf("Connections() after 3 requests on one keep-alive client = %d, want 1", got)
	}
	// A client without keep-alives opens one per request.
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	for range 2 {
		if _, err := do(t, &http.Client{Transport: tr}, srv.URL, call{key: goodKey, body: goodBody}); err != nil {
			t.Fatal(err)
		}
	}
	if got := srv.Connections(); got != 3 {
		t.Errorf("Connections() after 2 more without keep-alives = %d, want 3", got)
	}
}

// clientFor returns an HTTP client of the test's own that trusts srv.
func clientFor(t *testing.T, srv *simulator.Server) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	if cert := srv.Certificate(); cert != nil {
		pool := x509.NewCertPool()
		pool.AddCert(cert)
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func TestFaults(t *testing.T) {
	t.Parallel()
	full := []byte(`{"id":"pay_1","status":"COMPLETED","padding":"0123456789"}`)
	tests := []struct {
		name  string
		reply simulator.Reply
		// check judges the outcome of one request.
		check func(t *testing.T, r result, err error)
	}{
		{
			name:  "Reset",
			reply: simulator.Reply{Fault: simulator.Reset},
			check: func(t *testing.T, r result, err error) {
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Errorf("got %d %s, %v; want a connection reset", r.status, r.body, err)
				}
			},
		},
		{
			name:  "Hangup",
			reply: simulator.Reply{Fault: simulator.Hangup},
			check: func(t *testing.T, r result, err error) {
				if !errors.Is(err, io.EOF) {
					t.Errorf("got %d %s, %v; want io.EOF before any response", r.status, r.body, err)
				}
			},
		},
		{
			name:  "CutBody",
			reply: simulator.Reply{Status: http.StatusOK, Body: full, Fault: simulator.CutBody},
			check: func(t *testing.T, r result, err error) {
				if r.status != http.StatusOK {
					t.Errorf("status = %d, want 200 before the cut", r.status)
				}
				if got, want := r.header.Get("Content-Length"), strconv.Itoa(len(full)); got != want {
					t.Errorf("Content-Length = %q, want the whole body's, %s", got, want)
				}
				if !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Errorf("reading the body: %v, want io.ErrUnexpectedEOF", err)
				}
				if !bytes.Equal(r.body, full[:len(full)/2]) {
					t.Errorf("body before the cut = %q, want %q", r.body, full[:len(full)/2])
				}
			},
		},
		{
			name:  "Dribble",
			reply: simulator.Reply{Status: http.StatusCreated, Body: full, Fault: simulator.Dribble, DribbleInterval: time.Microsecond},
			check: func(t *testing.T, r result, err error) {
				if err != nil || r.status != http.StatusCreated || !bytes.Equal(r.body, full) {
					t.Errorf("got %d %q, %v; want 201 and the whole body", r.status, r.body, err)
				}
			},
		},
		{
			name:  "Delay",
			reply: simulator.Reply{Delay: 10 * time.Millisecond},
			check: func(t *testing.T, r result, err error) {
				if err != nil || r.status != http.StatusOK {
					t.Errorf("got %d %s, %v; want the default 200 after the delay", r.status, r.body, err)
				}
			},
		},
	}
	servers := []struct {
		name string
		new  func() *simulator.Server
	}{
		{"HTTP", simulator.NewServer},
		{"HTTPS", simulator.NewTLSServer},
	}
	for _, s := range servers {
		for _, tt := range tests {
			t.Run(s.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				srv := s.new()
				t.Cleanup(srv.Close)
				srv.AllowKey(goodKey)
				srv.SetScript(simulator.Sequence(tt.reply))
				client := clientFor(t, srv)
				r, err := do(t, client, srv.URL, call{key: goodKey, body: goodBody})
				tt.check(t, r, err)
				// The request itself arrived whole.
				if reqs := srv.Requests(); len(reqs) != 1 || string(reqs[0].Body) != goodBody {
					t.Errorf("Requests() = %+v, want the one request", reqs)
				}
				// The server is fine afterwards.
				r, err = do(t, client, srv.URL, call{key: goodKey, body: goodBody})
				if err != nil || r.status != http.StatusOK {
					t.Errorf("request after the fault: %d, %v; want 200", r.status, err)
				}
			})
		}
	}
}

func TestTLSServer(t *testing.T) {
	t.Parallel()
	srv := simulator.NewTLSServer()
	t.Cleanup(srv.Close)
	srv.AllowKey(goodKey)
	if !strings.HasPrefix(srv.URL, "https://127.0.0.1:") || !strings.HasSuffix(srv.URL, "/v1") {
		t.Errorf("URL = %q, want https://127.0.0.1:<port>/v1", srv.URL)
	}
	if srv.Certificate() == nil {
		t.Fatal("Certificate() = nil for a TLS server")
	}
	if r := mustDo(t, srv, call{key: goodKey, body: goodBody}); r.status != http.StatusOK {
		t.Errorf("with srv.Client(): status = %d, want 200", r.status)
	}
	// A client that does not trust the certificate gets nowhere.
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	var unknown x509.UnknownAuthorityError
	if _, err := do(t, &http.Client{Transport: tr}, srv.URL, call{key: goodKey, body: goodBody}); !errors.As(err, &unknown) {
		t.Errorf("untrusting client: %v, want x509.UnknownAuthorityError", err)
	}
	if n := len(srv.Requests()); n != 1 {
		t.Errorf("Requests() has %d requests, want 1", n)
	}

	plain := simulator.NewServer()
	t.Cleanup(plain.Close)
	if plain.Certificate() != nil {
		t.Error("Certificate() is not nil for a plain HTTP server")
	}
}

// Wait holds the reply until the channel is closed.
func TestWait(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	srv.SetScript(func(int, simulator.Request) simulator.Reply {
		arrived <- struct{}{}
		return simulator.Reply{Wait: release}
	})
	type answer struct {
		r   result
		err error
	}
	done := make(chan answer, 1)
	go func() {
		r, err := do(t, srv.Client(), srv.URL, call{key: goodKey, body: goodBody})
		done <- answer{r, err}
	}()
	<-arrived
	select {
	case a := <-done:
		t.Fatalf("reply %d, %v before Wait was closed", a.r.status, a.err)
	default:
	}
	close(release)
	if a := <-done; a.err != nil || a.r.status != http.StatusOK {
		t.Errorf("after Wait was closed: %d, %v; want the default 200", a.r.status, a.err)
	}
}

// Canceled reports a client that went away during a Delay or a Dribble.
func TestCanceled(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		reply simulator.Reply
	}{
		{"Delay", simulator.Reply{Delay: time.Hour}},
		{"Wait", simulator.Reply{Wait: make(chan struct{})}},
		{"Dribble", simulator.Reply{Status: http.StatusOK, Body: bytes.Repeat([]byte(" "), 100), Fault: simulator.Dribble, DribbleInterval: time.Hour}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			arrived := make(chan struct{}, 1)
			srv.SetScript(func(int, simulator.Request) simulator.Reply {
				arrived <- struct{}{}
				return tt.reply
			})
			ctx, cancel := context.WithCancel(t.Context())
			errc := make(chan error, 1)
			go func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+paymentsPath, strings.NewReader(goodBody))
				resp, err := srv.Client().Do(req)
				if err == nil {
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				errc <- err
			}()
			<-arrived
			select {
			case <-srv.Canceled():
				t.Fatal("Canceled() received before the client went away")
			default:
			}
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Errorf("client error = %v, want context.Canceled", err)
			}
			select {
			case <-srv.Canceled():
			case <-time.After(5 * time.Second):
				t.Fatal("Canceled() did not receive after the client went away")
			}
		})
	}
}

func TestIdempotent(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	srv.Idempotent(true)

	first := mustDo(t, srv, call{key: goodKey, body: goodBody})
	again := mustDo(t, srv, call{key: goodKey, body: goodBody})
	if first.status != http.StatusOK || again.status != first.status || !bytes.Equal(again.body, first.body) {
		t.Errorf("same key and body: %d %s then %d %s, want the first reply again", first.status, first.body, again.status, again.body)
	}
	other := mustDo(t, srv, call{key: goodKey, body: strings.Replace(goodBody, "idem-1", "idem-2", 1)})
	if other.status != http.StatusOK || decode(t, other.body)["id"] == decode(t, first.body)["id"] {
		t.Errorf("another key: %d %s, want a new payment", other.status, other.body)
	}
	reused := mustDo(t, srv, call{key: goodKey, body: strings.Replace(goodBody, "1234", "999", 1)})
	if reused.status != http.StatusUnprocessableEntity {
		t.Errorf("same key, other body: %d, want 422", reused.status)
	}
	if r := mustDo(t, srv, call{key: forbiddenKey, body: goodBody}); r.status != http.StatusForbidden {
		t.Errorf("replay with a forbidden key: %d, want 403", r.status)
	}
	if got := srv.Created(); got != 2 {
		t.Errorf("Created() = %d, want 2", got)
	}
}

// TestIdempotentCreatesBeforeAFault: the work is done even when the reply
// is lost, so a retry gets the payment the lost reply was for.
func TestIdempotentCreatesBeforeAFault(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	srv.Idempotent(true)
	srv.SetScript(simulator.Sequence(simulator.Reply{Fault: simulator.Reset}))
	if _, err := do(t, srv.Client(), srv.URL, call{key: goodKey, body: goodBody}); err == nil {
		t.Fatalf("first request succeeded, want the connection reset")
	}
	r := mustDo(t, srv, call{key: goodKey, body: goodBody})
	if r.status != http.StatusOK || decode(t, r.body)["id"] != "pay_sim_1" || srv.Created() != 1 {
		t.Errorf("retry after a reset: %d %s (created %d), want pay_sim_1, created once", r.status, r.body, srv.Created())
	}
}

func TestMaxInFlight(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	release := make(chan struct{})
	arrived := make(chan struct{}, 2)
	srv.SetScript(func(int, simulator.Request) simulator.Reply {
		arrived <- struct{}{}
		return simulator.Reply{Wait: release}
	})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { do(t, srv.Client(), srv.URL, call{key: goodKey, body: goodBody}) })
	}
	<-arrived
	<-arrived
	close(release)
	wg.Wait()
	if got := srv.MaxInFlight("idem-1"); got != 2 {
		t.Errorf("MaxInFlight = %d, want 2", got)
	}
}

// TestKeyHistory: each reply's fate, as a checker judging a client needs
// it: what was sent, whether a 2xx reached the connection whole, whether
// a payment was made, and requests that came after a delivered success.
func TestKeyHistory(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		reply simulator.Reply
		want  simulator.KeyRequest
		// wantErr: the client gets no complete reply.
		wantErr bool
	}{
		{"success", simulator.Reply{}, simulator.KeyRequest{Status: http.StatusOK, Charged: true, Delivered: true}, false},
		{"dribbled success", simulator.Reply{Status: http.StatusCreated, Body: []byte(`{}`), Fault: simulator.Dribble, DribbleInterval: time.Millisecond},
			simulator.KeyRequest{Status: http.StatusCreated, Delivered: true}, false},
		{"refusal", simulator.Reply{Status: http.StatusBadRequest, Body: []byte(`{}`)}, simulator.KeyRequest{Status: http.StatusBadRequest}, false},
		{"reset", simulator.Reply{Fault: simulator.Reset}, simulator.KeyRequest{}, true},
		{"hangup", simulator.Reply{Fault: simulator.Hangup}, simulator.KeyRequest{}, true},
		{"cut body", simulator.Reply{Status: http.StatusOK, Body: []byte(`{"id":"pay_cut"}`), Fault: simulator.CutBody},
			simulator.KeyRequest{Status: http.StatusOK}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t)
			srv.SetScript(simulator.Sequence(tt.reply))
			before := time.Now()
			if _, err := do(t, srv.Client(), srv.URL, call{key: goodKey, body: goodBody}); (err != nil) != tt.wantErr {
				t.Fatalf("request error = %v, want error %v", err, tt.wantErr)
			}
			// The second request gets the default reply, a delivered 200.
			mustDo(t, srv, call{key: goodKey, body: goodBody})
			after := time.Now()

			got := srv.KeyHistory("idem-1")
			if len(got) != 2 {
				t.Fatalf("KeyHistory = %+v, want 2 requests", got)
			}
			for i, kr := range got {
				if kr.Arrived.Before(before) || kr.Ended.Before(kr.Arrived) || kr.Ended.After(after) {
					t.Errorf("request %d arrived %v and ended %v, want within the calls, in order", i+1, kr.Arrived, kr.Ended)
				}
			}
			if got[1].Arrived.Before(got[0].Ended) {
				t.Errorf("second request arrived %v, before the first ended %v", got[1].Arrived, got[0].Ended)
			}
			ignoreTimes := cmpopts.IgnoreFields(simulator.KeyRequest{}, "Arrived", "Ended")
			if diff := cmp.Diff(tt.want, got[0], ignoreTimes); diff != "" {
				t.Errorf("first request's history (-want +got):\n%s", diff)
			}
			if got[1].Status != http.StatusOK || !got[1].Delivered {
				t.Errorf("second request's history = %+v, want a delivered 200", got[1])
			}

			want := simulator.KeyStats{Requests: 2, MaxInFlight: 1, Bodies: 1, Delivered: 1, Charges: 1}
			if tt.want.Delivered {
				want.Delivered, want.AfterDelivered = 2, 1
			}
			if tt.want.Charged {
				want.Charges = 2
			}
			if got := srv.KeyStats("idem-1"); got != want {
				t.Errorf("KeyStats = %+v, want %+v", got, want)
			}
		})
	}
}

// TestKeyHistoryClientGone: a reply the client went away before is not
// sent, let alone delivered.
func TestKeyHistoryClientGone(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	arrived := make(chan struct{}, 1)
	srv.SetScript(func(int, simulator.Request) simulator.Reply {
		arrived <- struct{}{}
		return simulator.Reply{Wait: make(chan struct{})}
	})
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+paymentsPath, strings.NewReader(goodBody))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Api-Key", goodKey)
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-arrived
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client error = %v, want context.Canceled", err)
	}
	<-srv.Canceled()

	got := srv.KeyHistory("idem-1")
	if len(got) != 1 || got[0].Status != 0 || got[0].Delivered || got[0].Charged {
		t.Errorf("KeyHistory = %+v, want one request, nothing sent or charged", got)
	}
	if ks := srv.KeyStats("idem-1"); ks.Delivered != 0 || ks.Charges != 0 {
		t.Errorf("KeyStats = %+v, want nothing charged or delivered", ks)
	}
}

func TestOverlaps(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	release := make(chan struct{})
	arrived := make(chan struct{}, 3)
	srv.SetScript(func(int, simulator.Request) simulator.Reply {
		arrived <- struct{}{}
		return simulator.Reply{Wait: release}
	})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { do(t, srv.Client(), srv.URL, call{key: goodKey, body: goodBody}) })
	}
	for range 3 {
		<-arrived
	}
	close(release)
	wg.Wait()
	srv.SetScript(nil)
	mustDo(t, srv, call{key: goodKey, body: goodBody}) // alone: no overlap
	if ks := srv.KeyStats("idem-1"); ks.Overlaps != 2 || ks.MaxInFlight != 3 || ks.Requests != 4 {
		t.Errorf("KeyStats = %+v, want 2 overlaps of 4 requests, at most 3 at once", ks)
	}
}

// TestAddListener: requests through another listener reach the same fake,
// named in the key's history; Close closes it.
func TestAddListener(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		srv  func() *simulator.Server
	}{
		{"http", simulator.NewServer},
		{"https", simulator.NewTLSServer},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := tt.srv()
			srv.AllowKey(goodKey)
			srv.Idempotent(true)
			a := srv.AddListener("a")
			if a == srv.URL || !strings.HasPrefix(a, tt.name+"://127.0.0.1:") || !strings.HasSuffix(a, "/v1") {
				t.Errorf("AddListener() = %q, want another %s base URL ending in /v1", a, tt.name)
			}
			client := srv.Client()
			first, err := do(t, client, a, call{key: goodKey, body: goodBody})
			if err != nil {
				t.Fatal(err)
			}
			again := mustDo(t, srv, call{key: goodKey, body: goodBody})
			if !bytes.Equal(first.body, again.body) {
				t.Errorf("replies through the two listeners: %s and %s, want one payment", first.body, again.body)
			}
			var via []string
			for _, kr := range srv.KeyHistory("idem-1") {
				via = append(via, kr.Listener)
			}
			if diff := cmp.Diff([]string{"a", ""}, via); diff != "" {
				t.Errorf("listeners in KeyHistory (-want +got):\n%s", diff)
			}
			srv.Close()
			client.CloseIdleConnections()
			if _, err := do(t, client, a, call{key: goodKey, body: goodBody}); err == nil {
				t.Errorf("request to the added listener after Close succeeded")
			}
		})
	}
}

// TestKeyStatsDelivered: KeyStats counts the 2xx replies delivered for a
// key, and the requests that came after the first of them.
func TestKeyStatsDelivered(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	srv.SetScript(simulator.Sequence(simulator.Reply{Status: http.StatusServiceUnavailable}))
	for range 3 {
		mustDo(t, srv, call{key: goodKey, body: goodBody})
	}
	got := srv.KeyStats("idem-1")
	if got.Requests != 3 || got.Delivered != 2 || got.AfterDelivered != 1 {
		t.Errorf("KeyStats after a 503 and two 200s = %+v, want 3 requests, 2 delivered, 1 after a delivered 2xx", got)
	}
}
