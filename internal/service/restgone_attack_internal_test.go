package service

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestRESTCallerGoneFreesItsSlot: a REST caller that set no deadline goes
// away while its payment's request is at the provider. Its call is no
// longer in progress: its in-flight slot is free for others at once (as
// a gRPC caller's is), not held until the provider answers. Here the cap
// is one call, and a lookup after the caller has gone gets its answer,
// not 429.
func TestRESTCallerGoneFreesItsSlot(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 30*time.Second, nil)
	arrived, release := held(f.p)
	t.Cleanup(func() { close(release) })
	reg := prometheus.NewRegistry()
	srv, err := NewServer(f.svc, Options{
		Logger:          slog.New(slog.NewJSONHandler(io.Discard, nil)),
		Registerer:      reg,
		Gatherer:        reg,
		MaxRequestBytes: 64 << 10,
		MaxInFlight:     1,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.GRPC.Stop)
	hs := httptest.NewServer(srv.HTTP)
	t.Cleanup(hs.Close)
	srv.SetServing(true)

	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/multi-card-payments",
		strings.NewReader(`{"amountMoney":{"currency":"USD","amount":1250},"idempotencyKey":"k-gone"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		if resp, err := hs.Client().Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-arrived
	cancel()
	<-gone

	// The server learns that the caller went when its connection closes;
	// until then the lookup may be refused. The lookup must get through
	// while the gone caller's request is still at the provider (the fake
	// holds it until the client's timeout), not once it has ended.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := hs.Client().Get(hs.URL + "/v1/multi-card-payments/k-gone")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// The gone caller's request is at the provider all along: the
		// fake holds it until the test ends.
		if resp.StatusCode != http.StatusTooManyRequests {
			if resp.StatusCode != http.StatusOK {
				t.Errorf("lookup after the caller went = %d %s, want 200", resp.StatusCode, body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lookup after the caller went = %d %s for 10s: the gone caller's call still holds the only in-flight slot while its request is at the provider", resp.StatusCode, body)
		}
		time.Sleep(10 * time.Millisecond) // the server's side of the close has no signal a client sees
	}
}
