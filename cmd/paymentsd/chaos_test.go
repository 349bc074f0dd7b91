package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/store/storetest"
)

// TestChaos is issue 23's chaos run, opt-in (it takes minutes): two
// replicas on one PostgreSQL server of its own, against the honest fake
// provider (it keeps working on a request whose client has gone, and
// learns a key only when a request with it completes, so two requests at
// once charge twice), callers with short, random deadlines retrying as
// paymentsd's answers tell them; meanwhile replicas are killed with
// SIGKILL and restarted, and the database is killed and restarted 4–6 s
// later, until PAYMENTSD_CHAOS_KEYS keys (at least 500 for the issue) have
// an answer. Then, per key: no two requests at the provider at once, no
// request after a 2xx the provider sent, no payment for a key a caller was
// told PAYMENT_NOT_CREATED, exactly one for a key told OK.
//
//	PAYMENTSD_CHAOS_KEYS=500 go test -run TestChaos -v ./cmd/paymentsd/
func TestChaos(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("PAYMENTSD_CHAOS_KEYS"))
	if n <= 0 {
		t.Skip("set PAYMENTSD_CHAOS_KEYS (500 for the issue's run) to run the chaos test: it kills replicas and the database for minutes")
	}
	db := storetest.StartCluster(t)
	p := honestProvider(t, randomDelay(600*time.Millisecond))
	env := with(sandboxEnv(p),
		"PAYMENTS_DATABASE_URL", db.URL,
		"PAYMENTS_UPSTREAM_TIMEOUT", "1s",
		"PAYMENTS_PROVIDER_QUIET_PERIOD", "2s",
		"PAYMENTS_SETTLEMENT_WINDOW", "30m",
	)
	var mu sync.Mutex
	var replicas [2]*process
	clients := [2]paymentsv1.PaymentsServiceClient{}
	for i := range replicas {
		replicas[i] = startProcess(t, env)
		clients[i] = grpcClient(t, replicas[i])
	}
	client := func(i int) paymentsv1.PaymentsServiceClient {
		mu.Lock()
		defer mu.Unlock()
		return clients[i%2]
	}

	a := newAnswers()
	var next, done atomic.Int64
	var unsettled atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var workers sync.WaitGroup
	for w := range 8 {
		workers.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				key := fmt.Sprintf("chaos-%d", i)
				started := time.Now()
				if !a.callChaos(ctx, t, client, w, key) {
					unsettled.Add(1)
				}
				done.Add(1)
				// A steady stream of new keys, so that the chaos meets
				// many of them mid-flight.
				time.Sleep(time.Until(started.Add(500 * time.Millisecond)))
			}
		})
	}

	var kills, dbKills int
	var killed []string
	finished := make(chan struct{})
	go func() { workers.Wait(); close(finished) }()
chaos:
	for {
		select {
		case <-finished:
			break chaos
		case <-time.After(time.Duration(1000+rand.IntN(2000)) * time.Millisecond): // chaos comes at random
		}
		switch r := rand.IntN(10); {
		case r < 5:
			i := rand.IntN(2)
			mu.Lock()
			old := replicas[i]
			mu.Unlock()
			old.cmd.Process.Kill()
			old.cmd.Wait()
			killed = append(killed, fmt.Sprintf("replica %s at %s", replicaOf(old), time.Now().Format(time.StampMicro)))
			kills++
			time.Sleep(time.Duration(500+rand.IntN(1500)) * time.Millisecond) // down for a while
			np := startProcess(t, env)
			nc := grpcClient(t, np)
			mu.Lock()
			replicas[i], clients[i] = np, nc
			mu.Unlock()
		case r < 9:
			db.Kill()
			killed = append(killed, "the database at "+time.Now().Format(time.StampMicro))
			dbKills++
			time.Sleep(time.Duration(4000+rand.IntN(2000)) * time.Millisecond) // the outage
			db.Start()
		}
		t.Logf("%d keys answered; %d replica kills, %d database kills", done.Load(), kills, dbKills)
	}
	if u := unsettled.Load(); u > 0 {
		t.Errorf("%d keys had no answer", u)
	}
	t.Logf("%d keys, %d replica kills, %d database kills; answers: %s", n, kills, dbKills, a.String())
	checkProvider(t, p, a)
	var again []string
	for key, ks := range p.AllKeyStats() {
		if ks.AfterDelivered > 0 {
			again = append(again, fmt.Sprintf("%s (%d after its 2xx)", key, ks.AfterDelivered))
		}
	}
	if len(again) > 0 {
		t.Errorf("%d keys were sent again after the provider's 2xx: %v", len(again), again)
		for key, ks := range p.AllKeyStats() {
			if ks.AfterDelivered == 0 {
				continue
			}
			rec, err := client(0).GetMultiCardPayment(context.Background(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
			if err != nil {
				t.Logf("%s: %v", key, err)
				continue
			}
			for _, at := range rec.GetAttemptHistory() {
				t.Logf("%s attempt %d: %v by %s, %v → %v, provider %d, %v, abandoned %v: %s", key, at.GetNumber(), at.GetKind(), at.GetReplica(),
					at.GetStartTime().AsTime().Format(time.StampMicro), at.GetEndTime().AsTime().Format(time.StampMicro),
					at.GetProviderHttpStatus(), at.GetOutcome(), at.GetAbandoned(), at.GetError())
			}
		}
		for _, k := range killed {
			t.Logf("killed %s", k)
		}
	}
}

// callChaos is callUntilSettled against whichever replicas are up,
// starting with worker w's: until OK or PAYMENT_NOT_CREATED.
func (a *answers) callChaos(ctx context.Context, t *testing.T, client func(int) paymentsv1.PaymentsServiceClient, w int, key string) bool {
	for try := w; ctx.Err() == nil; try++ {
		cctx, cancel := context.WithTimeout(ctx, time.Duration(200+rand.IntN(2800))*time.Millisecond)
		resp, err := client(try).CreateMultiCardPayment(cctx, validRequest(key))
		cancel()
		st := status.Convert(err)
		reason := reasonOf(st)
		if err == nil {
			reason = "OK"
		} else if reason == "" {
			reason = "no reason: " + st.Code().String()
		}
		a.mu.Lock()
		a.byReason[reason]++
		switch reason {
		case "OK":
			a.ok[key] = true
			if !resp.GetReplayed() {
				a.paid[key]++
			}
		case "PAYMENT_NOT_CREATED":
			a.notCreated[key] = true
		}
		a.mu.Unlock()
		switch reason {
		case "OK", "PAYMENT_NOT_CREATED":
			return true
		case "IDEMPOTENCY_KEY_REUSED", "IDEMPOTENCY_KEY_EXPIRED":
			t.Errorf("%s: %v (%s): the test never reuses a key", key, st.Code(), reason)
			return true
		}
		wait := min(max(retryDelay(st), 20*time.Millisecond), 5*time.Second)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	return false
}

// replicaOf is the process's name as its lease owners and attempts name
// it, from its "serving" log line.
func replicaOf(p *process) string {
	for _, line := range p.logs.lines("serving") {
		if r, ok := line["replica"].(string); ok {
			return r
		}
	}
	return fmt.Sprint(p.cmd.Process.Pid)
}
