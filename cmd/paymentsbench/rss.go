package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// rssResult is the peak-memory phase.
type rssResult struct {
	InFlight      int    `json:"in_flight"`
	GRPCConns     int    `json:"grpc_connections"`
	ProviderDelay string `json:"provider_delay"`
	Succeeded     int    `json:"succeeded"`
	Failed        int    `json:"failed"`
	FirstError    string `json:"first_error,omitempty"`
	// Seconds is from the first call to the last reply.
	Seconds float64 `json:"seconds"`
	// paymentsd's resident set when idle, at its peak (VmHWM) over the
	// whole process lifetime, and once every call had its reply.
	IdleRSSMiB  float64 `json:"idle_rss_mib"`
	PeakRSSMiB  float64 `json:"peak_rss_mib"`
	AfterRSSMiB float64 `json:"after_rss_mib"`
	// ProviderMaxInFlight is how many requests the fake provider held at
	// once: InFlight if every call was truly in flight together.
	ProviderMaxInFlight int64 `json:"provider_max_in_flight"`
	ProviderConnections int64 `json:"provider_connections"`
}

// peakRSS starts a fresh paymentsd against a fake provider that holds every
// reply for delay, puts n gRPC calls in flight at once over conns
// connections, and reads paymentsd's peak resident set once all are done.
func (e *environment) peakRSS(ctx context.Context, n, conns int, delay time.Duration) (rssResult, error) {
	r := rssResult{InFlight: n, GRPCConns: conns, ProviderDelay: delay.String()}
	fake, err := e.startFake(ctx, "fake-provider-slow", delay)
	if err != nil {
		return r, err
	}
	defer fake.stop()
	svc, err := e.startPaymentsd(ctx, "paymentsd-rss", fake)
	if err != nil {
		return r, err
	}
	defer svc.stop()

	clients := make([]paymentsv1.PaymentsServiceClient, conns)
	for i := range clients {
		// Each NewClient is a connection of its own.
		cc, err := grpc.NewClient(svc.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return r, fmt.Errorf("gRPC client: %w", err)
		}
		defer cc.Close()
		clients[i] = paymentsv1.NewPaymentsServiceClient(cc)
	}

	idle, _, err := memory(svc.pid())
	if err != nil {
		return r, err
	}

	var (
		wg        sync.WaitGroup
		succeeded atomic.Int64
		firstErr  sync.Once
		gate      = make(chan struct{})
		keyPrefix = "bench-rss-" + randomHex(4) + "-"
	)
	for i := range n {
		wg.Go(func() {
			<-gate
			cctx, cancel := context.WithTimeout(ctx, delay+time.Minute)
			defer cancel()
			err := grpcPayment(clients[i%conns])(cctx, keyPrefix+strconv.Itoa(i))
			if err != nil {
				firstErr.Do(func() { r.FirstError = err.Error() })
				return
			}
			succeeded.Add(1)
		})
	}
	start := time.Now()
	close(gate)
	wg.Wait()
	r.Seconds = time.Since(start).Seconds()
	if err := ctx.Err(); err != nil {
		return r, err
	}
	if err := errors.Join(svc.checkRunning(), fake.checkRunning()); err != nil {
		return r, err
	}

	after, peak, err := memory(svc.pid())
	if err != nil {
		return r, err
	}
	stats, err := fake.readStats(ctx, newScrapeClient())
	if err != nil {
		return r, err
	}
	r.Succeeded = int(succeeded.Load())
	r.Failed = n - r.Succeeded
	r.IdleRSSMiB, r.PeakRSSMiB, r.AfterRSSMiB = mib(idle), mib(peak), mib(after)
	r.ProviderMaxInFlight = stats.MaxInFlight
	r.ProviderConnections = stats.Connections
	return r, nil
}

func mib(kib int64) float64 { return float64(kib) / 1024 }
