package main

import (
	"context"
	"testing"
	"time"

	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/store/storetest"
)

// TestDrainWithStoreFrozen: the database server hangs (SIGSTOP: its
// connections stay open, and nothing it is sent is answered) while
// paymentsd holds a 2xx it has not committed and another call's claim is
// in a transaction, and paymentsd is told to stop. The drain ends, and run
// returns, soon after PAYMENTS_SHUTDOWN_TIMEOUT, having logged the outcome
// it could not record, rather than waiting for the database for ever, to
// be SIGKILLed by Kubernetes with the outcome unlogged.
func TestDrainWithStoreFrozen(t *testing.T) {
	t.Parallel()
	cluster := storetest.StartCluster(t)
	p := fakeProvider(t, "sandbox")
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	p.SetScript(func(n int, _ simulator.Request) simulator.Reply {
		if n == 2 {
			arrived <- struct{}{}
			return simulator.Reply{Wait: release}
		}
		return simulator.Reply{}
	})
	in := start(t, with(sandboxEnv(p), "PAYMENTS_DATABASE_URL", cluster.URL,
		"PAYMENTS_UPSTREAM_TIMEOUT", "2s", "PAYMENTS_SHUTDOWN_TIMEOUT", "2s"))
	if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-before")); err != nil {
		t.Fatalf("payment before the freeze = %v", err)
	}

	// The second request's 2xx comes once the server hangs.
	answered := make(chan error, 2)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := in.client.CreateMultiCardPayment(ctx, validRequest("k-held"))
		answered <- err
	}()
	<-arrived
	thaw := cluster.Freeze()
	close(release)
	// A call whose claim goes into a transaction the server never answers.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := in.client.CreateMultiCardPayment(ctx, validRequest("k-claim"))
		answered <- err
	}()
	<-answered
	<-answered

	stopped := make(chan error, 1)
	go func() { stopped <- in.stop() }()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Errorf("run has not returned 30s after it was told to stop, with the database frozen (PAYMENTS_SHUTDOWN_TIMEOUT 2s)")
		thaw()
		<-stopped
	}
	if n := len(in.logs.lines("paymentsd stopped with a payment's outcome not recorded: the record stays in progress, and settlement sends the key again once its lease and quiet period have passed")); n != 1 {
		t.Errorf("logged %d outcomes not recorded at shutdown, want 1 (k-held's 2xx)", n)
	}
}
