package upstream_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"

	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/upstream"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testKey = "sk_test_0123456789abcdef"

// newServer starts a fake provider that accepts testKey and answers by
// script (nil for the default behaviour).
func newServer(t *testing.T, script simulator.Script) *simulator.Server {
	t.Helper()
	srv := simulator.NewServer()
	t.Cleanup(srv.Close)
	srv.AllowKey(testKey)
	srv.SetScript(script)
	return srv
}

// newHTTPClient is an HTTP client of the test's own, so that its idle
// connections can be closed when the test ends.
func newHTTPClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     time.Minute,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{
		Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// testConfig is a Config with fast retries and a breaker that stays out of
// the way; cases change what they are about.
func testConfig(t *testing.T, baseURL string) upstream.Config {
	return upstream.Config{
		BaseURL:         baseURL,
		APIKey:          testKey,
		HTTPClient:      newHTTPClient(t),
		MaxRequests:     3,
		BackoffBase:     time.Millisecond,
		BackoffMax:      5 * time.Millisecond,
		MaxRetryAfter:   10 * time.Second,
		BreakerFailures: 1000,
		BreakerCooldown: time.Hour,
	}
}

func newClient(t *testing.T, cfg upstream.Config) *upstream.Client {
	t.Helper()
	c, err := upstream.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

// closedURL is a base URL on which nothing listens.
func closedURL(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return "http://" + addr + "/v1"
}

func payment(key string) upstream.Payment {
	return upstream.Payment{Currency: "USD", Amount: 1234, IdempotencyKey: key}
}

// wireBody is the body the provider documents for p.
func wireBody(p upstream.Payment) string {
	return fmt.Sprintf(`{"amountMoney":{"currency":%q,"amount":%d},"idempotencyKey":%q}`, p.Currency, p.Amount, p.IdempotencyKey)
}

// callError checks that err is an *upstream.Error and returns it.
func callError(t *testing.T, err error) *upstream.Error {
	t.Helper()
	if err == nil {
		t.Fatal("CreateMultiCardPayment succeeded, want an error")
	}
	var ue *upstream.Error
	if !errors.As(err, &ue) {
		t.Fatalf("error %v is a %T, want an *upstream.Error", err, err)
	}
	return ue
}

// statusError checks that err holds a *upstream.StatusError and returns it.
func statusError(t *testing.T, err error) *upstream.StatusError {
	t.Helper()
	var se *upstream.StatusError
	if !errors.As(err, &se) {
		t.Fatalf("error %v does not hold an *upstream.StatusError", err)
	}
	return se
}

func reply(status int, body string) simulator.Reply {
	return simulator.Reply{Status: status, Body: []byte(body)}
}

func TestNew(t *testing.T) {
	t.Parallel()
	const key = "sk_SENTINEL_0123456789"
	valid := upstream.Config{BaseURL: "https://sandbox.example.com/v1", APIKey: key, HTTPClient: &http.Client{}}
	tests := []struct {
		name   string
		change func(*upstream.Config)
		ok     bool
	}{
		{"complete", func(*upstream.Config) {}, true},
		{"http", func(c *upstream.Config) { c.BaseURL = "http://127.0.0.1:8080/v1" }, true},
		{"trailing slash", func(c *upstream.Config) { c.BaseURL = "https://sandbox.example.com/v1/" }, true},
		{"no HTTP client", func(c *upstream.Config) { c.HTTPClient = nil }, false},
		{"no key", func(c *upstream.Config) { c.APIKey = "" }, false},
		{"no base URL", func(c *upstream.Config) { c.BaseURL = "" }, false},
		{"no scheme", func(c *upstream.Config) { c.BaseURL = "sandbox.example.com/v1" }, false},
		{"other scheme", func(c *upstream.Config) { c.BaseURL = "ftp://sandbox.example.com/v1" }, false},
		{"no host", func(c *upstream.Config) { c.BaseURL = "https:///v1" }, false},
		{"unparsable", func(c *upstream.Config) { c.BaseURL = "http://[::1/v1" }, false},
		{"control character", func(c *upstream.Config) { c.BaseURL = "https://sandbox.example.com/v1\n" }, false},
		{"query", func(c *upstream.Config) { c.BaseURL = "https://sandbox.example.com/v1?env=live" }, false},
		{"fragment", func(c *upstream.Config) { c.BaseURL = "https://sandbox.example.com/v1#x" }, false},
		{"bare query", func(c *upstream.Config) { c.BaseURL = "https://sandbox.example.com/v1?" }, false},
		{"bare fragment", func(c *upstream.Config) { c.BaseURL = "https://sandbox.example.com/v1#" }, false},
		{"port only", func(c *upstream.Config) { c.BaseURL = "https://:443/v1" }, false},
		{"port 0", func(c *upstream.Config) { c.BaseURL = "https://sandbox.example.com:0/v1" }, false},
		{"port too big", func(c *upstream.Config) { c.BaseURL = "https://sandbox.example.com:65536/v1" }, false},
		{"port not a number", func(c *upstream.Config) { c.BaseURL = "https://sandbox.example.com:https/v1" }, false},
		{"empty port", func(c *upstream.Config) { c.BaseURL = "https://sandbox.example.com:/v1" }, false},
		{"highest port", func(c *upstream.Config) { c.BaseURL = "https://sandbox.example.com:65535/v1" }, true},
		{"IPv6 with port", func(c *upstream.Config) { c.BaseURL = "https://[::1]:8443/v1" }, true},
		{"key as port", func(c *upstream.Config) { c.BaseURL = "https://sandbox.example.com:" + key + "/v1" }, false},
		// The key must never be in an error, even when it was put where the
		// URL goes.
		{"key as user info", func(c *upstream.Config) { c.BaseURL = "https://" + key + "@sandbox.example.com/v1" }, false},
		{"key as password", func(c *upstream.Config) { c.BaseURL = "https://merchant:" + key + "@sandbox.example.com/v1" }, false},
		{"key in query", func(c *upstream.Config) { c.BaseURL = "https://sandbox.example.com/v1?key=" + key }, false},
		{"key as base URL", func(c *upstream.Config) { c.BaseURL = key }, false},
		{"key in bad URL", func(c *upstream.Config) { c.BaseURL = "ftp://sandbox.example.com/" + key }, false},
		{"key in unparsable URL", func(c *upstream.Config) { c.BaseURL = "http://[::1/" + key }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := valid
			tt.change(&cfg)
			c, err := upstream.New(cfg)
			if tt.ok {
				if err != nil || c == nil {
					t.Fatalf("New(BaseURL %q) = %v, %v; want a client", cfg.BaseURL, c, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("New(BaseURL %q, client %v, key set %v) succeeded, want an error", cfg.BaseURL, cfg.HTTPClient != nil, cfg.APIKey != "")
			}
			if c != nil {
				t.Errorf("New returned a client with its error %v", err)
			}
			if strings.Contains(err.Error(), key) {
				t.Errorf("New error %q contains the key", err)
			}
		})
	}
}

// The request is exactly the documented one, with the amount written as a
// JSON integer that survives beyond 2^53.
func TestRequestShape(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		amount int64
	}{
		{"small", 1234},
		{"zero", 0},
		{"negative", -1},
		{"2^53+1", 1<<53 + 1},
		{"max int64", math.MaxInt64},
		{"min int64", math.MinInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, nil)
			c := newClient(t, testConfig(t, srv.URL))
			p := upstream.Payment{Currency: "USD", Amount: tt.amount, IdempotencyKey: "k"}
			r, err := c.CreateMultiCardPayment(t.Context(), p)
			if err != nil {
				t.Fatalf("CreateMultiCardPayment(%+v): %v", p, err)
			}
			if r.Status != http.StatusOK || r.Requests != 1 {
				t.Errorf("reply status %d after %d attempts, want 200 after 1", r.Status, r.Requests)
			}

			reqs := srv.Requests()
			if len(reqs) != 1 {
				t.Fatalf("provider got %d requests, want 1", len(reqs))
			}
			req := reqs[0]
			if req.Method != http.MethodPost || req.Path != "/v1/multi-card-payments" {
				t.Errorf("request is %s %s, want POST /v1/multi-card-payments", req.Method, req.Path)
			}
			for name, want := range map[string]string{
				"X-Api-Key":    testKey,
				"Content-Type": "application/json",
				"Accept":       "application/json",
			} {
				if got := req.Header.Values(name); len(got) != 1 || got[0] != want {
					t.Errorf("header %s = %q, want exactly [%q]", name, got, want)
				}
			}
			if got := req.Header.Get("Authorization"); got != "" {
				t.Errorf("Authorization header %q sent, want none", got)
			}

			want := `{"amountMoney":{"currency":"USD","amount":` + strconv.FormatInt(tt.amount, 10) + `},"idempotencyKey":"k"}`
			if string(req.Body) != want {
				t.Errorf("body = %s, want %s", req.Body, want)
			}
			// And nothing else is in it.
			d := json.NewDecoder(bytes.NewReader(req.Body))
			d.UseNumber()
			var got map[string]any
			if err := d.Decode(&got); err != nil {
				t.Fatalf("body %s: %v", req.Body, err)
			}
			wantDecoded := map[string]any{
				"amountMoney":    map[string]any{"currency": "USD", "amount": json.Number(strconv.FormatInt(tt.amount, 10))},
				"idempotencyKey": "k",
			}
			if diff := cmp.Diff(wantDecoded, got); diff != "" {
				t.Errorf("decoded body mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// A base URL with a trailing slash makes the same request path.
func TestBaseURLTrailingSlash(t *testing.T) {
	t.Parallel()
	srv := newServer(t, nil)
	c := newClient(t, testConfig(t, srv.URL+"/"))
	if _, err := c.CreateMultiCardPayment(t.Context(), payment("k")); err != nil {
		t.Fatal(err)
	}
	if reqs := srv.Requests(); len(reqs) != 1 || reqs[0].Path != "/v1/multi-card-payments" {
		t.Errorf("requests = %+v, want one to /v1/multi-card-payments", reqs)
	}
}

// A 2xx reply's body is handed back as the provider sent it.
func TestSuccessPassThrough(t *testing.T) {
	t.Parallel()
	body := map[string]any{
		"id":     "pay_01HZX",
		"status": "COMPLETED",
		"amountMoney": map[string]any{
			"currency": "USD",
			"amount":   float64(1234),
		},
		"cards": []any{
			map[string]any{"last4": "4242", "amount": 1000.0, "captured": true},
			map[string]any{"last4": "0005", "amount": 234.0, "captured": false},
		},
		"note":     "Zahlung für Café ✓ 日本語 🚀 \"quoted\" \\ \u2028",
		"refunded": false,
		"metadata": nil,
		"empty":    map[string]any{},
		"none":     []any{},
		"nested":   map[string]any{"a": map[string]any{"b": []any{1.5, "x", nil, true, []any{}}}},
	}
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	want, err := structpb.NewStruct(body)
	if err != nil {
		t.Fatal(err)
	}
	for _, status := range []int{http.StatusOK, http.StatusCreated, http.StatusAccepted} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, simulator.Always(simulator.Reply{Status: status, Body: raw}))
			c := newClient(t, testConfig(t, srv.URL))
			r, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
			if err != nil {
				t.Fatalf("CreateMultiCardPayment: %v", err)
			}
			if r.Status != status || r.Requests != 1 {
				t.Errorf("reply status %d after %d attempts, want %d after 1", r.Status, r.Requests, status)
			}
			if diff := cmp.Diff(want, r.Payment(), protocmp.Transform()); diff != "" {
				t.Errorf("Payment mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// The default fake echoes the request, which shows the whole round trip.
func TestSimulatedReply(t *testing.T) {
	t.Parallel()
	srv := newServer(t, nil)
	c := newClient(t, testConfig(t, srv.URL))
	r, err := c.CreateMultiCardPayment(t.Context(), payment("idem-1"))
	if err != nil {
		t.Fatal(err)
	}
	f := r.Payment().GetFields()
	req := f["request"].GetStructValue().GetFields()
	if !f["simulated"].GetBoolValue() ||
		req["idempotencyKey"].GetStringValue() != "idem-1" ||
		req["amountMoney"].GetStructValue().GetFields()["amount"].GetNumberValue() != 1234 {
		t.Errorf("Payment = %v, want a simulated echo of the request", r.Payment())
	}
}

// TestRetriesRetryableStatus: a 429 is a refusal before any work, so it
// is retried at once.
func TestRetriesRetryableStatus(t *testing.T) {
	t.Parallel()
	statuses := []int{
		http.StatusTooManyRequests,
	}
	for _, status := range statuses {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, simulator.Sequence(reply(status, `{"error":"try again"}`)))
			c := newClient(t, testConfig(t, srv.URL))
			p := payment("idem-retry")
			r, err := c.CreateMultiCardPayment(t.Context(), p)
			if err != nil {
				t.Fatalf("CreateMultiCardPayment after one %d: %v", status, err)
			}
			if r.Requests != 2 || r.Status != http.StatusOK {
				t.Errorf("reply status %d after %d attempts, want 200 after 2", r.Status, r.Requests)
			}
			reqs := srv.Requests()
			if len(reqs) != 2 {
				t.Fatalf("provider got %d requests, want 2", len(reqs))
			}
			for i, req := range reqs {
				if got := req.Header.Get("X-Api-Key"); got != testKey {
					t.Errorf("request %d: x-api-key = %q, want %q", i+1, got, testKey)
				}
				if string(req.Body) != wireBody(p) {
					t.Errorf("request %d: body = %s, want %s", i+1, req.Body, wireBody(p))
				}
			}
		})
	}
}

// TestNoRetryWhileMaybeAtProvider: a status that may come from something
// in front of the provider while the provider works on (a proxy's 408, a
// load balancer's 500, 502 or 503, a gateway's 504) proves the provider
// done with nothing: the request may still be there, so nothing follows
// it with its key.
func TestNoRetryWhileMaybeAtProvider(t *testing.T) {
	t.Parallel()
	for _, status := range []int{408, 409, 422, 500, 502, 503, 504, 599, 302} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, simulator.Sequence(reply(status, `{"error":"try again"}`)))
			c := newClient(t, testConfig(t, srv.URL))
			_, err := c.CreateMultiCardPayment(t.Context(), payment("idem-maybe"))
			ue := callError(t, err)
			se := statusError(t, err)
			if se.Status != status || ue.Requests != 1 || !ue.MaybeCreated || !ue.AtProvider {
				t.Errorf("got %d after %d attempts, MaybeCreated %v, AtProvider %v; want %d after 1, true, true", se.Status, ue.Requests, ue.MaybeCreated, ue.AtProvider, status)
			}
			if n := len(srv.Requests()); n != 1 {
				t.Errorf("provider got %d requests, want 1", n)
			}
		})
	}
}

func TestNoRetryOnRefusal(t *testing.T) {
	t.Parallel()
	statuses := []int{
		http.StatusBadRequest,
		http.StatusUnauthorized,
		http.StatusForbidden,
		http.StatusNotFound,
		http.StatusConflict,
		http.StatusUnprocessableEntity,
		http.StatusNotImplemented,
		http.StatusTemporaryRedirect,
	}
	for _, status := range statuses {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, simulator.Always(simulator.Reply{
				Status: status,
				Header: http.Header{"Location": {"http://127.0.0.1:1/elsewhere"}},
				Body:   []byte(`{"error":"no"}`),
			}))
			c := newClient(t, testConfig(t, srv.URL))
			_, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
			ue := callError(t, err)
			se := statusError(t, err)
			if se.Status != status {
				t.Errorf("StatusError.Status = %d, want %d", se.Status, status)
			}
			if string(se.Body) != `{"error":"no"}` {
				t.Errorf("StatusError.Body = %q, want the provider's body", se.Body)
			}
			wantMaybe := status != http.StatusBadRequest && status != http.StatusUnauthorized &&
				status != http.StatusForbidden && status != http.StatusNotFound
			if ue.Requests != 1 || ue.MaybeCreated != wantMaybe {
				t.Errorf("Requests, MaybeCreated = %d, %v; want 1, %v", ue.Requests, ue.MaybeCreated, wantMaybe)
			}
			if n := len(srv.Requests()); n != 1 {
				t.Errorf("provider got %d requests, want 1", n)
			}
		})
	}
}

// The 401 and 403 of the fake's default behaviour are the provider's
// documented refusals.
func TestAuthenticationRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		key    string
		status int
	}{
		{"unknown key", "sk_live_unknown", http.StatusUnauthorized},
		{"key of the other environment", "sk_live_forbidden", http.StatusForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, nil)
			srv.ForbidKey("sk_live_forbidden")
			cfg := testConfig(t, srv.URL)
			cfg.APIKey = tt.key
			c := newClient(t, cfg)
			_, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
			ue := callError(t, err)
			if se := statusError(t, err); se.Status != tt.status || ue.Requests != 1 || ue.MaybeCreated {
				t.Errorf("got %d after %d attempts, MaybeCreated %v; want %d after 1, false", se.Status, ue.Requests, ue.MaybeCreated, tt.status)
			}
		})
	}
}

func TestRetryLimits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		maxAttempts  int
		script       simulator.Script
		wantRequests int
		wantStatus   int
		wantMaybe    bool
	}{
		{
			name:         "MaxAttempts 1 disables retries",
			maxAttempts:  1,
			script:       simulator.Sequence(reply(503, "")),
			wantRequests: 1, wantStatus: 503, wantMaybe: true,
		},
		{
			name:         "429 on every attempt, 4 allowed",
			maxAttempts:  4,
			script:       simulator.Always(reply(429, "")),
			wantRequests: 4, wantStatus: 429, wantMaybe: false,
		},
		{
			name:         "zero MaxAttempts is the default",
			maxAttempts:  0,
			script:       simulator.Always(reply(429, "")),
			wantRequests: upstream.DefaultMaxRequests, wantStatus: 429, wantMaybe: false,
		},
		{
			// A 2xx whose reply was lost may have created the payment; a
			// later refusal does not undo that.
			name:         "refusal after a 2xx cut off",
			maxAttempts:  3,
			script:       simulator.Sequence(simulator.Reply{Status: 200, Body: []byte(`{"id":"p"}`), Fault: simulator.CutBody}, reply(400, "")),
			wantRequests: 2, wantStatus: 400, wantMaybe: true,
		},
		{
			// 429 is a refusal before any work: retried, but no payment.
			name:         "429 on every attempt",
			maxAttempts:  2,
			script:       simulator.Always(reply(429, "")),
			wantRequests: 2, wantStatus: 429, wantMaybe: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, tt.script)
			cfg := testConfig(t, srv.URL)
			cfg.MaxRequests = tt.maxAttempts
			c := newClient(t, cfg)
			_, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
			ue := callError(t, err)
			se := statusError(t, err)
			if ue.Requests != tt.wantRequests || se.Status != tt.wantStatus || ue.MaybeCreated != tt.wantMaybe {
				t.Errorf("got %d after %d attempts, MaybeCreated %v; want %d after %d, %v",
					se.Status, ue.Requests, ue.MaybeCreated, tt.wantStatus, tt.wantRequests, tt.wantMaybe)
			}
			if n := len(srv.Requests()); n != tt.wantRequests {
				t.Errorf("provider got %d requests, want %d", n, tt.wantRequests)
			}
		})
	}
}

// TestTransportFaults: a request lost after it was written may still be at
// the provider, so it is never followed by another with the same key (the
// two would be at the provider at once); a reply cut off after its status
// came back is over at the provider, so it is retried.
func TestTransportFaults(t *testing.T) {
	t.Parallel()
	okBody := []byte(`{"id":"pay_1","status":"COMPLETED","cards":[{"last4":"4242"}]}`)
	faults := []struct {
		name       string
		reply      simulator.Reply
		atProvider bool
	}{
		{"reset", simulator.Reply{Fault: simulator.Reset}, true},
		{"hangup", simulator.Reply{Fault: simulator.Hangup}, true},
		{"cut body", simulator.Reply{Status: http.StatusOK, Body: okBody, Fault: simulator.CutBody}, false},
	}
	for _, f := range faults {
		t.Run(f.name+" once", func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, simulator.Sequence(f.reply))
			c := newClient(t, testConfig(t, srv.URL))
			p := payment("idem-fault")
			before := time.Now()
			r, err := c.CreateMultiCardPayment(t.Context(), p)
			if f.atProvider {
				ue := callError(t, err)
				if !errors.Is(err, upstream.ErrConnectionLost) || ue.Requests != 1 || !ue.MaybeCreated || !ue.AtProvider {
					t.Errorf("after one %s: %v, Requests %d, MaybeCreated %v, AtProvider %v; want ErrConnectionLost, 1, true, true",
						f.name, err, ue.Requests, ue.MaybeCreated, ue.AtProvider)
				}
				if ue.LastRequestStart.Before(before) || ue.LastRequestStart.After(time.Now()) {
					t.Errorf("LastRequestStart = %v, want during the call", ue.LastRequestStart)
				}
				if n := len(srv.Requests()); n != 1 {
					t.Errorf("provider got %d requests, want 1: the first may still be at the provider", n)
				}
				return
			}
			if err != nil {
				t.Fatalf("CreateMultiCardPayment after one %s: %v", f.name, err)
			}
			if r.Requests != 2 {
				t.Errorf("Requests = %d, want 2", r.Requests)
			}
			reqs := srv.Requests()
			if len(reqs) != 2 {
				t.Fatalf("provider got %d requests, want 2", len(reqs))
			}
			for i, req := range reqs {
				if string(req.Body) != wireBody(p) || req.Header.Get("X-Api-Key") != testKey {
					t.Errorf("request %d: key %q, body %s; want the same key and body on every attempt", i+1, req.Header.Get("X-Api-Key"), req.Body)
				}
			}
		})
		t.Run(f.name+" always", func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, simulator.Always(f.reply))
			c := newClient(t, testConfig(t, srv.URL))
			_, err := c.CreateMultiCardPayment(t.Context(), payment("idem-fault"))
			ue := callError(t, err)
			if !errors.Is(err, upstream.ErrConnectionLost) {
				t.Errorf("error %v, want ErrConnectionLost", err)
			}
			want := 3
			if f.atProvider {
				want = 1
			}
			if ue.Requests != want || !ue.MaybeCreated || ue.AtProvider != f.atProvider {
				t.Errorf("Requests, MaybeCreated, AtProvider = %d, %v, %v; want %d, true, %v", ue.Requests, ue.MaybeCreated, ue.AtProvider, want, f.atProvider)
			}
			if n := len(srv.Requests()); n != want {
				t.Errorf("provider got %d requests, want %d", n, want)
			}
		})
	}
}

// TestGatewayTimeoutIsNotRetried: a 504 is a gateway's timeout, not the
// provider's answer; the request may still be at the provider.
func TestGatewayTimeoutIsNotRetried(t *testing.T) {
	t.Parallel()
	srv := newServer(t, simulator.Sequence(reply(http.StatusGatewayTimeout, `{"error":"upstream timed out"}`)))
	c := newClient(t, testConfig(t, srv.URL))
	_, err := c.CreateMultiCardPayment(t.Context(), payment("idem-504"))
	ue := callError(t, err)
	se := statusError(t, err)
	if se.Status != http.StatusGatewayTimeout || ue.Requests != 1 || !ue.MaybeCreated || !ue.AtProvider {
		t.Errorf("got %d after %d attempts, MaybeCreated %v, AtProvider %v; want 504 after 1, true, true", se.Status, ue.Requests, ue.MaybeCreated, ue.AtProvider)
	}
	if n := len(srv.Requests()); n != 1 {
		t.Errorf("provider got %d requests, want 1", n)
	}
}

// TestDeadlineAfterWriteIsAtProvider: a request cut off by the caller's
// deadline after it was written may still be at the provider.
func TestDeadlineAfterWriteIsAtProvider(t *testing.T) {
	t.Parallel()
	srv := newServer(t, simulator.Always(simulator.Reply{Delay: time.Minute}))
	c := newClient(t, testConfig(t, srv.URL))
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := c.CreateMultiCardPayment(ctx, payment("idem-slow"))
	ue := callError(t, err)
	if !errors.Is(err, context.DeadlineExceeded) || ue.Requests != 1 || !ue.MaybeCreated || !ue.AtProvider {
		t.Errorf("got %v after %d attempts, MaybeCreated %v, AtProvider %v; want DeadlineExceeded after 1, true, true", err, ue.Requests, ue.MaybeCreated, ue.AtProvider)
	}
}

func TestUnreachable(t *testing.T) {
	t.Parallel()
	c := newClient(t, testConfig(t, closedURL(t)))
	_, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
	ue := callError(t, err)
	if !errors.Is(err, upstream.ErrUnreachable) || errors.Is(err, upstream.ErrConnectionLost) {
		t.Errorf("error %v, want ErrUnreachable only", err)
	}
	if ue.Requests != 3 || ue.MaybeCreated {
		t.Errorf("Requests, MaybeCreated = %d, %v; want 3, false", ue.Requests, ue.MaybeCreated)
	}
}

// A context that is already over sends nothing.
func TestCanceledBeforeCall(t *testing.T) {
	t.Parallel()
	srv := newServer(t, nil)
	c := newClient(t, testConfig(t, srv.URL))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := c.CreateMultiCardPayment(ctx, payment("k"))
	ue := callError(t, err)
	if !errors.Is(err, context.Canceled) || ue.MaybeCreated || ue.Requests != 1 {
		t.Errorf("got %v, Requests %d, MaybeCreated %v; want context.Canceled, 1, false", err, ue.Requests, ue.MaybeCreated)
	}
	if n := len(srv.Requests()); n != 0 {
		t.Errorf("provider got %d requests, want 0", n)
	}
}

func TestBadSuccessBody(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
	}{
		{"malformed", `{"id": pay_1}`},
		{"truncated", `{"id":"pay_1","cards":[{"last4":"4242"`},
		{"array", `[{"id":"pay_1"}]`},
		{"string", `"COMPLETED"`},
		{"number", `42`},
		{"bool", `true`},
		{"null", `null`},
		{"two objects", `{"id":"a"}{"id":"b"}`},
		{"HTML", "<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>"},
		{"invalid UTF-8", "{\"id\":\"\xff\xfe\"}"},
		{"empty", ``},
		{"whitespace", " \n\t "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, simulator.Always(reply(http.StatusOK, tt.body)))
			c := newClient(t, testConfig(t, srv.URL))
			r, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
			if err == nil {
				t.Fatalf("CreateMultiCardPayment with 200 %q = %v, want ErrMalformedReply", tt.body, r.Payment())
			}
			ue := callError(t, err)
			if !errors.Is(err, upstream.ErrMalformedReply) {
				t.Errorf("error %v, want ErrMalformedReply", err)
			}
			if ue.Requests != 1 || !ue.MaybeCreated {
				t.Errorf("Requests, MaybeCreated = %d, %v; want 1, true", ue.Requests, ue.MaybeCreated)
			}
			if n := len(srv.Requests()); n != 1 {
				t.Errorf("provider got %d requests, want 1", n)
			}
		})
	}
}

func TestReplySizeLimit(t *testing.T) {
	t.Parallel()
	const limit = 1024
	// object is a JSON object of exactly n bytes.
	object := func(n int) string {
		return `{"pad":"` + strings.Repeat("x", n-len(`{"pad":""}`)) + `"}`
	}
	tests := []struct {
		name    string
		size    int
		wantErr error
	}{
		{"at the limit", limit, nil},
		{"one over", limit + 1, upstream.ErrReplyTooLarge},
		{"four times", 4 * limit, upstream.ErrReplyTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			body := object(tt.size)
			if len(body) != tt.size {
				t.Fatalf("test body is %d bytes, want %d", len(body), tt.size)
			}
			srv := newServer(t, simulator.Always(reply(http.StatusOK, body)))
			cfg := testConfig(t, srv.URL)
			cfg.MaxResponseBytes = limit
			c := newClient(t, cfg)
			_, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("CreateMultiCardPayment with a %d-byte reply: %v", tt.size, err)
				}
				return
			}
			ue := callError(t, err)
			if !errors.Is(err, tt.wantErr) || ue.Requests != 1 || !ue.MaybeCreated {
				t.Errorf("got %v, Requests %d, MaybeCreated %v; want %v, 1, true", err, ue.Requests, ue.MaybeCreated, tt.wantErr)
			}
		})
	}
}

// waitCanceled waits for the fake to see a client go away.
func waitCanceled(t *testing.T, srv *simulator.Server) {
	t.Helper()
	select {
	case <-srv.Canceled():
	case <-time.After(time.Minute):
		t.Error("the provider never saw the request canceled")
	}
}

// createReturns is c.CreateMultiCardPayment for a call that must end on an
// event (a deadline, a cancellation, a capped wait) while the provider, or
// the wait it asked for, would hold it for an hour. That the call returns
// at all is the proof; a call still running after a minute fails t.
func createReturns(t *testing.T, ctx context.Context, c *upstream.Client, p upstream.Payment) (*upstream.Reply, error) {
	t.Helper()
	type result struct {
		r   *upstream.Reply
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := c.CreateMultiCardPayment(ctx, p)
		done <- result{r, err}
	}()
	select {
	case res := <-done:
		return res.r, res.err
	case <-time.After(time.Minute):
		t.Fatal("CreateMultiCardPayment still running after a minute, held by the provider or its wait")
		return nil, nil
	}
}

func TestDeadline(t *testing.T) {
	t.Parallel()
	const long = time.Hour // the provider's delay: only a deadline ends the call
	// short ends a call that has reached the provider: long enough for the
	// request to get there on a loaded machine (a deadline before it left
	// would rightly say nothing was sent), short beside long.
	const short = 2 * time.Second
	tests := []struct {
		name    string
		reply   simulator.Reply
		timeout time.Duration // Config.Timeout
		ctxTime time.Duration // the caller's deadline
	}{
		{"caller deadline during delay", simulator.Reply{Delay: long}, 0, short},
		{"Config.Timeout during delay", simulator.Reply{Delay: long}, short, 0},
		{"caller deadline before Config.Timeout", simulator.Reply{Delay: long}, time.Hour, short},
		{"Config.Timeout before caller deadline", simulator.Reply{Delay: long}, short, time.Hour},
		{
			"caller deadline during dribbled body",
			simulator.Reply{
				Status:          http.StatusOK,
				Body:            []byte(`{"pad":"` + strings.Repeat("x", 200) + `"}`),
				Fault:           simulator.Dribble,
				DribbleInterval: 50 * time.Millisecond,
			},
			0, short,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, simulator.Always(tt.reply))
			cfg := testConfig(t, srv.URL)
			cfg.Timeout = tt.timeout
			c := newClient(t, cfg)
			ctx := t.Context()
			if tt.ctxTime > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.ctxTime)
				defer cancel()
			}
			_, err := createReturns(t, ctx, c, payment("k"))
			ue := callError(t, err)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v, want context.DeadlineExceeded", err)
			}
			if ue.Requests != 1 || !ue.MaybeCreated {
				t.Errorf("Requests, MaybeCreated = %d, %v; want 1, true", ue.Requests, ue.MaybeCreated)
			}
			waitCanceled(t, srv)
		})
	}
}

// A wait that would outlast the deadline is not started: the caller gets
// the provider's answer, not its own deadline.
func TestBackoffPastDeadline(t *testing.T) {
	t.Parallel()
	srv := newServer(t, simulator.Always(simulator.Reply{
		Status: http.StatusServiceUnavailable,
		Header: http.Header{"Retry-After": {"5"}},
	}))
	c := newClient(t, testConfig(t, srv.URL)) // MaxRetryAfter 10s
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err := c.CreateMultiCardPayment(ctx, payment("k"))
	ue := callError(t, err)
	if se := statusError(t, err); se.Status != http.StatusServiceUnavailable || se.RetryAfter != 5*time.Second {
		t.Errorf("StatusError %d, RetryAfter %v; want 503, 5s", se.Status, se.RetryAfter)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v: the client waited for the deadline", err)
	}
	if ue.Requests != 1 || !ue.MaybeCreated {
		t.Errorf("Requests, MaybeCreated = %d, %v; want 1, true", ue.Requests, ue.MaybeCreated)
	}
}

// A caller that gives up during the backoff gets its own context's error
// at once, not after the wait, and nothing more is sent.
func TestCanceledDuringBackoff(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 1)
	srv := newServer(t, func(n int, _ simulator.Request) simulator.Reply {
		arrived <- struct{}{}
		// A 429 is refused unprocessed, so the client waits and tries
		// again (a 503 may still be worked on: it is not retried).
		return simulator.Reply{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"3600"}}}
	})
	cfg := testConfig(t, srv.URL)
	cfg.MaxRetryAfter = time.Hour // the wait only the cancellation can end
	// The cancellation comes once the client is waiting: after it logged
	// the failed attempt with the wait it chose. (On the request's
	// arrival, it could land while the 503's body was still being read,
	// which is no backoff.)
	waiting := make(chan struct{})
	var once sync.Once
	cfg.Logger = slog.New(attemptLogged{func(r slog.Record) {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "retry_in" && a.Value.String() == time.Hour.String() {
				once.Do(func() { close(waiting) })
			}
			return true
		})
	}})
	c := newClient(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		<-arrived
		<-waiting
		cancel()
	}()
	_, err := createReturns(t, ctx, c, payment("k"))
	ue := callError(t, err)
	if !errors.Is(err, context.Canceled) || ue.Requests != 1 || ue.MaybeCreated {
		t.Errorf("got %v, Requests %d, MaybeCreated %v; want context.Canceled, 1, false", err, ue.Requests, ue.MaybeCreated)
	}
	if n := len(srv.Requests()); n != 1 {
		t.Errorf("provider got %d requests, want 1", n)
	}
}

// TestRetryAfterHonoured: the client waits at least the Retry-After
// before its next attempt. That is a floor, which no load can make flaky;
// how much longer the wait takes is not this test's business (and
// TestRetryAfterParse checks the wait each value asks for).
func TestRetryAfterHonoured(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		status     int
		retryAfter func() string
		// The wait is at least min.
		min time.Duration
	}{
		{"seconds on 429", 429, func() string { return "1" }, time.Second},
		// An HTTP date has whole seconds: two seconds from now is more
		// than one second from the start of the call.
		{"HTTP date", 429, func() string { return time.Now().Add(2 * time.Second).UTC().Format(http.TimeFormat) }, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, func(n int, _ simulator.Request) simulator.Reply {
				if n == 1 {
					return simulator.Reply{Status: tt.status, Header: http.Header{"Retry-After": {tt.retryAfter()}}}
				}
				return simulator.Reply{}
			})
			c := newClient(t, testConfig(t, srv.URL))
			start := time.Now()
			r, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
			elapsed := time.Since(start)
			if err != nil {
				t.Fatalf("CreateMultiCardPayment: %v", err)
			}
			if r.Requests != 2 {
				t.Errorf("Requests = %d, want 2", r.Requests)
			}
			if elapsed < tt.min {
				t.Errorf("call took %v, want at least the Retry-After wait, %v", elapsed, tt.min)
			}
		})
	}
}

func TestRetryAfterCapped(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		retryAfter string
		maxWait    time.Duration
		want       time.Duration
	}{
		{"seconds under the cap", "7", 10 * time.Second, 7 * time.Second},
		{"seconds over the cap", "3600", 50 * time.Millisecond, 50 * time.Millisecond},
		{"date over the cap", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat), 50 * time.Millisecond, 50 * time.Millisecond},
		{"date in the past", "Sun, 06 Nov 1994 08:49:37 GMT", 10 * time.Second, 0},
		{"unparsable", "soon", 10 * time.Second, 0},
		{"zero MaxRetryAfter is the default", "3600", 0, upstream.DefaultMaxRetryAfter},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, simulator.Always(simulator.Reply{
				Status: http.StatusServiceUnavailable,
				Header: http.Header{"Retry-After": {tt.retryAfter}},
			}))
			cfg := testConfig(t, srv.URL)
			cfg.MaxRetryAfter = tt.maxWait
			cfg.MaxRequests = 1
			c := newClient(t, cfg)
			_, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
			if se := statusError(t, err); se.RetryAfter != tt.want {
				t.Errorf("Retry-After %q: StatusError.RetryAfter = %v, want %v", tt.retryAfter, se.RetryAfter, tt.want)
			}
		})
	}

	// And the capped wait is what the client waits: at least the cap, and
	// not the hour asked for (the call returns).
	t.Run("wait", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, simulator.Sequence(simulator.Reply{
			Status: http.StatusTooManyRequests,
			Header: http.Header{"Retry-After": {"3600"}},
		}))
		cfg := testConfig(t, srv.URL)
		cfg.MaxRetryAfter = 50 * time.Millisecond
		c := newClient(t, cfg)
		start := time.Now()
		r, err := createReturns(t, t.Context(), c, payment("k"))
		elapsed := time.Since(start)
		if err != nil {
			t.Fatalf("CreateMultiCardPayment: %v", err)
		}
		if r.Requests != 2 || elapsed < 50*time.Millisecond {
			t.Errorf("success after %d attempts in %v, want 2 attempts after at least 50ms", r.Requests, elapsed)
		}
	})
}

func TestRetryAfterParse(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const limit = 10 * time.Second
	tests := []struct {
		value string
		limit time.Duration
		want  time.Duration
	}{
		{"", limit, 0},
		{"0", limit, 0},
		{"1", limit, time.Second},
		{"10", limit, 10 * time.Second},
		{"11", limit, limit},
		{"3600", time.Hour, time.Hour},
		{"86400", 48 * time.Hour, time.Hour}, // never more than an hour
		{"-1", limit, 0},
		{"1.5", limit, 0},
		{"+1", limit, 0},
		{"1s", limit, 0},
		{"0x10", limit, 0},
		{"one", limit, 0},
		{"01", limit, time.Second},                // RFC 9110: 1*DIGIT
		{"99999999999999999999999", limit, limit}, // too long to parse, but a long wait
		{"Sun, 01 Mar 2026 12:00:05 GMT", limit, 5 * time.Second},  // IMF-fixdate
		{"Sunday, 01-Mar-26 12:00:05 GMT", limit, 5 * time.Second}, // RFC 850
		{"Sun Mar  1 12:00:05 2026", limit, 5 * time.Second},       // asctime
		{"Sun, 01 Mar 2026 13:00:00 GMT", limit, limit},
		{"Sun, 01 Mar 2026 11:59:59 GMT", limit, 0},
		{"Sun, 01 Mar 2026 12:00:05 PST", limit, 0},
	}
	for _, tt := range tests {
		if got := upstream.RetryAfter(tt.value, now, tt.limit); got != tt.want {
			t.Errorf("retryAfter(%q, limit %v) = %v, want %v", tt.value, tt.limit, got, tt.want)
		}
	}
}

func TestCircuitBreaker(t *testing.T) {
	t.Parallel()

	// breakerConfig opens the circuit after three failed attempts.
	breakerConfig := func(t *testing.T, url string, cooldown time.Duration) upstream.Config {
		cfg := testConfig(t, url)
		cfg.MaxRequests = 1
		cfg.BreakerFailures = 3
		cfg.BreakerCooldown = cooldown
		return cfg
	}

	t.Run("opens after failures", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, simulator.Always(reply(http.StatusServiceUnavailable, "")))
		c := newClient(t, breakerConfig(t, srv.URL, time.Hour))
		for i := range 3 {
			_, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
			if se := statusError(t, err); se.Status != http.StatusServiceUnavailable || errors.Is(err, upstream.ErrCircuitOpen) {
				t.Fatalf("call %d: %v, want the provider's 503", i+1, err)
			}
		}
		_, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
		ue := callError(t, err)
		if !errors.Is(err, upstream.ErrCircuitOpen) {
			t.Errorf("call 4: %v, want ErrCircuitOpen", err)
		}
		if ue.Requests != 0 || ue.MaybeCreated {
			t.Errorf("call 4: Requests, MaybeCreated = %d, %v; want 0, false", ue.Requests, ue.MaybeCreated)
		}
		if n := len(srv.Requests()); n != 3 {
			t.Errorf("provider got %d requests, want 3: none once the circuit is open", n)
		}
	})

	t.Run("transport failures open it", func(t *testing.T) {
		t.Parallel()
		c := newClient(t, breakerConfig(t, closedURL(t), time.Hour))
		for range 3 {
			if _, err := c.CreateMultiCardPayment(t.Context(), payment("k")); !errors.Is(err, upstream.ErrUnreachable) {
				t.Fatalf("got %v, want ErrUnreachable", err)
			}
		}
		if _, err := c.CreateMultiCardPayment(t.Context(), payment("k")); !errors.Is(err, upstream.ErrCircuitOpen) {
			t.Errorf("got %v, want ErrCircuitOpen", err)
		}
	})

	t.Run("opens during retries", func(t *testing.T) {
		t.Parallel()
		cfg := breakerConfig(t, closedURL(t), time.Hour)
		cfg.MaxRequests = 5
		cfg.BreakerFailures = 2
		c := newClient(t, cfg)
		_, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
		ue := callError(t, err)
		// The caller learns what went wrong, not that the client stopped
		// asking.
		if !errors.Is(err, upstream.ErrUnreachable) || ue.Requests != 2 || ue.MaybeCreated {
			t.Errorf("got %v after %d attempts, MaybeCreated %v; want ErrUnreachable after 2, false", err, ue.Requests, ue.MaybeCreated)
		}
	})

	t.Run("refusals do not open it", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, simulator.Sequence(
			reply(503, ""), reply(503, ""), reply(409, ""), // a refusal resets the count
			reply(503, ""), reply(503, ""), reply(400, ""),
			reply(401, ""), reply(403, ""), reply(404, ""), reply(422, ""), reply(429, ""),
		))
		c := newClient(t, breakerConfig(t, srv.URL, time.Hour))
		for i := range 12 {
			if _, err := c.CreateMultiCardPayment(t.Context(), payment("k")); errors.Is(err, upstream.ErrCircuitOpen) {
				t.Fatalf("call %d: circuit open", i+1)
			}
		}
		if n := len(srv.Requests()); n != 12 {
			t.Errorf("provider got %d requests, want 12", n)
		}
	})

	t.Run("caller deadlines do not open it", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, simulator.Sequence(
			simulator.Reply{Delay: time.Hour},
			simulator.Reply{Delay: time.Hour},
			simulator.Reply{Delay: time.Hour},
		))
		c := newClient(t, breakerConfig(t, srv.URL, time.Hour))
		for i := range 3 {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
			_, err := c.CreateMultiCardPayment(ctx, payment("k"))
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("call %d: %v, want context.DeadlineExceeded", i+1, err)
			}
			waitCanceled(t, srv)
		}
		if _, err := c.CreateMultiCardPayment(t.Context(), payment("k")); err != nil {
			t.Errorf("after three caller deadlines: %v, want success", err)
		}
	})

	t.Run("closes after cooldown", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, simulator.Always(reply(http.StatusServiceUnavailable, "")))
		c := newClient(t, breakerConfig(t, srv.URL, 50*time.Millisecond))
		for range 3 {
			c.CreateMultiCardPayment(t.Context(), payment("k"))
		}
		if _, err := c.CreateMultiCardPayment(t.Context(), payment("k")); !errors.Is(err, upstream.ErrCircuitOpen) {
			t.Fatalf("got %v, want ErrCircuitOpen", err)
		}
		srv.SetScript(nil) // the provider recovers

		deadline := time.Now().Add(10 * time.Second)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			_, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
			if err == nil {
				break
			}
			if !errors.Is(err, upstream.ErrCircuitOpen) {
				t.Fatalf("while waiting for the cooldown: %v, want ErrCircuitOpen", err)
			}
			if time.Now().After(deadline) {
				t.Fatal("the circuit did not close after its cooldown")
			}
			<-tick.C
		}
		// Closed again: calls go through.
		for i := range 5 {
			if _, err := c.CreateMultiCardPayment(t.Context(), payment("k")); err != nil {
				t.Fatalf("call %d after the circuit closed: %v", i+1, err)
			}
		}
		if n := len(srv.Requests()); n != 3+1+5 {
			t.Errorf("provider got %d requests, want 9: 3 failures, 1 probe, 5 more", n)
		}
	})

	t.Run("failed probe reopens it", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, simulator.Always(reply(http.StatusInternalServerError, "")))
		c := newClient(t, breakerConfig(t, srv.URL, 50*time.Millisecond))
		for range 3 {
			c.CreateMultiCardPayment(t.Context(), payment("k"))
		}
		// Wait out the cooldown until the probe reaches the provider.
		deadline := time.Now().Add(10 * time.Second)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			_, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
			if !errors.Is(err, upstream.ErrCircuitOpen) {
				if se := statusError(t, err); se.Status != http.StatusInternalServerError {
					t.Fatalf("probe: %v, want the provider's 500", err)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no probe after the cooldown")
			}
			<-tick.C
		}
		// One failed probe opens it again at once.
		if _, err := c.CreateMultiCardPayment(t.Context(), payment("k")); !errors.Is(err, upstream.ErrCircuitOpen) {
			t.Errorf("after a failed probe: %v, want ErrCircuitOpen", err)
		}
		if n := len(srv.Requests()); n != 4 {
			t.Errorf("provider got %d requests, want 4: 3 failures and 1 probe", n)
		}
	})
}

// The key is a password: it is in no error, even when the provider echoes
// it back.
func TestKeyNeverInErrors(t *testing.T) {
	t.Parallel()
	const key = "sk_SENTINEL_0123456789"
	echo := func(status int) simulator.Script {
		return func(_ int, r simulator.Request) simulator.Reply {
			k := r.Header.Get("X-Api-Key")
			return reply(status, `{"error":"bad key `+k+`","again":"`+k+k+`"}`)
		}
	}
	tests := []struct {
		name    string
		script  simulator.Script
		closed  bool // call a closed port instead
		ctxTime time.Duration
	}{
		{name: "401 echoing the key", script: echo(http.StatusUnauthorized)},
		{name: "403 echoing the key", script: echo(http.StatusForbidden)},
		{name: "500 echoing the key", script: echo(http.StatusInternalServerError)},
		{name: "reset", script: simulator.Always(simulator.Reply{Fault: simulator.Reset})},
		{name: "hangup", script: simulator.Always(simulator.Reply{Fault: simulator.Hangup})},
		{name: "cut body", script: simulator.Always(simulator.Reply{Status: 200, Body: []byte(`{"key":"` + key + `"}`), Fault: simulator.CutBody})},
		{name: "malformed 200 with the key", script: simulator.Always(reply(200, `{"key":"`+key+`"`))},
		{name: "oversized 200 with the key", script: simulator.Always(reply(200, `{"key":"`+key+strings.Repeat(" ", 2<<20)+`"}`))},
		{name: "deadline", script: simulator.Always(simulator.Reply{Delay: time.Hour}), ctxTime: 50 * time.Millisecond},
		{name: "unreachable", closed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			url := closedURL(t)
			if !tt.closed {
				srv := newServer(t, tt.script)
				srv.AllowKey(key)
				url = srv.URL
			}
			cfg := testConfig(t, url)
			cfg.APIKey = key
			c := newClient(t, cfg)
			ctx := t.Context()
			if tt.ctxTime > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.ctxTime)
				defer cancel()
			}
			_, err := c.CreateMultiCardPayment(ctx, payment("k"))
			ue := callError(t, err)
			for _, format := range []string{"%v", "%+v", "%#v", "%s"} {
				if s := fmt.Sprintf(format, err); strings.Contains(s, key) {
					t.Errorf("error formatted with %s contains the key: %s", format, s)
				}
				if s := fmt.Sprintf(format, ue.Err); strings.Contains(s, key) {
					t.Errorf("Error.Err formatted with %s contains the key: %s", format, s)
				}
			}
			var se *upstream.StatusError
			if errors.As(err, &se) {
				if bytes.Contains(se.Body, []byte(key)) {
					t.Errorf("StatusError.Body contains the key: %s", se.Body)
				}
				if !bytes.Contains(se.Body, []byte(`"error":"bad key `)) {
					t.Errorf("StatusError.Body = %s, want the rest of the provider's body", se.Body)
				}
			}
		})
	}
}

// Only the first MaxErrorBody bytes of an error body are kept, and no part
// of the key may survive at the cut.
func TestKeyRedactedAtErrorBodyLimit(t *testing.T) {
	t.Parallel()
	const key = "sk_SENTINEL_0123456789"
	for _, before := range []int{0, upstream.MaxErrorBody - len(key) - 1, upstream.MaxErrorBody - len(key), upstream.MaxErrorBody - len(key) + 1, upstream.MaxErrorBody - 12, upstream.MaxErrorBody - 4, upstream.MaxErrorBody - 1} {
		t.Run(strconv.Itoa(before), func(t *testing.T) {
			t.Parallel()
			body := strings.Repeat(".", before) + key + strings.Repeat(".", 100)
			srv := newServer(t, simulator.Always(reply(http.StatusUnauthorized, body)))
			srv.AllowKey(key)
			cfg := testConfig(t, srv.URL)
			cfg.APIKey = key
			c := newClient(t, cfg)
			_, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
			se := statusError(t, err)
			if len(se.Body) > upstream.MaxErrorBody {
				t.Errorf("StatusError.Body is %d bytes, want at most %d", len(se.Body), upstream.MaxErrorBody)
			}
			// The first four bytes, "sk_S", may be left; more is a leak.
			if i := bytes.Index(se.Body, []byte(key[:5])); i >= 0 {
				t.Errorf("StatusError.Body keeps %q of the key at byte %d", se.Body[i:], i)
			}
		})
	}
}

// longestPercent writes s as the longest form the redactor reads for a
// byte: a percent sign as a zero-padded hex character reference, and each
// hex digit JSON-escaped. That is 24 bytes per byte of s.
func longestPercent(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		h := fmt.Sprintf("%02X", s[i])
		fmt.Fprintf(&b, "&#x00000025;\\u00%x\\u00%x", h[0], h[1])
	}
	return b.String()
}

// TestNoKeyPrefixAtErrorBodyCut: wherever an error body is cut, no first
// part of the key is kept, in any form, whether the rest of the key was
// read past the cut and redacted or was never read.
func TestNoKeyPrefixAtErrorBodyCut(t *testing.T) {
	t.Parallel()
	if got := upstream.Redact(testKey, []byte(longestPercent(testKey))); bytes.Contains(got, []byte(testKey[:5])) || len(got) > len("[REDACTED]") {
		t.Fatalf("Redact(key in its longest form) = %q, want it redacted", got)
	}
	// readLimit is how much of an error body the client reads: it ends
	// exactly after the tail in the "past the read" cases.
	readLimit := upstream.MaxErrorBody + upstream.MaxEncodedKeyByte*len(testKey)
	// Keys written out in full before the cut, each redacted to a much
	// shorter mark, so that the end of what was read lands inside the
	// kept part.
	shrink := strings.Repeat(longestPercent(testKey)+" ", 8)
	percent := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			fmt.Fprintf(&b, "%%%02X", s[i])
		}
		return b.String()
	}
	hexOf := func(s string) string { return fmt.Sprintf("%x", s) }
	plain := func(s string) string { return s }
	const k = 8 // key bytes before the cut or the end of the read
	tests := []struct {
		name   string
		body   string
		encode func(string) string // how the kept key bytes are written
	}{
		{
			"cut inside the key, rest in the longest form",
			strings.Repeat(".", upstream.MaxErrorBody-5) + testKey[:5] + longestPercent(testKey[5:]) + " trailing",
			plain,
		},
		{
			"cut inside the key in the longest form",
			strings.Repeat(".", upstream.MaxErrorBody-len(longestPercent(testKey[:5]))) + longestPercent(testKey) + " trailing",
			longestPercent,
		},
		{
			"read ends inside the key, plain",
			shrink + strings.Repeat(".", readLimit-len(shrink)-k) + testKey[:k] + testKey[k:] + " trailing",
			plain,
		},
		{
			"read ends inside the key, percent-encoded",
			shrink + strings.Repeat(".", readLimit-len(shrink)-3*k) + percent(testKey[:k]) + percent(testKey[k:]) + " trailing",
			percent,
		},
		{
			"read ends inside an escape after the key's first bytes",
			shrink + strings.Repeat(".", readLimit-len(shrink)-k-4) + testKey[:k] + `\u00` + "73" + testKey[k+1:] + " trailing",
			plain,
		},
		{
			"read ends inside the key, hex",
			shrink + strings.Repeat(".", readLimit-len(shrink)-2*k) + hexOf(testKey[:k]) + hexOf(testKey[k:]) + " trailing",
			hexOf,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, simulator.Always(reply(http.StatusBadRequest, tt.body)))
			c := newClient(t, testConfig(t, srv.URL))
			_, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
			se := statusError(t, err)
			if len(se.Body) > upstream.MaxErrorBody {
				t.Errorf("StatusError.Body is %d bytes, want at most %d", len(se.Body), upstream.MaxErrorBody)
			}
			if i := bytes.Index(se.Body, []byte(tt.encode(testKey[:5]))); i >= 0 {
				t.Errorf("StatusError.Body keeps the key's first bytes at byte %d: %q", i, se.Body[i:])
			}
		})
	}
}

// metric returns the value of a counter or gauge in reg, 0 if absent.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if got[labels[i]] != labels[i+1] {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := upstream.NewMetrics(reg)
	arrived := make(chan struct{}, 1)
	srv := newServer(t, simulator.Sequence(
		reply(429, ""), // call 1: 429, then 200
		simulator.Reply{},
		reply(409, ""),                          // call 2: 409
		simulator.Reply{Fault: simulator.Reset}, // call 3: lost, and not retried
	))
	cfg := testConfig(t, srv.URL)
	cfg.Metrics = m
	c := newClient(t, cfg)
	for range 3 {
		c.CreateMultiCardPayment(t.Context(), payment("k"))
	}

	// A call that stays in flight until canceled.
	srv.SetScript(func(int, simulator.Request) simulator.Reply {
		arrived <- struct{}{}
		return simulator.Reply{Delay: time.Hour}
	})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := c.CreateMultiCardPayment(ctx, payment("k"))
		done <- err
	}()
	<-arrived
	if got := metric(t, reg, "paymentsd_provider_requests_in_flight"); got != 1 {
		t.Errorf("in flight during a call = %v, want 1", got)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("canceled call: %v, want context.Canceled", err)
	}

	// A client that cannot connect, and one whose circuit opens, sharing the
	// metrics.
	cfg = testConfig(t, closedURL(t))
	cfg.Metrics = m
	cfg.MaxRequests = 2
	cfg.BreakerFailures = 2
	unreachable := newClient(t, cfg)
	for range 2 {
		unreachable.CreateMultiCardPayment(t.Context(), payment("k"))
	}

	tests := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"paymentsd_provider_requests_total", []string{"outcome", "200"}, 1},
		{"paymentsd_provider_requests_total", []string{"outcome", "429"}, 1},
		{"paymentsd_provider_requests_total", []string{"outcome", "409"}, 1},
		{"paymentsd_provider_requests_total", []string{"outcome", "connection_lost"}, 1},
		{"paymentsd_provider_requests_total", []string{"outcome", "canceled"}, 1},
		{"paymentsd_provider_requests_total", []string{"outcome", "unreachable"}, 2},
		{"paymentsd_provider_requests_total", []string{"outcome", "circuit_open"}, 1},
		{"paymentsd_provider_retries_total", nil, 2},
		// Every attempt that was sent or tried is timed.
		{"paymentsd_provider_request_duration_seconds", nil, 7},
		{"paymentsd_provider_requests_in_flight", nil, 0},
		// The pool opened one connection, and one more after the reset.
		{"paymentsd_provider_connections_opened_total", nil, float64(srv.Connections())},
		{"paymentsd_provider_connections_opened_total", nil, 2},
	}
	for _, tt := range tests {
		if got := metric(t, reg, tt.name, tt.labels...); got != tt.want {
			t.Errorf("%s%v = %v, want %v", tt.name, tt.labels, got, tt.want)
		}
	}
}

// A nil *Metrics records nothing and is safe.
func TestNilMetrics(t *testing.T) {
	t.Parallel()
	srv := newServer(t, simulator.Sequence(reply(429, "")))
	c := newClient(t, testConfig(t, srv.URL))
	if _, err := c.CreateMultiCardPayment(t.Context(), payment("k")); err != nil {
		t.Fatal(err)
	}
}

// Concurrent calls never mix up their bodies, whatever fails.
func TestConcurrentCalls(t *testing.T) {
	t.Parallel()
	const calls = 200
	srv := newServer(t, func(n int, _ simulator.Request) simulator.Reply {
		switch n % 6 {
		case 3:
			return reply(http.StatusServiceUnavailable, "")
		case 0:
			return simulator.Reply{Fault: simulator.Reset}
		}
		return simulator.Reply{}
	})
	c := newClient(t, testConfig(t, srv.URL))

	payments := make([]upstream.Payment, calls)
	for i := range payments {
		payments[i] = upstream.Payment{Currency: "USD", Amount: int64(1_000_000 + i), IdempotencyKey: fmt.Sprintf("idem-%03d", i)}
	}
	type outcome struct {
		reply *upstream.Reply
		err   error
	}
	outcomes := make([]outcome, calls)
	var wg sync.WaitGroup
	for i, p := range payments {
		wg.Go(func() {
			r, err := c.CreateMultiCardPayment(t.Context(), p)
			outcomes[i] = outcome{r, err}
		})
	}
	wg.Wait()

	succeeded := 0
	for i, o := range outcomes {
		p := payments[i]
		if o.err != nil {
			callError(t, o.err)
			continue
		}
		succeeded++
		req := o.reply.Payment().GetFields()["request"].GetStructValue().GetFields()
		gotKey := req["idempotencyKey"].GetStringValue()
		gotAmount := req["amountMoney"].GetStructValue().GetFields()["amount"].GetNumberValue()
		if gotKey != p.IdempotencyKey || gotAmount != float64(p.Amount) {
			t.Errorf("call %d with %s, %d: reply echoes %s, %v", i, p.IdempotencyKey, p.Amount, gotKey, gotAmount)
		}
	}
	if succeeded < calls/2 {
		t.Errorf("%d of %d calls succeeded, want most", succeeded, calls)
	}

	// Every request for a key carried that key's exact body.
	want := map[string]string{}
	for _, p := range payments {
		want[p.IdempotencyKey] = wireBody(p)
	}
	reqs := srv.Requests()
	if len(reqs) < calls {
		t.Errorf("provider got %d requests, want at least %d", len(reqs), calls)
	}
	for _, r := range reqs {
		var body struct{ IdempotencyKey string }
		if err := json.Unmarshal(r.Body, &body); err != nil {
			t.Fatalf("request body %s: %v", r.Body, err)
		}
		if string(r.Body) != want[body.IdempotencyKey] || r.Header.Get("X-Api-Key") != testKey {
			t.Errorf("request for %q: body %s, key %q; want %s, %q", body.IdempotencyKey, r.Body, r.Header.Get("X-Api-Key"), want[body.IdempotencyKey], testKey)
		}
	}
}

// Over HTTPS, as the live provider is, the client behaves the same, and a
// provider it cannot trust is one it never reached.
func TestTLS(t *testing.T) {
	t.Parallel()
	tlsConfig := func(t *testing.T, srv *simulator.Server, trust bool) upstream.Config {
		cfg := testConfig(t, srv.URL)
		tr := &http.Transport{}
		if trust {
			pool := x509.NewCertPool()
			pool.AddCert(srv.Certificate())
			tr.TLSClientConfig = &tls.Config{RootCAs: pool}
		}
		t.Cleanup(tr.CloseIdleConnections)
		cfg.HTTPClient = &http.Client{Transport: tr}
		return cfg
	}
	tests := []struct {
		name         string
		trust        bool
		script       simulator.Script
		wantErr      error
		wantTried    int
		wantMaybe    bool
		wantRequests int
	}{
		{"success", true, nil, nil, 1, false, 1},
		// A request lost after it was written may still be at the
		// provider: it is not followed by another.
		{"reset", true, simulator.Sequence(simulator.Reply{Fault: simulator.Reset}), upstream.ErrConnectionLost, 1, true, 1},
		{"hangup", true, simulator.Always(simulator.Reply{Fault: simulator.Hangup}), upstream.ErrConnectionLost, 1, true, 1},
		{"untrusted certificate", false, nil, upstream.ErrUnreachable, 3, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := simulator.NewTLSServer()
			t.Cleanup(srv.Close)
			srv.AllowKey(testKey)
			srv.SetScript(tt.script)
			c := newClient(t, tlsConfig(t, srv, tt.trust))
			r, err := c.CreateMultiCardPayment(t.Context(), payment("k"))
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("CreateMultiCardPayment: %v", err)
				}
				if r.Requests != tt.wantTried {
					t.Errorf("Requests = %d, want %d", r.Requests, tt.wantTried)
				}
			} else {
				ue := callError(t, err)
				if !errors.Is(err, tt.wantErr) || ue.Requests != tt.wantTried || ue.MaybeCreated != tt.wantMaybe {
					t.Errorf("got %v, Requests %d, MaybeCreated %v; want %v, %d, %v",
						err, ue.Requests, ue.MaybeCreated, tt.wantErr, tt.wantTried, tt.wantMaybe)
				}
			}
			if n := len(srv.Requests()); n != tt.wantRequests {
				t.Errorf("provider got %d requests, want %d", n, tt.wantRequests)
			}
		})
	}
}

// TestRedirectNotFollowed checks that a redirect is never followed, even by
// a client whose CheckRedirect would: following it would resend x-api-key
// to wherever the provider points.
func TestRedirectNotFollowed(t *testing.T) {
	t.Parallel()
	elsewhere := simulator.NewServer()
	t.Cleanup(elsewhere.Close)
	srv := simulator.NewServer()
	t.Cleanup(srv.Close)
	srv.SetScript(simulator.Always(simulator.Reply{
		Status: http.StatusTemporaryRedirect,
		Header: http.Header{"Location": {elsewhere.URL + "/multi-card-payments"}},
	}))
	cfg := testConfig(t, srv.URL)
	cfg.HTTPClient = &http.Client{Transport: &http.Transport{}} // follows redirects by default
	t.Cleanup(cfg.HTTPClient.CloseIdleConnections)
	c := newClient(t, cfg)

	_, err := c.CreateMultiCardPayment(t.Context(), payment("k-redirect"))
	if se := statusError(t, err); se.Status != http.StatusTemporaryRedirect {
		t.Errorf("CreateMultiCardPayment() status = %d, want 307 unfollowed", se.Status)
	}
	if n := len(elsewhere.Requests()); n != 0 {
		t.Errorf("the redirect target saw %d requests, want 0", n)
	}
}

// TestOutcomeByStatus checks which provider statuses prove that no payment
// was created: only refusals that happen before a request is acted on.
// Everything else, 409 (another request with the same key in flight) and
// 3xx (never followed) among them, may have created one.
func TestOutcomeByStatus(t *testing.T) {
	t.Parallel()
	notCreated := []int{400, 401, 403, 404, 405, 406, 411, 413, 414, 415, 429, 431}
	maybe := []int{300, 301, 302, 303, 304, 307, 308, 402, 408, 409, 410, 412, 416, 417, 418, 421, 422, 423, 424, 425, 426, 428, 451, 499, 500, 501, 502, 503, 504, 599}
	srv := newServer(t, func(_ int, r simulator.Request) simulator.Reply {
		var body struct{ IdempotencyKey string }
		json.Unmarshal(r.Body, &body)
		status, _ := strconv.Atoi(body.IdempotencyKey)
		return simulator.Reply{Status: status, Body: []byte(`{"error":"scripted"}`)}
	})
	cfg := testConfig(t, srv.URL)
	cfg.MaxRequests = 1
	c := newClient(t, cfg)
	check := func(status int, wantMaybe bool) {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			_, err := c.CreateMultiCardPayment(t.Context(), payment(strconv.Itoa(status)))
			ue := callError(t, err)
			if se := statusError(t, err); se.Status != status {
				t.Fatalf("StatusError.Status = %d, want %d", se.Status, status)
			}
			if ue.MaybeCreated != wantMaybe {
				t.Errorf("provider %d: MaybeCreated = %v, want %v", status, ue.MaybeCreated, wantMaybe)
			}
		})
	}
	for _, s := range notCreated {
		check(s, false)
	}
	for _, s := range maybe {
		check(s, true)
	}
}

// A status that proves nothing on an earlier attempt keeps the call's
// outcome unknown, whatever later attempts answer.
func TestOutcomeUnknownSticks(t *testing.T) {
	t.Parallel()
	cut := simulator.Reply{Status: http.StatusOK, Body: []byte(`{"id":"p"}`), Fault: simulator.CutBody}
	srv := newServer(t, simulator.Sequence(cut, reply(http.StatusTooManyRequests, "")))
	cfg := testConfig(t, srv.URL)
	cfg.MaxRequests = 2
	c := newClient(t, cfg)
	_, err := c.CreateMultiCardPayment(t.Context(), payment("k-sticky"))
	if ue := callError(t, err); !ue.MaybeCreated || ue.Requests != 2 {
		t.Errorf("2xx cut off then 429: MaybeCreated, Requests = %v, %d; want true, 2", ue.MaybeCreated, ue.Requests)
	}
}

// A key whose base64 holds '/', echoed with '/' percent-encoded, where the
// read ends inside the "%2F": trimming the cut escape must not leave the
// base64 before it.
func TestNoBase64PrefixAtErrorBodyCut(t *testing.T) {
	t.Parallel()
	const key = "sk_live_q8Zr/x?Yk3nP0w~Lm9"
	const form = "c2tfbGl2ZV9xOFpyL3g%2FWWszblAwd35MbT" // base64 of the key, '/' as %2F
	for _, m := range []int{len("c2tfbGl2ZV9xOFpyL3g%"), len("c2tfbGl2ZV9xOFpyL3g%2")} {
		readLimit := upstream.MaxErrorBody + upstream.MaxEncodedKeyByte*len(key)
		shrink := strings.Repeat(key+" ", 200) // redacting these shortens what was read
		body := shrink + strings.Repeat(".", readLimit-len(shrink)-m) + form + " trailing"
		srv := newServer(t, nil)
		srv.AllowKey(key)
		srv.SetScript(simulator.Always(reply(http.StatusBadRequest, body)))
		cfg := testConfig(t, srv.URL)
		cfg.APIKey = key
		_, err := newClient(t, cfg).CreateMultiCardPayment(t.Context(), payment("k"))
		if se := statusError(t, err); bytes.Contains(se.Body, []byte("c2tfbGl2ZV9xOFpy")) {
			t.Errorf("cut %d bytes into the form: body keeps base64 of the key's first bytes", m)
		}
	}
}

// A JSON error body too long to read whole, so not decodable as JSON, whose
// encoder writes / as \/: the key's base64 is still found.
func TestEscapedBase64InCutJSONBody(t *testing.T) {
	t.Parallel()
	const key = "sk_live_q8Zr/x?Yk3nP0w~Lm9"
	body := `{"error":"invalid credentials","echo":"Basic c2tfbGl2ZV9xOFpyL3g\/WWszblAwd35MbT0=","trace":"` + strings.Repeat("x", 20000) + `"}`
	srv := newServer(t, nil)
	srv.AllowKey(key)
	srv.SetScript(simulator.Always(reply(http.StatusUnauthorized, body)))
	cfg := testConfig(t, srv.URL)
	cfg.APIKey = key
	_, err := newClient(t, cfg).CreateMultiCardPayment(t.Context(), payment("k"))
	if se := statusError(t, err); bytes.Contains(se.Body, []byte("c2tfbGl2ZV9xOFpy")) {
		t.Errorf("cut JSON body keeps the key's base64")
	}
}

// attemptLogged is a slog handler that hands each record to fn.
type attemptLogged struct{ fn func(slog.Record) }

func (h attemptLogged) Enabled(context.Context, slog.Level) bool { return true }
func (h attemptLogged) Handle(_ context.Context, r slog.Record) error {
	h.fn(r)
	return nil
}
func (h attemptLogged) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h attemptLogged) WithGroup(string) slog.Handler      { return h }
