package upstream_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/upstream"
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

// attemptLines returns the logged "provider attempt failed" lines.
func attemptLines(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		if m["msg"] == "provider attempt failed" {
			out = append(out, m)
		}
	}
	return out
}

// TestAttemptLogsCause checks that each failed attempt is logged at warn
// with its real cause, so that an operator can tell a DNS failure from a
// refused connection, an untrusted certificate from a hostname mismatch,
// and a key that is not a valid header value from all of them, while the
// caller's error stays generic and no log line holds the key.
func TestAttemptLogsCause(t *testing.T) {
	t.Parallel()
	const key = "sk_SENTINEL_0123456789"
	tlsClient := func(t *testing.T, srv *simulator.Server, trust bool, serverName string) *http.Client {
		tc := &tls.Config{ServerName: serverName}
		if trust {
			pool := x509.NewCertPool()
			pool.AddCert(srv.Certificate())
			tc.RootCAs = pool
		}
		tr := &http.Transport{TLSClientConfig: tc}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	tests := []struct {
		name        string
		setup       func(t *testing.T, cfg *upstream.Config)
		wantInCause string // the transport's own words for it
		wantOutcome string
		wantStatus  float64
	}{
		{"DNS failure", func(t *testing.T, cfg *upstream.Config) {
			// Go never resolves .onion names (RFC 7686): a name that
			// gives no address, without needing a DNS server.
			cfg.BaseURL = "http://paymentsd-test.onion/v1"
		}, "paymentsd-test.onion", "unreachable", 0},
		{"connection refused", func(t *testing.T, cfg *upstream.Config) {
			cfg.BaseURL = closedURL(t)
		}, "connection refused", "unreachable", 0},
		{"unknown certificate authority", func(t *testing.T, cfg *upstream.Config) {
			srv := simulator.NewTLSServer()
			t.Cleanup(srv.Close)
			cfg.BaseURL, cfg.HTTPClient = srv.URL, tlsClient(t, srv, false, "")
		}, "unknown authority", "unreachable", 0},
		{"hostname mismatch", func(t *testing.T, cfg *upstream.Config) {
			srv := simulator.NewTLSServer()
			t.Cleanup(srv.Close)
			cfg.BaseURL, cfg.HTTPClient = srv.URL, tlsClient(t, srv, true, "provider.example.test")
		}, "provider.example.test", "unreachable", 0},
		{"key not a valid header value", func(t *testing.T, cfg *upstream.Config) {
			srv := newServer(t, nil)
			cfg.BaseURL = srv.URL
			cfg.APIKey = key + "\nsecond-line"
		}, "invalid header field value", "unreachable", 0},
		{"provider status", func(t *testing.T, cfg *upstream.Config) {
			srv := newServer(t, simulator.Always(reply(http.StatusTooManyRequests, `{"key":"`+key+`"}`)))
			cfg.BaseURL = srv.URL
		}, "429", "", 429},
	}
	causes := map[string]string{}
	var mu sync.Mutex
	t.Cleanup(func() {
		seen := map[string]string{}
		for name, cause := range causes {
			if other, ok := seen[cause]; ok {
				t.Errorf("%s and %s log the same cause %q", name, other, cause)
			}
			seen[cause] = name
		}
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var logs syncBuffer
			cfg := testConfig(t, "")
			cfg.APIKey = key
			cfg.MaxRequests = 2
			cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
			tt.setup(t, &cfg)
			c := newClient(t, cfg)
			_, err := c.CreateMultiCardPayment(t.Context(), payment("k-log"))
			callError(t, err)

			lines := attemptLines(t, logs.String())
			if len(lines) != 2 {
				t.Fatalf("logged %d failed attempts, want 2:\n%s", len(lines), logs.String())
			}
			for i, line := range lines {
				if line["level"] != "WARN" || line["attempt"] != float64(i+1) {
					t.Errorf("line %d: level %v attempt %v, want WARN %d", i, line["level"], line["attempt"], i+1)
				}
				cause, _ := line["cause"].(string)
				if !strings.Contains(cause, tt.wantInCause) {
					t.Errorf("line %d: cause %q, want the transport's own words (%q)", i, cause, tt.wantInCause)
				}
				if tt.wantStatus != 0 && line["provider_status"] != tt.wantStatus {
					t.Errorf("line %d: provider_status %v, want %v", i, line["provider_status"], tt.wantStatus)
				}
				if tt.wantOutcome != "" && line["outcome"] != tt.wantOutcome {
					t.Errorf("line %d: outcome %v, want %v", i, line["outcome"], tt.wantOutcome)
				}
				mu.Lock()
				causes[tt.name] = cause
				mu.Unlock()
			}
			if strings.Contains(logs.String(), key) {
				t.Errorf("the log holds the key:\n%s", logs.String())
			}
		})
	}
}

// A nil Logger logs nothing, and costs nothing.
func TestNilLogger(t *testing.T) {
	t.Parallel()
	c := newClient(t, testConfig(t, closedURL(t)))
	if _, err := c.CreateMultiCardPayment(t.Context(), payment("k")); err == nil {
		t.Fatal("call to a closed port succeeded")
	}
}
