package main

import (
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"example.com/paymentsd/internal/inbox"
)

// BenchmarkInboxWorstCase is TestInboxWorstCase measured: with every watch
// held by a caller that never reads and every delivery's share of the
// byte budget held by a body that never finishes, each op is a round of
// lists through the whole inbox at the largest page, 4 gRPC and 4 REST
// clients at once. It reports paymentsd's peak resident set (VmHWM), to
// compare with the pod's 256 MiB limit, its idle RSS with the inbox full,
// and its heap in use at the end.
//
//	go test -run '^$' -bench InboxWorstCase -benchtime 3x ./cmd/paymentsd/
func BenchmarkInboxWorstCase(b *testing.B) {
	p := startFullInbox(b)
	idle, _ := p.memory(b)
	holdInboxBudget(b, p)
	for b.Loop() {
		for _, err := range listInbox(b, p, 1) {
			b.Error(err)
		}
	}
	p.pays(b, "during-the-inbox-worst-case")
	_, peak := p.memory(b)
	heap, _ := sample(p.families(b), "go_memstats_heap_inuse_bytes", nil)
	b.Logf("GOMEMLIMIT=%s, as deploy/ sets it; the pod's memory limit is 256 MiB", deployedGoMemLimit(b))
	b.ReportMetric(mib(idle), "idle-MiB")
	b.ReportMetric(mib(peak), "peak-MiB")
	b.ReportMetric(heap/(1<<20), "heap-inuse-MiB")
}

// BenchmarkInboxTokenlessFlood is TestInboxFinding4TokenlessFlood
// measured: each op is one delivery, tried once, while strangers flood
// the port without the token. It reports the share of deliveries that did
// not get through at the first try (failed-%), which the provider's
// retries make up, and the slowest that did.
//
//	go test -run '^$' -bench InboxTokenlessFlood -benchtime 50x ./cmd/paymentsd/
func BenchmarkInboxTokenlessFlood(b *testing.B) {
	for _, c := range []struct {
		name   string
		client func(b *testing.B) *http.Client
	}{
		{"kept-alive connection", func(b *testing.B) *http.Client { return newClient(b) }},
		{"new connection each", func(*testing.B) *http.Client {
			return &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			p := startTokenlessFlood(b)
			client := c.client(b)
			var failed, i int
			var slowest time.Duration
			for b.Loop() {
				i++
				start := time.Now()
				if deliverOnce(client, p, i) != nil {
					failed++
					continue
				}
				slowest = max(slowest, time.Since(start))
			}
			b.ReportMetric(100*float64(failed)/float64(i), "failed-%")
			b.ReportMetric(float64(slowest.Microseconds())/1000, "slowest-ms")
		})
	}
}

// BenchmarkPaymentsBesideAFlood is TestInboxFinding5PaymentsBesideAFlood
// measured: each op is one gRPC payment, on a quiet paymentsd and beside
// a flood of deliveries (deliverySenders senders of the default largest
// body). It reports the payments' median (p50-ms), and how many
// deliveries a second the flood got through.
//
//	go test -run '^$' -bench PaymentsBesideAFlood -benchtime 200x ./cmd/paymentsd/
func BenchmarkPaymentsBesideAFlood(b *testing.B) {
	for _, flooded := range []bool{false, true} {
		name := "quiet"
		if flooded {
			name = fmt.Sprintf("beside %d senders of %d KiB", deliverySenders, inbox.DefaultMaxBytes>>10)
		}
		b.Run(name, func(b *testing.B) {
			p := startProcess(b, hookEnv(b))
			payments := paymentsClient(b, p)
			var delivered *atomic.Int64
			if flooded {
				delivered = startDeliveryFlood(b, p)
			}
			var took []time.Duration
			var deliveredBefore int64
			if delivered != nil {
				deliveredBefore = delivered.Load()
			}
			for b.Loop() {
				start := time.Now()
				if _, err := payments.CreateMultiCardPayment(b.Context(), validRequest(fmt.Sprintf("%s-%d", name, len(took)))); err != nil {
					b.Fatalf("payment %d: %v", len(took), err)
				}
				took = append(took, time.Since(start))
			}
			if delivered != nil {
				b.ReportMetric(float64(delivered.Load()-deliveredBefore)/b.Elapsed().Seconds(), "deliveries/s")
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
		})
	}
}
