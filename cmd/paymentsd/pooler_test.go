package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
)

// TestBehindPgBouncerTransactionMode runs paymentsd on PostgreSQL through a
// real PgBouncer in transaction mode whose pool (4 server connections) is
// smaller than paymentsd's (10) and far smaller than the callers: 180
// concurrent payments mixed with lookups all succeed, except the ones
// whose reply the provider loses, which are answered honestly
// (PAYMENT_OUTCOME_UNKNOWN) and then settled through the pooler; and
// webhook deliveries arriving meanwhile are all stored and listed.
func TestBehindPgBouncerTransactionMode(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("180 concurrent payments through PgBouncer")
	}
	db := storetest.PooledPostgresURL(t, 4)
	p := idempotentProvider(t)
	const (
		payments = 180
		lost     = 12 // every 15th key's first reply is lost
		lookups  = 40
		events   = 50
	)
	var mu sync.Mutex
	seen := map[string]bool{}
	p.SetScript(func(_ int, r simulator.Request) simulator.Reply {
		var body struct{ IdempotencyKey string }
		json.Unmarshal(r.Body, &body)
		mu.Lock()
		defer mu.Unlock()
		first := !seen[body.IdempotencyKey]
		seen[body.IdempotencyKey] = true
		if first && lostReply(body.IdempotencyKey) {
			// The provider creates the payment; its reply never arrives.
			return simulator.Reply{Fault: simulator.Reset}
		}
		return simulator.Reply{}
	})
	in := start(t, with(sandboxEnv(p),
		"PAYMENTS_DATABASE_URL", db,
		"PAYMENTS_UPSTREAM_MAX_ATTEMPTS", "1",
		// Time enough for a claim to commit with 180 callers on 4 server
		// sessions, on a busy machine, before paymentsd would refuse to
		// send; the lost replies are settled after the quiet period.
		"PAYMENTS_UPSTREAM_TIMEOUT", "5s",
		"PAYMENTS_PROVIDER_QUIET_PERIOD", "5s",
		"PAYMENTS_WEBHOOK_ADDR", "127.0.0.1:0",
		"PAYMENTS_SANDBOX_WEBHOOK_TOKEN", webhookToken,
	))

	done := make(chan struct{})
	var wg, lookers sync.WaitGroup
	for i := range lookups {
		lookers.Add(1)
		go func() {
			defer lookers.Done()
			for n := 0; ; n++ {
				select {
				case <-done:
					return
				default:
				}
				key := payKey((i + n) % payments)
				_, err := in.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
				if c := status.Code(err); c != codes.OK && c != codes.NotFound {
					t.Errorf("GetMultiCardPayment(%s) = %v, want OK or NotFound", key, err)
					return
				}
			}
		}()
	}
	hookURL := "http://" + in.webhookAddr + "/webhooks/" + webhookToken
	for i := range events {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, reply := deliver(t, in.http, hookURL, "application/json", fmt.Appendf(nil, `{"event":%d}`, i)); code != http.StatusOK {
				t.Errorf("webhook delivery %d = %d %s, want 200", i, code, reply)
			}
		}()
	}
	var unknown []string
	var unknownMu sync.Mutex
	for i := range payments {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := payKey(i)
			_, err := in.client.CreateMultiCardPayment(t.Context(), validRequest(key))
			if lostReply(key) {
				st := status.Convert(err)
				if st.Code() != codes.Unavailable {
					t.Errorf("CreateMultiCardPayment(%s), its reply lost = %v, want Unavailable", key, err)
					return
				}
				checkReason(t, st, "PAYMENT_OUTCOME_UNKNOWN")
				unknownMu.Lock()
				unknown = append(unknown, key)
				unknownMu.Unlock()
				return
			}
			if err != nil {
				t.Errorf("CreateMultiCardPayment(%s) = %v, want OK", key, err)
			}
		}()
	}
	wg.Wait()
	close(done)
	lookers.Wait()
	if len(unknown) != lost {
		t.Fatalf("%d payments answered PAYMENT_OUTCOME_UNKNOWN, want the %d whose reply was lost", len(unknown), lost)
	}

	// Settlement claims the records in doubt through the pooler, re-sends
	// them and records the provider's answer.
	for _, key := range unknown {
		waitForState(t, in, key, paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED, 60*time.Second)
	}
	if p.Created() != payments {
		t.Errorf("provider created %d payments, want %d", p.Created(), payments)
	}
	for key, ks := range p.AllKeyStats() {
		if ks.MaxInFlight > 1 || ks.Charges != 1 {
			t.Errorf("key %s: %d requests at once, %d charges; want at most 1 and exactly 1", key, ks.MaxInFlight, ks.Charges)
		}
	}

	// The events are read back through the pooler as the store reads
	// them: ListProviderEvents needs a reader identity, which this
	// deployment without mTLS has no way to name.
	st, err := store.Open(t.Context(), db, "sandbox", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	list, err := st.ListEvents(t.Context(), store.EventQuery{Limit: 1000})
	if err != nil {
		t.Fatalf("ListEvents through the pooler: %v", err)
	}
	if len(list) != events {
		t.Fatalf("ListEvents() = %d events, want %d", len(list), events)
	}
	for i, e := range list {
		if e.Sequence != int64(i+1) {
			t.Errorf("event %d has sequence %d, want %d: sequences are dense and in order", i, e.Sequence, i+1)
		}
	}
}

func payKey(i int) string { return fmt.Sprintf("k-pooled-%03d", i) }

// lostReply reports whether the provider loses the first reply for key.
func lostReply(key string) bool {
	var i int
	fmt.Sscanf(key, "k-pooled-%d", &i)
	return i%15 == 0
}
