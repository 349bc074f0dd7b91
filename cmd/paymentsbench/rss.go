package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"

	"example.com/paymentsd/internal/proc"
)

// rssResult is the peak-memory phase of one process.
type rssResult struct {
	// Path is the path whose process was measured: "grpc/sqlite",
	// "record-grpc/sqlite", "grpc-floor", "rest/sqlite",
	// "record-proxy/sqlite" or "proxy-floor"; Floor the path it is
	// compared with (paymentsd's record floor, a record floor's floor).
	Path          string `json:"path"`
	Floor         string `json:"floor,omitempty"`
	InFlight      int    `json:"in_flight"`
	Conns         int    `json:"client_connections"`
	ProviderDelay string `json:"provider_delay"`
	Succeeded     int    `json:"succeeded"`
	Failed        int    `json:"failed"`
	FirstError    string `json:"first_error,omitempty"`
	// Seconds is from the first call to the last reply.
	Seconds float64 `json:"seconds"`
	// The process's resident set when idle, at its peak (VmHWM) over the
	// whole process lifetime, and once every call had its reply.
	IdleRSSMiB  float64 `json:"idle_rss_mib"`
	PeakRSSMiB  float64 `json:"peak_rss_mib"`
	AfterRSSMiB float64 `json:"after_rss_mib"`
	// ProviderMaxInFlight is how many requests the fake provider held at
	// once: InFlight if every call was truly in flight together.
	ProviderMaxInFlight int64 `json:"provider_max_in_flight"`
	ProviderConnections int64 `json:"provider_connections"`
}

// peakRSS measures, each in a fresh process against a fresh fake provider
// that holds every reply for opts.rssDelay, paymentsd (default store) over
// gRPC and over REST, and the two floors, with opts.rssInFlight calls in
// flight at once.
func (e *environment) peakRSS(ctx context.Context, opts *options, logw io.Writer) ([]rssResult, error) {
	var out []rssResult
	type target struct{ path, floor string }
	targets := []target{
		{"grpc-floor", ""}, {"record-grpc/sqlite", "grpc-floor"}, {"grpc/sqlite", "record-grpc/sqlite"},
		{"proxy-floor", ""}, {"record-proxy/sqlite", "proxy-floor"}, {"rest/sqlite", "record-proxy/sqlite"},
	}
	if e.baseline != "" {
		targets = append(targets, target{"grpc/sqlite" + baselineSuffix, "record-grpc/sqlite"}, target{"rest/sqlite" + baselineSuffix, "record-proxy/sqlite"})
	}
	if len(opts.only) > 0 {
		targets = slices.DeleteFunc(targets, func(t target) bool { return !opts.only[strings.TrimSuffix(t.path, baselineSuffix)] })
	}
	for _, target := range targets {
		fmt.Fprintf(logw, "peak RSS: %s, %d calls in flight, replies delayed %v…\n", target.path, opts.rssInFlight, opts.rssDelay)
		r, err := e.peakRSSOf(ctx, target.path, opts)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", target.path, err)
		}
		r.Floor = target.floor
		out = append(out, r)
	}
	return out, nil
}

// peakRSSOf starts a fresh process for the path, puts n calls in flight at
// once, and reads its peak resident set once all are done.
func (e *environment) peakRSSOf(ctx context.Context, pathName string, opts *options) (rssResult, error) {
	n, delay := opts.rssInFlight, opts.rssDelay
	r := rssResult{Path: pathName, InFlight: n, ProviderDelay: delay.String()}
	fake, err := e.startFake(ctx, "fake-provider-slow", delay)
	if err != nil {
		return r, err
	}
	defer fake.Stop()
	var (
		proc     *proc.Process
		grpcAddr string
		httpURL  string
	)
	switch pathName {
	case "grpc-floor", "proxy-floor", "record-grpc/sqlite", "record-proxy/sqlite":
		mode, records := grpcFloorFlag, ""
		if strings.Contains(pathName, "proxy") {
			mode = proxyFloorFlag
		}
		if strings.HasPrefix(pathName, "record-") {
			records = storeSQLite
		}
		f, err := e.startFloor(ctx, strings.ReplaceAll(pathName, "/", "-")+"-rss", mode, fake, records)
		if err != nil {
			return r, err
		}
		defer f.Stop()
		proc, grpcAddr, httpURL = f.Process, f.addr, "http://"+f.addr+"/v1/multi-card-payments"
	default:
		// Every call must be in flight at once: the caps on calls and
		// connections are raised above n for this process.
		limit := strconv.Itoa(2*n + 100)
		bin := e.paymentsd
		if strings.HasSuffix(pathName, baselineSuffix) {
			bin = e.baseline
		}
		name := strings.NewReplacer("/", "-", "@", "-").Replace(pathName)
		svc, err := e.startPaymentsd(ctx, "paymentsd-rss-"+name, bin, storeSQLite, fake,
			"PAYMENTS_MAX_IN_FLIGHT="+limit, "PAYMENTS_MAX_CONNECTIONS="+limit)
		if err != nil {
			return r, err
		}
		defer svc.Stop()
		proc, grpcAddr, httpURL = svc.Process, svc.grpcAddr, "http://"+svc.httpAddr+"/v1/multi-card-payments"
	}

	var calls []caller
	if strings.Contains(pathName, "grpc") {
		r.Conns = opts.rssConns
		for range opts.rssConns {
			// Each NewClient is a connection of its own.
			cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return r, fmt.Errorf("gRPC client: %w", err)
			}
			defer cc.Close()
			calls = append(calls, grpcPayment(paymentsv1.NewPaymentsServiceClient(cc)))
		}
	} else {
		// HTTP/1.1: a connection per call in flight.
		r.Conns = n
		client := newLoadClient()
		defer client.CloseIdleConnections()
		calls = append(calls, postPayment(client, httpURL, ""))
	}

	idle, _, err := memory(proc.Pid())
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
			if opts.rssNoDeadline {
				cctx, cancel = context.WithCancel(ctx)
			}
			defer cancel()
			err := calls[i%len(calls)](cctx, keyPrefix+strconv.Itoa(i))
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
	if err := errors.Join(proc.CheckRunning(), fake.CheckRunning()); err != nil {
		return r, err
	}

	after, peak, err := memory(proc.Pid())
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
