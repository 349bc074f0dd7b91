package main

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/store/storetest"
	"example.com/paymentsd/upstream/upstreamtest"
)

// TestAsyncFailoverLostCommits: an asynchronous failover promotes a
// standby that lacks the last commits, so the database goes back in time
// under paymentsd. Three keys, paid through replica a while replica b
// shares the database, lose what their records said:
//
//   - lost-outcome: its claim reached the standby, its 2xx's commit did
//     not; the record is back in progress, held by a claim of a's process;
//   - lost-record: nothing of it reached the standby; its record is gone;
//   - lost-while-pending: its claim was on the old primary only, and its
//     2xx came back while the primary was dead, so a's outbox was still
//     writing it when the record vanished.
//
// Each caller was told OK. The 2xx is the truth and a still holds it: each
// record must end SUCCEEDED with the reply its caller was told, a retry
// must replay it, and nobody may send any of the keys again.
func TestAsyncFailoverLostCommits(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs a Patroni cluster and fails it over")
	}
	c := storetest.StartPatroniCluster(t, true)
	dbURL := c.Database("lost_commits", c.URL)

	const (
		lostOutcome = "lost-outcome"
		lostRecord  = "lost-record"
		lostPending = "lost-while-pending"
	)
	arrived := map[string]chan struct{}{lostOutcome: make(chan struct{}), lostPending: make(chan struct{})}
	release := map[string]chan struct{}{lostOutcome: make(chan struct{}), lostPending: make(chan struct{})}
	p := fakeProvider(t, "sandbox")
	p.SetScript(func(n int, req upstreamtest.Request) upstreamtest.Reply {
		key := idempotencyKey(req.Body)
		if ch, ok := arrived[key]; ok && p.KeyStats(key).Requests == 1 {
			close(ch)
			return upstreamtest.Reply{Wait: release[key]}
		}
		return upstreamtest.Reply{}
	})
	env := with(sandboxEnv(p), "PAYMENTS_DATABASE_URL", dbURL,
		// Held requests must outlast the cluster's steps: the lease is
		// 20s + 5s.
		"PAYMENTS_UPSTREAM_TIMEOUT", "20s",
		"PAYMENTS_PROVIDER_QUIET_PERIOD", "20s",
		"PAYMENTS_LOG_LEVEL", "warn",
	)
	a := startProcess(t, env)
	b := startProcess(t, env)
	clientA, clientB := grpcClient(t, a), grpcClient(t, b)

	told := map[string]chan answer{lostOutcome: make(chan answer, 1), lostRecord: make(chan answer, 1), lostPending: make(chan answer, 1)}
	pay := func(key string) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		resp, err := clientA.CreateMultiCardPayment(ctx, validRequest(key))
		told[key] <- answer{resp, err}
	}
	waitArrived := func(key string) {
		select {
		case <-arrived[key]:
		case <-time.After(time.Minute):
			t.Fatalf("%s's request never reached the provider", key)
		}
	}

	// lost-outcome: the claim replicates, then the stream stalls and the
	// 2xx is committed on the old primary only.
	go pay(lostOutcome)
	waitArrived(lostOutcome)
	c.WaitReplicated()
	resume := c.PauseReplication()
	close(release[lostOutcome])
	answers := map[string]answer{lostOutcome: <-told[lostOutcome]}
	// lost-record: claim and outcome on the old primary only.
	go pay(lostRecord)
	answers[lostRecord] = <-told[lostRecord]
	// lost-while-pending: the claim on the old primary only; the 2xx
	// comes back once it is dead.
	go pay(lostPending)
	waitArrived(lostPending)
	c.KillPrimary()
	resume()
	close(release[lostPending])
	c.WaitLeader()
	answers[lostPending] = <-told[lostPending]

	for _, key := range []string{lostOutcome, lostRecord, lostPending} {
		t.Run(key, func(t *testing.T) {
			ans := answers[key]
			if ans.err != nil {
				t.Fatalf("caller = %v (%s), want OK", ans.err, reasonOf(status.Convert(ans.err)))
			}
			rec := waitRecorded(t, clientB, key)
			if rec.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED || string(rec.GetPaymentJson()) != string(ans.resp.GetPaymentJson()) {
				t.Errorf("record = %v with reply %s; want SUCCEEDED with the reply the caller was told (%s)", rec.GetState(), rec.GetPaymentJson(), ans.resp.GetPaymentJson())
			}
			var twoXX int
			for _, at := range rec.GetAttemptHistory() {
				if s := at.GetProviderHttpStatus(); s >= 200 && s < 300 {
					twoXX++
				}
			}
			if twoXX != 1 {
				t.Errorf("attempt history = %v, want one attempt with the 2xx", rec.GetAttemptHistory())
			}
			for name, client := range map[string]paymentsv1.PaymentsServiceClient{"a": clientA, "b": clientB} {
				again, err := client.CreateMultiCardPayment(t.Context(), validRequest(key))
				if err != nil || !again.GetReplayed() || string(again.GetPaymentJson()) != string(ans.resp.GetPaymentJson()) {
					t.Errorf("retry on %s = %v (%s), want a replay of the reply the caller was told", name, err, reasonOf(status.Convert(err)))
				}
			}
			if ks := p.KeyStats(key); ks.Requests != 1 || ks.Charges != 1 {
				t.Errorf("provider saw %d requests and made %d payments for %s; want 1 and 1", ks.Requests, ks.Charges, key)
			}
		})
	}
}

// waitRecorded polls key's record (through client) until it exists and is
// out of flight, for up to two minutes, and returns it.
func waitRecorded(t *testing.T, client paymentsv1.PaymentsServiceClient, key string) *paymentsv1.GetMultiCardPaymentResponse {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		r, err := client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
		if err == nil && r.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_IN_PROGRESS {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("record of %s = %v, %v (%s) two minutes after the failover, want it out of flight", key, r.GetState(), status.Code(err), reasonOf(status.Convert(err)))
		}
		if status.Code(err) != codes.OK && status.Code(err) != codes.NotFound {
			t.Logf("lookup of %s: %v", key, err)
		}
		time.Sleep(100 * time.Millisecond) // polling the record: nothing else tells
	}
}
