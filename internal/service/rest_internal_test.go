package service

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// An oversized body over HTTP/2 is refused without closing the connection
// its stream shares with others.
func TestOversizedBodyKeepsHTTP2Connection(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.Handle("/v1/", limitBody(10, time.Second, paymentsv1.Environment_ENVIRONMENT_SANDBOX, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })))
	srv := httptest.NewUnstartedServer(readDeadline(time.Second, mux))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	client := srv.Client()
	post := func(body string) (status int, reused bool) {
		ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/x", strings.NewReader(body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Fatalf("answered over %s, want HTTP/2", resp.Proto)
		}
		return resp.StatusCode, reused
	}
	post("small")
	if status, _ := post(strings.Repeat("x", 100)); status != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized body = %d, want 413", status)
	}
	if status, reused := post("small"); status != http.StatusOK || !reused {
		t.Errorf("next call = %d on a reused connection %v, want 200 on the same connection", status, reused)
	}
}

// TestDropEmptyQuery: parameters with no value are dropped, as if absent;
// every other is kept as written.
func TestDropEmptyQuery(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ query, want string }{
		{"afterSequence=&pageSize=", ""},
		{"afterSequence=5&pageSize=", "afterSequence=5"},
		{"afterSequence&pageSize=10", "pageSize=10"},
		{"a=%20&b=x%26y&c=", "a=%20&b=x%26y"},
		{"", ""},
	} {
		var got string
		h := dropEmptyQuery(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { got = r.URL.RawQuery }))
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/v1/provider-events?"+tc.query, nil))
		if got != tc.want {
			t.Errorf("dropEmptyQuery(%q) passed on %q, want %q", tc.query, got, tc.want)
		}
	}
}
