package store_test

import (
	"context"
	"crypto/sha256"
	"math"
	"strconv"
	"testing"
	"time"

	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
)

// TestPostgresRoundTrips counts the round trips to PostgreSQL of a
// payment's records (Begin, then Finish with a 2xx), of a replay (Begin of
// a key whose payment succeeded) and of a lookup (Get), one at a time,
// straight to the server and through PgBouncer in transaction mode, with
// a proxy that reads the protocol (storetest.CountRoundTrips). Round
// trips don't drift with the machine's load: the counts are exact, and a
// change that adds one fails here. pgx's pings of a connection idle for
// over a second are left out (at one call at a time there are none), and
// so is the store's heartbeat, a write transaction of its own after half a
// second without one: each count is the least of five rounds of ten
// calls, and a round of reads that catches a heartbeat is not the least.
func TestPostgresRoundTrips(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                  string
		url                   func(t testing.TB) string
		payment, replay, look int64
	}{
		{"direct", storetest.PostgresURL, 6, 4, 1},
		{"pgbouncer", func(t testing.TB) string { return storetest.PooledPostgresURL(t, 2) }, 6, 4, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rt, url := storetest.CountRoundTrips(t, tc.url(t))
			ctx := context.Background()
			s, err := store.Open(ctx, url, "sandbox", store.Options{MaxConns: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			body := []byte(`{"amount":1250}`)
			claim := func(key string) record.Claim {
				return record.Claim{Request: record.Request{Key: key, Body: body, BodySHA256: sha256.Sum256(body), Currency: "USD",
					Amount: 1250, RequestID: "r"}, Owner: "p/" + key, LeaseTTL: time.Minute, Window: time.Hour, Quiet: time.Minute}
			}
			n := 0
			pay := func() {
				n++
				key := "k" + strconv.Itoa(n)
				b, err := s.Begin(ctx, claim(key), nil)
				if err != nil || b.Verdict != record.Acquired {
					t.Fatalf("Begin(%s) = %v, %v; want Acquired", key, b.Verdict, err)
				}
				v, err := s.Finish(ctx, &b.Record, record.Outcome{Owner: "p/" + key, Result: record.Paid, HTTPRequests: 1,
					ProviderStatus: 200, Reply: []byte(`{"id":"pay"}`)})
				if err != nil || v != record.Written {
					t.Fatalf("Finish(%s) = %v, %v; want Written", key, v, err)
				}
			}
			replay := func() {
				b, err := s.Begin(ctx, claim("k1"), nil)
				if err != nil || b.Verdict != record.Replay {
					t.Fatalf("Begin(k1) = %v, %v; want Replay", b.Verdict, err)
				}
			}
			look := func() {
				if _, err := s.Get(ctx, "k1"); err != nil {
					t.Fatalf("Get(k1): %v", err)
				}
			}
			for _, op := range []struct {
				name string
				fn   func()
				want int64
			}{
				{"payment", pay, tc.payment},
				{"replay", replay, tc.replay},
				{"lookup", look, tc.look},
			} {
				for range 5 {
					op.fn() // warm: connections, prepared statements
				}
				const rounds, calls = 5, 10
				least := int64(math.MaxInt64)
				for range rounds {
					before := rt.Requests()
					for range calls {
						op.fn()
					}
					least = min(least, rt.Requests()-before)
				}
				t.Logf("%s, %s: %.2f round trips per call; %d pings, %d connections opened in all",
					tc.name, op.name, float64(least)/calls, rt.Pings(), rt.Conns())
				if least != op.want*calls {
					t.Errorf("%s, %s: %.2f round trips per call, want %d", tc.name, op.name, float64(least)/calls, op.want)
				}
			}
		})
	}
}
