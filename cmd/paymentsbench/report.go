package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
)

// results is everything a run measured, as written to the JSON file.
type results struct {
	// Command is this process's command line; ParentCommand is its
	// parent's, such as "go run ./cmd/paymentsbench".
	Command       []string  `json:"command"`
	ParentCommand string    `json:"parent_command,omitempty"`
	Date          time.Time `json:"date"`
	GoVersion     string    `json:"go_version"`
	GOOS          string    `json:"goos"`
	GOARCH        string    `json:"goarch"`
	GOMAXPROCS    int       `json:"gomaxprocs"`
	NumCPU        int       `json:"num_cpu"`
	// ClockTickHz is the resolution of the CPU times: each reading is in
	// whole ticks.
	ClockTickHz int  `json:"clock_tick_hz"`
	Smoke       bool `json:"smoke"`
	Rounds      int  `json:"rounds"`
	Warmup      int  `json:"warmup_calls_per_round"`
	// Postgres: paymentsd was also measured with PostgreSQL.
	Postgres bool `json:"postgres"`

	Fsync   fsyncResult   `json:"fsync_floor"`
	Phases  []phaseResult `json:"phases"`
	PeakRSS []rssResult   `json:"peak_rss"`
	Checks  []check       `json:"checks"`
}

// failedCalls counts every failed call of the run, warm-ups included, and
// every call paymentsd answered as a replay (with a key per call, none
// should be).
func (r *results) failedCalls() int {
	n := 0
	for _, p := range r.PeakRSS {
		n += p.Failed
	}
	for _, p := range r.Phases {
		n += p.Errors + p.WarmupErrors + int(p.Replays)
	}
	return n
}

func (r *results) rss(path string) (rssResult, bool) {
	for _, p := range r.PeakRSS {
		if p.Path == path {
			return p, true
		}
	}
	return rssResult{}, false
}

func (r *results) phase(path string, concurrency int) (phaseResult, bool) {
	for _, p := range r.Phases {
		if p.Path == path && p.Concurrency == concurrency {
			return p, true
		}
	}
	return phaseResult{}, false
}

// check is one target and whether the run met it.
type check struct {
	Target   string  `json:"target"`
	Measured float64 `json:"measured"`
	Limit    float64 `json:"limit"`
	Unit     string  `json:"unit"`
	Pass     bool    `json:"pass"`
	Detail   string  `json:"detail"`
}

// Targets: ratios to the floors, from one run.
const (
	maxGRPCCPURatio  = 1.25 // paymentsd gRPC CPU per call / gRPC floor's
	maxRESTCPURatio  = 1.4  // paymentsd REST CPU per call / ReverseProxy floor's
	minRESTRPSRatio  = 0.75 // paymentsd REST rps / ReverseProxy floor's (c=32)
	maxAddedP50Slack = 100  // µs over the floor's added p50 plus one fsync (c=1)
	maxRSSRatio      = 1.15 // peak RSS with many calls in flight / floor's
	maxIdleRSSMiB    = 20
)

// ratio is a/b, or 0 if b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// checkTargets compares the results with paymentsd's performance targets:
// for the default store (SQLite), and the same figures with PostgreSQL.
func checkTargets(r *results) []check {
	var checks []check
	add := func(target string, measured, limit float64, unit string, pass bool, detail string) {
		checks = append(checks, check{target, measured, limit, unit, pass, detail})
	}
	direct1, _ := r.phase("direct", lowConcurrency)
	proxy1, _ := r.phase("proxy-floor", lowConcurrency)
	proxy32, _ := r.phase("proxy-floor", highConcurrency)
	gfloor32, _ := r.phase("grpc-floor", highConcurrency)
	floorAdded := proxy1.P50Micros - direct1.P50Micros

	stores := []string{storeSQLite}
	if r.Postgres {
		stores = append(stores, storePostgres)
	}
	for _, st := range stores {
		grpc32, _ := r.phase("grpc/"+st, highConcurrency)
		rest32, _ := r.phase("rest/"+st, highConcurrency)
		rest1, _ := r.phase("rest/"+st, lowConcurrency)

		q := ratio(grpc32.ServiceCPUPerCallMicros, gfloor32.ServiceCPUPerCallMicros)
		add(fmt.Sprintf("[%s] CPU per gRPC payment / gRPC floor (c=32) ≤ %.2f", st, maxGRPCCPURatio),
			q, maxGRPCCPURatio, "×", q <= maxGRPCCPURatio,
			fmt.Sprintf("paymentsd %.1f µs vs floor %.1f µs per call", grpc32.ServiceCPUPerCallMicros, gfloor32.ServiceCPUPerCallMicros))

		q = ratio(rest32.ServiceCPUPerCallMicros, proxy32.ServiceCPUPerCallMicros)
		add(fmt.Sprintf("[%s] CPU per REST payment / ReverseProxy floor (c=32) ≤ %.2f", st, maxRESTCPURatio),
			q, maxRESTCPURatio, "×", q <= maxRESTCPURatio,
			fmt.Sprintf("paymentsd %.1f µs vs floor %.1f µs per call", rest32.ServiceCPUPerCallMicros, proxy32.ServiceCPUPerCallMicros))

		q = ratio(rest32.RPS, proxy32.RPS)
		add(fmt.Sprintf("[%s] REST throughput / ReverseProxy floor throughput (c=32) ≥ %.2f", st, minRESTRPSRatio),
			q, minRESTRPSRatio, "×", q >= minRESTRPSRatio,
			fmt.Sprintf("REST %.0f rps vs floor %.0f rps", rest32.RPS, proxy32.RPS))

		added := rest1.P50Micros - direct1.P50Micros
		limit := floorAdded + r.Fsync.MedianMicros + maxAddedP50Slack
		add(fmt.Sprintf("[%s] REST added p50 (c=1) ≤ floor's added p50 + one fsync + %d µs", st, maxAddedP50Slack),
			added, limit, "µs", added <= limit,
			fmt.Sprintf("REST %.0f µs − direct %.0f µs; floor adds %.0f µs, fsync %.0f µs: limit %.0f µs",
				rest1.P50Micros, direct1.P50Micros, floorAdded, r.Fsync.MedianMicros, limit))
	}

	for _, api := range []string{"grpc", "rest"} {
		svc, ok1 := r.rss(api + "/" + storeSQLite)
		floor, ok2 := r.rss(map[string]string{"grpc": "grpc-floor", "rest": "proxy-floor"}[api])
		if !ok1 || !ok2 {
			continue
		}
		q := ratio(svc.PeakRSSMiB, floor.PeakRSSMiB)
		add(fmt.Sprintf("[sqlite] %s peak RSS with %d in flight / %s's ≤ %.2f", api, svc.InFlight, floor.Path, maxRSSRatio),
			q, maxRSSRatio, "×", q <= maxRSSRatio && svc.Failed == 0 && floor.Failed == 0,
			fmt.Sprintf("paymentsd %.1f MiB vs floor %.1f MiB; %d/%d and %d/%d succeeded; provider held %d and %d at once",
				svc.PeakRSSMiB, floor.PeakRSSMiB, svc.Succeeded, svc.InFlight, floor.Succeeded, floor.InFlight,
				svc.ProviderMaxInFlight, floor.ProviderMaxInFlight))
	}
	if svc, ok := r.rss("grpc/" + storeSQLite); ok {
		add(fmt.Sprintf("idle RSS ≤ %d MiB", maxIdleRSSMiB),
			svc.IdleRSSMiB, maxIdleRSSMiB, "MiB", svc.IdleRSSMiB <= maxIdleRSSMiB,
			fmt.Sprintf("paymentsd idle, before any call; the floors idle at %.1f (gRPC) and %.1f MiB (proxy)",
				rssIdle(r, "grpc-floor"), rssIdle(r, "proxy-floor")))
	}

	grpc32, _ := r.phase("grpc/"+storeSQLite, highConcurrency)
	rest32, _ := r.phase("rest/"+storeSQLite, highConcurrency)
	conns := max(grpc32.MaxNewProviderConns, rest32.MaxNewProviderConns)
	perRound := 0
	if len(grpc32.PerRound) > 0 {
		perRound = grpc32.PerRound[0].Requests
	}
	add(fmt.Sprintf("new provider connections during %d calls at c=%d ≤ %d", perRound, highConcurrency, highConcurrency),
		float64(conns), highConcurrency, "", conns <= highConcurrency,
		fmt.Sprintf("most in one round, warm-up included: gRPC %v, REST %v accepted by the provider; paymentsd's own count %v, %v",
			roundConns(grpc32), roundConns(rest32), roundOpened(grpc32), roundOpened(rest32)))
	return checks
}

func rssIdle(r *results, path string) float64 {
	p, _ := r.rss(path)
	return p.IdleRSSMiB
}

// storeCost is what the durable record costs per payment on the gRPC path:
// paymentsd with the store against paymentsd with its records in memory.
type storeCost struct {
	Store          string  `json:"store"`
	CPUMicros      float64 `json:"cpu_per_call_us"`     // c=32, over grpc/memory
	CPUFloorRatio  float64 `json:"cpu_over_grpc_floor"` // c=32
	MemoryRatio    float64 `json:"cpu_over_records_in_memory"`
	CommitsPerCall float64 `json:"commits_per_call"`    // c=32
	Commits1       float64 `json:"commits_per_call_c1"` // c=1
	AddedP50Micros float64 `json:"added_p50_us"`        // c=1, over grpc/memory
}

func storeCosts(r *results) []storeCost {
	mem1, _ := r.phase("grpc/"+storeMemory, lowConcurrency)
	mem32, _ := r.phase("grpc/"+storeMemory, highConcurrency)
	floor32, _ := r.phase("grpc-floor", highConcurrency)
	var out []storeCost
	for _, st := range []string{storeSQLite, storePostgres, storeMemory} {
		p1, ok1 := r.phase("grpc/"+st, lowConcurrency)
		p32, ok2 := r.phase("grpc/"+st, highConcurrency)
		if !ok1 || !ok2 {
			continue
		}
		out = append(out, storeCost{
			Store:          st,
			CPUMicros:      p32.ServiceCPUPerCallMicros - mem32.ServiceCPUPerCallMicros,
			CPUFloorRatio:  ratio(p32.ServiceCPUPerCallMicros, floor32.ServiceCPUPerCallMicros),
			MemoryRatio:    ratio(p32.ServiceCPUPerCallMicros, mem32.ServiceCPUPerCallMicros),
			CommitsPerCall: p32.CommitsPerCall,
			Commits1:       p1.CommitsPerCall,
			AddedP50Micros: p1.P50Micros - mem1.P50Micros,
		})
	}
	return out
}

// roundConns lists the connections the provider accepted in each round.
func roundConns(p phaseResult) []int64 {
	var n []int64
	for _, r := range p.PerRound {
		n = append(n, r.NewProviderConns)
	}
	return n
}

// roundOpened lists paymentsd's count of connections it opened in each
// round.
func roundOpened(p phaseResult) []float64 {
	var n []float64
	for _, r := range p.PerRound {
		n = append(n, r.ServiceConnsOpened)
	}
	return n
}

// printReport writes the table and the target checks.
func printReport(w io.Writer, r *results) {
	fmt.Fprintf(w, "\npaymentsbench %s, %s %s/%s, GOMAXPROCS=%d, %d CPUs, CPU times in %d Hz ticks, %d rounds\n",
		r.Date.Format(time.RFC3339), r.GoVersion, r.GOOS, r.GOARCH, r.GOMAXPROCS, r.NumCPU, r.ClockTickHz, r.Rounds)
	if r.Smoke {
		fmt.Fprintln(w, "SMOKE RUN: too few calls for the figures to mean anything")
	}
	fmt.Fprintln(w)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tconc\trequests\terrors\trps\tp50 µs\tp99 µs\tCPU/call µs\tCPU/floor\trps/floor\tprov CPU/call µs\tcommits/call\tnew prov conns\t")
	for _, p := range r.Phases {
		cpu, cpuRatio, rpsRatio, commits := "-", "-", "-", "-"
		if p.Path != "direct" { // its own process is the fake
			cpu = fmt.Sprintf("%.1f", p.ServiceCPUPerCallMicros)
		}
		if f, ok := r.phase(p.Floor, p.Concurrency); ok {
			cpuRatio = fmt.Sprintf("%.2f", ratio(p.ServiceCPUPerCallMicros, f.ServiceCPUPerCallMicros))
			rpsRatio = fmt.Sprintf("%.2f", ratio(p.RPS, f.RPS))
		}
		if p.Store != "" {
			commits = fmt.Sprintf("%.2f", p.CommitsPerCall)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%.0f\t%.0f\t%s\t%s\t%s\t%.1f\t%s\t%d\t\n",
			p.Path, p.Concurrency, p.Requests, p.Errors+p.WarmupErrors, p.RPS, p.P50Micros, p.P99Micros,
			cpu, cpuRatio, rpsRatio, p.ProviderCPUPerCallMicros, commits, p.MaxNewProviderConns)
	}
	tw.Flush()
	fmt.Fprintf(w, "Each row pools %d round(s); a round makes %d unmeasured warm-up calls, then the measured ones, each with a new idempotency key.\n", r.Rounds, r.Warmup)
	fmt.Fprintln(w, "CPU: utime+stime from /proc/<pid>/stat of the path's own process over the measured calls; /floor: against grpc-floor (gRPC) or proxy-floor (REST), same level.")
	fmt.Fprintln(w, "commits/call: record store transactions per payment (paymentsd_store_commits_total, else paymentsd_store_duration_seconds_count).")
	fmt.Fprintf(w, "durable-write floor: fsync of 4 KiB in %s, median %.0f µs (p90 %.0f µs) over %d.\n",
		r.Fsync.Dir, r.Fsync.MedianMicros, r.Fsync.P90Micros, r.Fsync.Samples)

	if costs := storeCosts(r); len(costs) > 0 {
		fmt.Fprintln(w, "\nrecord store cost per gRPC payment (against paymentsd with sqlite::memory:, records off-disk):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "store\tCPU/call over memory µs (c=32)\tCPU/gRPC floor (c=32)\tCPU/memory (c=32)\tcommits/call c=1\tcommits/call c=32\tadded p50 µs (c=1)\t")
		for _, c := range costs {
			fmt.Fprintf(tw, "%s\t%.1f\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t\n", c.Store, c.CPUMicros, c.CPUFloorRatio, c.MemoryRatio, c.Commits1, c.CommitsPerCall, c.AddedP50Micros)
		}
		tw.Flush()
	}

	fmt.Fprintln(w, "\npeak RSS (VmHWM), each a fresh process, every call in flight at once to a fake holding replies:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "process\tin flight\tclient conns\tsucceeded\tprovider held\tidle MiB\tpeak MiB\tpeak/floor\tafter MiB\t")
	for _, p := range r.PeakRSS {
		q := "-"
		if f, ok := r.rss(p.Floor); ok {
			q = fmt.Sprintf("%.2f", ratio(p.PeakRSSMiB, f.PeakRSSMiB))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.1f\t%.1f\t%s\t%.1f\t\n",
			p.Path, p.InFlight, p.Conns, p.Succeeded, p.ProviderMaxInFlight, p.IdleRSSMiB, p.PeakRSSMiB, q, p.AfterRSSMiB)
	}
	tw.Flush()

	fmt.Fprintln(w, "\ntargets:")
	for _, c := range r.Checks {
		verdict := "not met"
		if c.Pass {
			verdict = "met    "
		}
		fmt.Fprintf(w, "  %s  %s: %.2f%s (%s)\n", verdict, c.Target, c.Measured, c.Unit, c.Detail)
	}
	for _, p := range r.Phases {
		if p.FirstError != "" {
			fmt.Fprintf(w, "\nfirst error, %s c=%d: %s\n", p.Path, p.Concurrency, strings.TrimSpace(p.FirstError))
		}
		if p.Replays > 0 {
			fmt.Fprintf(w, "\n%s c=%d: %.0f calls were replays: a key was used twice\n", p.Path, p.Concurrency, p.Replays)
		}
	}
	for _, p := range r.PeakRSS {
		if p.FirstError != "" {
			fmt.Fprintf(w, "\nfirst error, peak RSS of %s: %s\n", p.Path, p.FirstError)
		}
	}
}

// writeJSON writes r to path, creating its directory.
func writeJSON(path string, r *results) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
