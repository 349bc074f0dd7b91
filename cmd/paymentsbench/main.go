// Command paymentsbench measures what paymentsd costs on top of the payment
// provider it forwards to: throughput, latency, CPU per call, connections
// to the provider, and peak memory with many calls in flight.
//
// From the module root:
//
//	go run ./cmd/paymentsbench          # the full run: about 2 minutes on 2 cores
//	go run ./cmd/paymentsbench -smoke   # every phase, tiny, in seconds (CI)
//	go run ./cmd/paymentsbench -help    # the flags
//
// It builds paymentsd, starts it as a separate process against a fake
// provider that is itself a separate process (this binary, re-executed with
// a hidden -fake-provider mode), and then, at concurrency 1 and 32, drives
// the same payment three ways:
//
//   - direct: straight to the fake provider, the floor paymentsd adds to;
//   - grpc: through paymentsd's gRPC API, with the generated client;
//   - rest: through paymentsd's REST gateway.
//
// direct and rest share one *http.Client, so their ratio is fair. Each
// phase is -rounds rounds, interleaved with the other paths', of a short
// unmeasured warm-up and then a fixed number of calls (-requests-c1,
// -requests-c32), each with its own idempotency key. For each phase it
// reports requests per second, p50 and p99 latency, the CPU time per call
// that paymentsd and the fake provider each used (utime+stime of the whole
// process, from /proc/<pid>/stat, so Linux only), and how many connections
// the fake provider accepted. A last phase starts a fresh
// paymentsd against a fake that delays every reply, puts -rss-inflight gRPC
// calls in flight at once, and reads paymentsd's peak resident set (VmHWM).
//
// It prints a table and the targets it checks, and writes every figure to
// a JSON file (-out). It exits 0 whether or not the targets are met, and
// non-zero if setup failed or any call failed. The load generator,
// paymentsd and the fake provider share the machine's CPUs, which is part
// of what the figures show.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

func main() {
	if err := run(context.Background(), os.Args, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "paymentsbench: %v\n", err)
		os.Exit(1)
	}
}

// The two concurrency levels every path is measured at.
const (
	lowConcurrency  = 1
	highConcurrency = 32
)

// options are the command-line settings of a benchmark run.
type options struct {
	requestsLow  int // measured calls per phase at lowConcurrency
	requestsHigh int // measured calls per phase at highConcurrency
	rounds       int // times each phase is repeated, pooled in the results
	warmup       int // unmeasured calls before each phase
	rssInFlight  int
	rssConns     int
	rssDelay     time.Duration
	out          string
	perfOut      string
	smoke        bool
}

func parseOptions(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("paymentsbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	fs.IntVar(&o.requestsLow, "requests-c1", 3000, "measured calls per round at concurrency 1")
	fs.IntVar(&o.requestsHigh, "requests-c32", 20000, "measured calls per round at concurrency 32")
	fs.IntVar(&o.rounds, "rounds", 10, "rounds of every phase, interleaved; the figures pool them")
	fs.IntVar(&o.warmup, "warmup", 500, "unmeasured warm-up calls before each round of a phase")
	fs.IntVar(&o.rssInFlight, "rss-inflight", 2000, "gRPC calls in flight at once for the peak-RSS phase")
	fs.IntVar(&o.rssConns, "rss-conns", 8, "gRPC connections the peak-RSS calls are spread over")
	fs.DurationVar(&o.rssDelay, "rss-delay", 2*time.Second, "how long the fake provider holds each reply in the peak-RSS phase")
	fs.StringVar(&o.out, "out", "bench-results/bench.json", "where to write the results as JSON")
	fs.StringVar(&o.perfOut, "perf", "", "if set, record a perf profile of paymentsd into this file during the first c=32 gRPC round (perturbing it)")
	fs.BoolVar(&o.smoke, "smoke", false, "tiny run of every phase, for CI; writes bench-results/smoke.json unless -out is given")
	if err := fs.Parse(args[1:]); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if o.smoke {
		o.requestsLow, o.requestsHigh, o.rounds, o.warmup = 50, 320, 2, 20
		o.rssInFlight, o.rssDelay = 100, 200*time.Millisecond
		outSet := false
		fs.Visit(func(f *flag.Flag) { outSet = outSet || f.Name == "out" })
		if !outSet {
			o.out = "bench-results/smoke.json"
		}
	}
	if o.requestsLow < 1 || o.requestsHigh < 1 || o.rounds < 1 || o.warmup < 0 || o.rssInFlight < 1 || o.rssConns < 1 {
		return nil, errors.New("request counts, -rounds and -rss-conns must be positive, -warmup not negative")
	}
	return o, nil
}

// run is the whole program. With -fake-provider first it is the fake
// provider; otherwise it is the benchmark.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	if len(args) > 1 && args[1] == fakeProviderFlag {
		return runFakeProvider(ctx, args[2:], stderr)
	}
	opts, err := parseOptions(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	res, err := benchmark(ctx, opts, stderr)
	if err != nil {
		return err
	}
	res.Command = args
	res.ParentCommand = parentCommand()

	printReport(stdout, res)
	if err := writeJSON(opts.out, res); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nresults: %s\n", opts.out)
	if n := res.failedCalls(); n > 0 {
		return fmt.Errorf("%d calls failed (see the errors column and first_error in %s)", n, opts.out)
	}
	return nil
}

// benchmark builds paymentsd, runs every phase, and checks the targets.
func benchmark(ctx context.Context, opts *options, logw io.Writer) (*results, error) {
	tmp, err := os.MkdirTemp("", "paymentsbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	env := &environment{providerKey: "bench_" + randomHex(12)}
	fmt.Fprintln(logw, "building paymentsd…")
	if env.paymentsd, err = buildPaymentsd(ctx, tmp, logw); err != nil {
		return nil, err
	}
	if env.self, err = os.Executable(); err != nil {
		return nil, err
	}
	tick := clockTick(ctx)
	res := &results{
		Date:        time.Now().UTC(),
		GoVersion:   runtime.Version(),
		GOOS:        runtime.GOOS,
		GOARCH:      runtime.GOARCH,
		GOMAXPROCS:  runtime.GOMAXPROCS(0),
		NumCPU:      runtime.NumCPU(),
		ClockTickHz: int(time.Second / tick),
		Smoke:       opts.smoke,
		Rounds:      opts.rounds,
		Warmup:      opts.warmup,
	}

	if res.Phases, err = env.measurePaths(ctx, opts, tick, logw); err != nil {
		return nil, err
	}
	fmt.Fprintf(logw, "peak RSS: %d gRPC calls in flight, replies delayed %v…\n", opts.rssInFlight, opts.rssDelay)
	if res.PeakRSS, err = env.peakRSS(ctx, opts.rssInFlight, opts.rssConns, opts.rssDelay); err != nil {
		return nil, fmt.Errorf("peak RSS: %w", err)
	}
	res.Checks = checkTargets(res)
	return res, nil
}

// measurePaths starts a fake provider and paymentsd, measures each path at
// each concurrency level, and stops them.
func (e *environment) measurePaths(ctx context.Context, opts *options, tick time.Duration, logw io.Writer) ([]phaseResult, error) {
	fake, err := e.startFake(ctx, "fake-provider", 0)
	if err != nil {
		return nil, err
	}
	defer fake.stop()
	svc, err := e.startPaymentsd(ctx, "paymentsd", fake)
	if err != nil {
		return nil, err
	}
	defer svc.stop()

	conn, err := grpc.NewClient(svc.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("gRPC client: %w", err)
	}
	defer conn.Close()
	httpClient := newLoadClient()
	defer httpClient.CloseIdleConnections()

	paths := []struct {
		name string
		call caller
	}{
		{"direct", postPayment(httpClient, fake.paymentURL(), e.providerKey)},
		{"grpc", grpcPayment(paymentsv1.NewPaymentsServiceClient(conn))},
		{"rest", postPayment(httpClient, "http://"+svc.httpAddr+"/v1/multi-card-payments", "")},
	}
	levels := []struct{ concurrency, requests int }{
		{lowConcurrency, opts.requestsLow},
		{highConcurrency, opts.requestsHigh},
	}

	var phases []phaseResult
	runID := randomHex(4)
	m := &meter{svc: svc, fake: fake, tick: tick, scrape: newScrapeClient()}
	for _, l := range levels {
		// Rounds interleave the paths, so that whatever else the machine
		// does falls on all of them alike.
		samples := make([][]sample, len(paths))
		for round := range opts.rounds {
			for i, p := range paths {
				fmt.Fprintf(logw, "round %d/%d: %s c=%d, %d calls…\n", round+1, opts.rounds, p.name, l.concurrency, l.requests)
				var prof *profiler
				if opts.perfOut != "" && p.name == "grpc" && l.concurrency == highConcurrency && round == 0 {
					prof = &profiler{pid: svc.pid(), out: opts.perfOut, log: logw}
				}
				keyPrefix := fmt.Sprintf("bench-%s-%s-c%d-r%d-", runID, p.name, l.concurrency, round)
				s, err := m.round(ctx, p.call, keyPrefix, l.concurrency, l.requests, opts.warmup, prof)
				if err != nil {
					return nil, fmt.Errorf("%s c=%d: %w", p.name, l.concurrency, err)
				}
				samples[i] = append(samples[i], s)
			}
		}
		for i, p := range paths {
			phases = append(phases, summarize(p.name, l.concurrency, samples[i]))
		}
	}
	return phases, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// parentCommand is the command line of the process that started this one,
// such as "go run ./cmd/paymentsbench -smoke", or "" if it cannot be read.
func parentCommand() string {
	b, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(os.Getppid()), "cmdline"))
	if err != nil {
		return ""
	}
	return strings.Join(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), " ")
}
