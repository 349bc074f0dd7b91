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
// It builds paymentsd and starts, each as a separate process on loopback
// against one fake provider (this binary re-executed with a hidden
// -fake-provider mode):
//
//   - the floors, the least a Go service can do on each path (this binary
//     again, with a hidden flag): an httputil.ReverseProxy that adds
//     x-api-key (proxy-floor, the REST floor), and a bare grpc-go server
//     whose handler makes one net/http POST and decodes the reply
//     (grpc-floor, the gRPC floor);
//   - the record floors, the least that any service with durable records
//     can do: each floor again, with one INSERT committed before the
//     request is forwarded and one UPDATE committed after the answer,
//     before it is passed on (as paymentsd records an outcome before it
//     answers), through the store's own group commit
//     (store.Store.FloorExec), with
//     paymentsd's driver and pragmas, in a database of its own per store
//     (record-proxy/sqlite, record-grpc/sqlite, and the same on
//     PostgreSQL); paymentsd's targets are ratios to these;
//   - paymentsd with each record store, each with a database of its own:
//     SQLite in a temp dir (the default store), PostgreSQL (a fresh
//     database on -postgres, by default $PAYMENTS_TEST_POSTGRES_URL,
//     dropped at the end; skipped without one), and SQLite in memory
//     (gRPC only, to price the records' durability).
//
// Then, at concurrency 1 and 32, it drives the same payment along every
// path: direct to the fake, through each floor, and through each paymentsd
// over gRPC and REST. direct, proxy-floor and REST share one *http.Client,
// and the gRPC paths one kind of gRPC client, so their ratios are fair. Each
// phase is -rounds rounds, interleaved with the other paths', of a short
// unmeasured warm-up and then a fixed number of calls (-requests-c1,
// -requests-c32). Every call has an idempotency key never used before (a
// reused key would be a replay, far cheaper than a payment; replays are
// counted and fail the run). For each phase it reports requests per
// second, p50 and p99 latency, the CPU time per call of the path's own
// process and of the fake (utime+stime of the whole process, from
// /proc/<pid>/stat, so Linux only), each as a ratio to its floor's,
// paymentsd's record store commits per call (from its /metrics), and how
// many connections the fake accepted. It times fsyncs of 4 KiB in the temp
// dir, the durable-write floor. Last, it starts a fresh process of each
// floor and of paymentsd (gRPC and REST), puts -rss-inflight calls in
// flight at once to a fake that delays every reply, and reads each
// process's peak resident set (VmHWM).
//
// paymentsd and the record floors use the SQLite driver this binary was
// built with: go run -tags sqlite_ncruces ./cmd/paymentsbench measures
// another (see internal/store/driver_*.go).
//
// It prints a table and the targets it checks, and writes every figure to
// a JSON file (-out). It exits 0 whether or not the targets are met, and
// non-zero if setup failed or any call failed. The load generator,
// the services and the fake provider share the machine's CPUs, which is
// part of what the figures show.
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
	"slices"
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
	// rssNoDeadline: the peak-RSS phase's calls set no deadline.
	rssNoDeadline bool
	fsyncs        int
	postgres      string // admin URL of a PostgreSQL server, or ""
	out           string
	pprofOut      string // where to write CPU profiles, or ""
	pprofPath     string // which path's first c=32 round to profile
	gogc          string // GOGC for paymentsd only, or "" for its default
	smoke         bool
	// baseline is a git revision whose paymentsd is measured beside this
	// tree's, on every paymentsd path, in the same rounds (see
	// baselineSuffix); "" measures this tree's alone.
	baseline string
	// only, if not empty, names the paths measured (with direct, and each
	// one's baseline); the others' processes start but take no calls.
	only map[string]bool
	// rss: measure peak RSS.
	rss bool
}

func parseOptions(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("paymentsbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	fs.IntVar(&o.requestsLow, "requests-c1", 3000, "measured calls per round at concurrency 1")
	fs.IntVar(&o.requestsHigh, "requests-c32", 20000, "measured calls per round at concurrency 32")
	fs.IntVar(&o.rounds, "rounds", 6, "rounds of every phase, interleaved; the figures pool them")
	fs.IntVar(&o.warmup, "warmup", 500, "unmeasured warm-up calls before each round of a phase")
	fs.IntVar(&o.rssInFlight, "rss-inflight", 2000, "gRPC calls in flight at once for the peak-RSS phase")
	fs.IntVar(&o.rssConns, "rss-conns", 32, "gRPC connections the peak-RSS calls are spread over (paymentsd allows 100 streams on each)")
	fs.BoolVar(&o.rssNoDeadline, "rss-no-deadline", false, "the peak-RSS phase's calls set no deadline (a gRPC call without one is sent on its handler's goroutine, one goroutine fewer per call)")
	fs.DurationVar(&o.rssDelay, "rss-delay", 2*time.Second, "how long the fake provider holds each reply in the peak-RSS phase")
	fs.IntVar(&o.fsyncs, "fsyncs", 300, "fsyncs of 4 KiB timed for the durable-write floor")
	fs.StringVar(&o.postgres, "postgres", os.Getenv("PAYMENTS_TEST_POSTGRES_URL"), "admin URL of a PostgreSQL server to measure paymentsd with (a fresh database per process, dropped after); empty skips it")
	fs.StringVar(&o.out, "out", "bench-results/bench.json", "where to write the results as JSON")
	fs.StringVar(&o.pprofOut, "pprof", "", "if set, build paymentsd with the benchprofile tag and write a CPU profile of the first c=32 round of -pprof-path into this file (perturbing it)")
	fs.StringVar(&o.pprofPath, "pprof-path", "grpc/sqlite", "the path -pprof profiles")
	fs.StringVar(&o.gogc, "paymentsd-gogc", "", "if set, GOGC for the paymentsd processes only (for A/B runs); the floors keep the Go default")
	fs.BoolVar(&o.smoke, "smoke", false, "tiny run of every phase, for CI; writes bench-results/smoke.json unless -out is given")
	fs.StringVar(&o.baseline, "baseline", "", "a git revision (such as main or HEAD~1) whose paymentsd is built and measured beside this tree's on every paymentsd path, interleaved in the same rounds, as PATH"+baselineSuffix+": a before/after comparison from one run")
	only := fs.String("only", "", "comma-separated paths to measure (such as grpc/sqlite,rest/sqlite,grpc/memory), with direct and, with -baseline, their baselines; empty measures every path")
	fs.BoolVar(&o.rss, "rss", true, "measure peak RSS with -rss-inflight calls in flight (of the paths measured)")
	if err := fs.Parse(args[1:]); err != nil {
		return nil, err
	}
	if *only != "" {
		o.only = map[string]bool{}
		for _, p := range strings.Split(*only, ",") {
			o.only[strings.TrimSpace(p)] = true
		}
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if o.smoke {
		o.requestsLow, o.requestsHigh, o.rounds, o.warmup = 50, 320, 2, 20
		o.rssInFlight, o.rssDelay, o.fsyncs = 100, 200*time.Millisecond, 20
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

	if len(args) > 1 {
		switch args[1] {
		case fakeProviderFlag:
			return runFakeProvider(ctx, args[2:], stderr)
		case proxyFloorFlag, grpcFloorFlag:
			return runFloor(ctx, args[1], args[2:], stderr)
		}
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
func benchmark(ctx context.Context, opts *options, logw io.Writer) (_ *results, err error) {
	tmp, err := os.MkdirTemp("", "paymentsbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	env := &environment{
		providerKey: "bench_" + randomHex(12),
		dbs:         &databases{dir: tmp, pgAdmin: opts.postgres},
		pprof:       opts.pprofOut != "",
		gogc:        opts.gogc,
	}
	defer func() {
		if cerr := env.dbs.close(); cerr != nil && err == nil {
			err = fmt.Errorf("drop PostgreSQL databases: %w", cerr)
		}
	}()
	fmt.Fprintln(logw, "building paymentsd…")
	if env.paymentsd, err = buildPaymentsd(ctx, tmp, env.pprof, logw); err != nil {
		return nil, err
	}
	if opts.baseline != "" {
		fmt.Fprintf(logw, "building paymentsd at %s…\n", opts.baseline)
		var commit string
		if env.baseline, commit, err = buildBaseline(ctx, opts.baseline, tmp, logw); err != nil {
			return nil, err
		}
		env.baselineRev = opts.baseline + " (" + commit + ")"
	}
	if env.self, err = os.Executable(); err != nil {
		return nil, err
	}
	tick := clockTick(ctx)
	res := &results{
		Date:         time.Now().UTC(),
		GoVersion:    runtime.Version(),
		GOOS:         runtime.GOOS,
		GOARCH:       runtime.GOARCH,
		GOMAXPROCS:   runtime.GOMAXPROCS(0),
		NumCPU:       runtime.NumCPU(),
		ClockTickHz:  int(time.Second / tick),
		Smoke:        opts.smoke,
		Rounds:       opts.rounds,
		Warmup:       opts.warmup,
		Postgres:     opts.postgres != "",
		SQLiteDriver: sqliteDriver(),
		Baseline:     env.baselineRev,
	}
	if fi, err := os.Stat(env.paymentsd); err == nil {
		res.BinaryBytes = fi.Size()
	}

	fmt.Fprintf(logw, "durable-write floor: %d fsyncs of 4 KiB in %s…\n", opts.fsyncs, tmp)
	if res.Fsync, err = fsyncFloor(tmp, opts.fsyncs); err != nil {
		return nil, fmt.Errorf("fsync floor: %w", err)
	}
	if res.Phases, err = env.measurePaths(ctx, opts, tick, logw); err != nil {
		return nil, err
	}
	if opts.rss {
		if res.PeakRSS, err = env.peakRSS(ctx, opts, logw); err != nil {
			return nil, fmt.Errorf("peak RSS: %w", err)
		}
	}
	res.Checks = checkTargets(res)
	res.RecordFloors = recordFloorRatios(res)
	res.AgainstBaseline = baselineComparison(res)
	return res, nil
}

// measurePaths starts a fake provider, the floors and a paymentsd per
// record store, measures each path at each concurrency level, and stops
// them.
func (e *environment) measurePaths(ctx context.Context, opts *options, tick time.Duration, logw io.Writer) ([]phaseResult, error) {
	fake, err := e.startFake(ctx, "fake-provider", 0)
	if err != nil {
		return nil, err
	}
	defer fake.Stop()
	proxyFloor, err := e.startFloor(ctx, "proxy-floor", proxyFloorFlag, fake, "")
	if err != nil {
		return nil, err
	}
	defer proxyFloor.Stop()
	grpcFloor, err := e.startFloor(ctx, "grpc-floor", grpcFloorFlag, fake, "")
	if err != nil {
		return nil, err
	}
	defer grpcFloor.Stop()

	httpClient := newLoadClient()
	defer httpClient.CloseIdleConnections()
	grpcClient := func(addr string) (paymentsv1.PaymentsServiceClient, error) {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, fmt.Errorf("gRPC client: %w", err)
		}
		context.AfterFunc(ctx, func() { conn.Close() })
		return paymentsv1.NewPaymentsServiceClient(conn), nil
	}
	floorClient, err := grpcClient(grpcFloor.addr)
	if err != nil {
		return nil, err
	}
	paths := []*path{
		{name: "direct", proto: "http", call: postPayment(httpClient, fake.paymentURL(), e.providerKey)},
		{name: "proxy-floor", proto: "http", proc: proxyFloor.Process,
			call: postPayment(httpClient, "http://"+proxyFloor.addr+"/v1/multi-card-payments", "")},
		{name: "grpc-floor", proto: "grpc", proc: grpcFloor.Process, call: grpcPayment(floorClient)},
	}

	stores := []string{storeSQLite}
	if e.dbs.pgAdmin != "" {
		stores = append(stores, storePostgres)
	} else {
		fmt.Fprintln(logw, "no -postgres (PAYMENTS_TEST_POSTGRES_URL): skipping paymentsd with PostgreSQL")
	}
	stores = append(stores, storeMemory)
	for _, st := range stores {
		var recordGRPC, recordProxy string
		if st != storeMemory {
			// The record floors of this store, each with a database of
			// its own.
			recordGRPC, recordProxy = "record-grpc/"+st, "record-proxy/"+st
			rp, err := e.startFloor(ctx, "record-proxy-"+st, proxyFloorFlag, fake, st)
			if err != nil {
				return nil, err
			}
			defer rp.Stop()
			rg, err := e.startFloor(ctx, "record-grpc-"+st, grpcFloorFlag, fake, st)
			if err != nil {
				return nil, err
			}
			defer rg.Stop()
			rgClient, err := grpcClient(rg.addr)
			if err != nil {
				return nil, err
			}
			paths = append(paths,
				&path{name: recordProxy, proto: "http", floor: "proxy-floor", proc: rp.Process,
					call: postPayment(httpClient, "http://"+rp.addr+"/v1/multi-card-payments", "")},
				&path{name: recordGRPC, proto: "grpc", floor: "grpc-floor", proc: rg.Process, call: grpcPayment(rgClient)})
		}
		binaries := []string{e.paymentsd}
		if e.baseline != "" {
			binaries = append(binaries, e.baseline)
		}
		for _, bin := range binaries {
			suffix := ""
			if bin == e.baseline {
				suffix = baselineSuffix
			}
			svc, err := e.startPaymentsd(ctx, "paymentsd-"+st+strings.ReplaceAll(suffix, "@", "-"), bin, st, fake)
			if err != nil {
				return nil, err
			}
			defer svc.Stop()
			client, err := grpcClient(svc.grpcAddr)
			if err != nil {
				return nil, err
			}
			paths = append(paths, &path{name: "grpc/" + st + suffix, proto: "grpc", api: "grpc", store: st, floor: "grpc-floor", recordFloor: recordGRPC,
				proc: svc.Process, svc: svc, call: grpcPayment(client), baseline: suffix != ""})
			if st == storeMemory {
				continue // only to price the store, on the gRPC path
			}
			paths = append(paths, &path{name: "rest/" + st + suffix, proto: "http", api: "rest", store: st, floor: "proxy-floor", recordFloor: recordProxy,
				proc: svc.Process, svc: svc, call: postPayment(httpClient, "http://"+svc.httpAddr+"/v1/multi-card-payments", ""), baseline: suffix != ""})
		}
	}
	if len(opts.only) > 0 {
		paths = slices.DeleteFunc(paths, func(p *path) bool {
			return p.name != "direct" && !opts.only[strings.TrimSuffix(p.name, baselineSuffix)]
		})
	}

	levels := []struct{ concurrency, requests int }{
		{lowConcurrency, opts.requestsLow},
		{highConcurrency, opts.requestsHigh},
	}
	var phases []phaseResult
	runID := randomHex(4)
	m := &meter{fake: fake, tick: tick, scrape: newScrapeClient()}
	for _, l := range levels {
		// Rounds interleave the paths, so that whatever else the machine
		// does falls on all of them alike.
		samples := make([][]sample, len(paths))
		for round := range opts.rounds {
			for i, p := range paths {
				fmt.Fprintf(logw, "round %d/%d: %s c=%d, %d calls…\n", round+1, opts.rounds, p.name, l.concurrency, l.requests)
				var prof *profiler
				if opts.pprofOut != "" && p.name == opts.pprofPath && p.svc != nil && l.concurrency == highConcurrency && round == 0 {
					prof = &profiler{svc: p.svc, out: opts.pprofOut, log: logw}
				}
				// A key is never used twice: the run, path, level and
				// round are in every key, and each paymentsd has a
				// database of its own.
				keyPrefix := fmt.Sprintf("bench-%s-%s-c%d-r%d-", runID, p.name, l.concurrency, round)
				s, err := m.round(ctx, p, keyPrefix, l.concurrency, l.requests, opts.warmup, prof)
				if err != nil {
					return nil, fmt.Errorf("%s c=%d: %w", p.name, l.concurrency, err)
				}
				samples[i] = append(samples[i], s)
			}
		}
		for i, p := range paths {
			phases = append(phases, summarize(p, l.concurrency, samples[i]))
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
