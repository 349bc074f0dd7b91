package upstream_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/upstream"
)

// BenchmarkAnswerWithoutWaiting times the calls the tests check end
// without waiting: a provider's Retry-After past the caller's deadline
// (TestBackoffPastDeadline: the caller gets the provider's answer, not its
// own deadline), and a provider that refuses connections, tried once.
//
//	go test -run '^$' -bench AnswerWithoutWaiting ./internal/upstream/
func BenchmarkAnswerWithoutWaiting(b *testing.B) {
	b.Run("Retry-After past the deadline", func(b *testing.B) {
		srv := simulator.NewServer()
		b.Cleanup(srv.Close)
		srv.AllowKey(testKey)
		srv.KeepRequests(false)
		srv.SetScript(simulator.Always(simulator.Reply{
			Status: http.StatusServiceUnavailable,
			Header: http.Header{"Retry-After": {"5"}},
		}))
		c := benchClient(b, srv.URL, 3) // room for a retry it must not wait for
		for b.Loop() {
			ctx, cancel := context.WithTimeout(b.Context(), 500*time.Millisecond)
			_, err := c.CreateMultiCardPayment(ctx, payment("k"))
			cancel()
			var se *upstream.StatusError
			if !errors.As(err, &se) || se.Status != http.StatusServiceUnavailable {
				b.Fatalf("CreateMultiCardPayment() = %v, want the provider's 503", err)
			}
		}
	})
	b.Run("connection refused", func(b *testing.B) {
		c := benchClient(b, closedURL(b), 1)
		for b.Loop() {
			if _, err := c.CreateMultiCardPayment(b.Context(), payment("k")); err == nil {
				b.Fatal("CreateMultiCardPayment() against a closed port = nil error")
			}
		}
	})
}

// benchClient is a client of baseURL that makes up to attempts attempts,
// and never opens its circuit.
func benchClient(b *testing.B, baseURL string, attempts int) *upstream.Client {
	transport := &http.Transport{}
	b.Cleanup(transport.CloseIdleConnections)
	c, err := upstream.New(upstream.Config{
		BaseURL:         baseURL,
		APIKey:          testKey,
		HTTPClient:      &http.Client{Transport: transport},
		MaxRequests:     attempts,
		MaxRetryAfter:   10 * time.Second,
		BreakerFailures: 1 << 30,
		BreakerCooldown: time.Hour,
	})
	if err != nil {
		b.Fatalf("New: %v", err)
	}
	return c
}
