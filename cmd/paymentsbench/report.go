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
	// SQLiteDriver is the driver module paymentsd and the record floors
	// were built with; BinaryBytes the size of the paymentsd binary.
	SQLiteDriver string `json:"sqlite_driver"`
	BinaryBytes  int64  `json:"paymentsd_binary_bytes"`
	// Postgres: paymentsd was also measured with PostgreSQL.
	Postgres bool `json:"postgres"`
	// Baseline is the revision (and its commit) whose paymentsd was
	// measured beside this tree's, or "".
	Baseline string `json:"baseline,omitempty"`

	Fsync   fsyncResult   `json:"fsync_floor"`
	Phases  []phaseResult `json:"phases"`
	PeakRSS []rssResult   `json:"peak_rss"`
	Checks  []check       `json:"checks"`
	// RecordFloors compares each paymentsd path with its record floor.
	RecordFloors []recordRatios `json:"record_floors"`
	// AgainstBaseline compares each paymentsd path with its baseline's
	// (-baseline), at each concurrency.
	AgainstBaseline []baselineRatios `json:"against_baseline,omitempty"`
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

// Targets (issue 34's): ratios from one run. paymentsd keeps a durable record of every
// payment, so its CPU, throughput and latency are held to its record
// floor's (the floor plus the least a durable record costs: see
// recordFloor), and its off-disk path to the bare gRPC floor.
const (
	maxRecordCPURatio = 1.3  // paymentsd CPU per call / its record floor's (c=32), gRPC and REST, SQLite and PostgreSQL
	minRESTRPSRatio   = 0.8  // paymentsd REST rps / its record floor's (c=32)
	maxAddedP50Slack  = 150  // µs of REST added p50 over the record floor's (c=1)
	maxMemoryCPURatio = 2.0  // paymentsd gRPC with sqlite::memory: / gRPC floor, CPU per call (c=32)
	maxRSSRatio       = 1.25 // peak RSS with many calls in flight / record floor's
	maxIdleRSSMiB     = 24
)

// ratio is a/b, or 0 if b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// recordRatios is a paymentsd path against its record floor, in one run.
type recordRatios struct {
	Path        string  `json:"path"`
	RecordFloor string  `json:"record_floor"`
	CPU32       float64 `json:"cpu_per_call_us"`
	FloorCPU32  float64 `json:"record_floor_cpu_per_call_us"`
	CPURatio    float64 `json:"cpu_ratio"` // c=32
	RPS32       float64 `json:"rps"`
	FloorRPS32  float64 `json:"record_floor_rps"`
	RPSRatio    float64 `json:"rps_ratio"`          // c=32
	Added1      float64 `json:"added_p50_us"`       // c=1, over direct
	FloorAdded1 float64 `json:"floor_added_p50_us"` // c=1, the record floor's over direct
}

// recordFloorRatios compares every paymentsd path that has a record floor
// with it.
func recordFloorRatios(r *results) []recordRatios {
	direct1, _ := r.phase("direct", lowConcurrency)
	var out []recordRatios
	for _, p := range r.Phases {
		if p.RecordFloor == "" || p.Concurrency != highConcurrency {
			continue
		}
		f32, ok1 := r.phase(p.RecordFloor, highConcurrency)
		p1, ok2 := r.phase(p.Path, lowConcurrency)
		f1, ok3 := r.phase(p.RecordFloor, lowConcurrency)
		if !ok1 || !ok2 || !ok3 {
			continue
		}
		out = append(out, recordRatios{
			Path: p.Path, RecordFloor: p.RecordFloor,
			CPU32: p.ServiceCPUPerCallMicros, FloorCPU32: f32.ServiceCPUPerCallMicros,
			CPURatio: ratio(p.ServiceCPUPerCallMicros, f32.ServiceCPUPerCallMicros),
			RPS32:    p.RPS, FloorRPS32: f32.RPS, RPSRatio: ratio(p.RPS, f32.RPS),
			Added1: p1.P50Micros - direct1.P50Micros, FloorAdded1: f1.P50Micros - direct1.P50Micros,
		})
	}
	return out
}

// checkTargets compares the results with paymentsd's performance targets:
// for the default store (SQLite), and the same figures with PostgreSQL.
func checkTargets(r *results) []check {
	var checks []check
	add := func(target string, measured, limit float64, unit string, pass bool, detail string) {
		checks = append(checks, check{target, measured, limit, unit, pass, detail})
	}
	for _, q := range recordFloorRatios(r) {
		p, _ := r.phase(q.Path, highConcurrency)
		if p.Baseline {
			continue
		}
		api := strings.ToUpper(p.API)
		add(fmt.Sprintf("[%s] CPU per %s payment / %s (c=32) ≤ %.2f", p.Store, api, q.RecordFloor, maxRecordCPURatio),
			q.CPURatio, maxRecordCPURatio, "×", q.CPURatio <= maxRecordCPURatio,
			fmt.Sprintf("paymentsd %.1f µs vs record floor %.1f µs per call", q.CPU32, q.FloorCPU32))
		if p.API != "rest" {
			continue
		}
		add(fmt.Sprintf("[%s] REST throughput / %s's (c=32) ≥ %.2f", p.Store, q.RecordFloor, minRESTRPSRatio),
			q.RPSRatio, minRESTRPSRatio, "×", q.RPSRatio >= minRESTRPSRatio,
			fmt.Sprintf("REST %.0f rps vs record floor %.0f rps", q.RPS32, q.FloorRPS32))
		limit := q.FloorAdded1 + maxAddedP50Slack
		add(fmt.Sprintf("[%s] REST added p50 (c=1) ≤ %s's + %d µs", p.Store, q.RecordFloor, maxAddedP50Slack),
			q.Added1, limit, "µs", q.Added1 <= limit,
			fmt.Sprintf("over direct: REST adds %.0f µs, the record floor %.0f µs: limit %.0f µs", q.Added1, q.FloorAdded1, limit))
	}

	if mem32, ok := r.phase("grpc/"+storeMemory, highConcurrency); ok {
		floor32, _ := r.phase("grpc-floor", highConcurrency)
		q := ratio(mem32.ServiceCPUPerCallMicros, floor32.ServiceCPUPerCallMicros)
		add(fmt.Sprintf("[memory] CPU per gRPC payment, records in memory / gRPC floor (c=32) ≤ %.2f", maxMemoryCPURatio),
			q, maxMemoryCPURatio, "×", q <= maxMemoryCPURatio,
			fmt.Sprintf("paymentsd %.1f µs vs floor %.1f µs per call", mem32.ServiceCPUPerCallMicros, floor32.ServiceCPUPerCallMicros))
	}

	for _, api := range []string{"grpc", "rest"} {
		svc, ok1 := r.rss(api + "/" + storeSQLite)
		floor, ok2 := r.rss(svc.Floor)
		if !ok1 || !ok2 {
			continue
		}
		q := ratio(svc.PeakRSSMiB, floor.PeakRSSMiB)
		add(fmt.Sprintf("[sqlite] %s peak RSS with %d in flight / %s's ≤ %.2f", api, svc.InFlight, floor.Path, maxRSSRatio),
			q, maxRSSRatio, "×", q <= maxRSSRatio && svc.Failed == 0 && floor.Failed == 0,
			fmt.Sprintf("paymentsd %.1f MiB vs record floor %.1f MiB; %d/%d and %d/%d succeeded; provider held %d and %d at once",
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

// baselineRatios is a paymentsd path against the same path of the
// paymentsd built at -baseline, at one concurrency, in one run.
type baselineRatios struct {
	Path        string  `json:"path"`
	Concurrency int     `json:"concurrency"`
	CPU         float64 `json:"cpu_per_call_us"`
	BaseCPU     float64 `json:"baseline_cpu_per_call_us"`
	CPURatio    float64 `json:"cpu_ratio"`
	RPS         float64 `json:"rps"`
	BaseRPS     float64 `json:"baseline_rps"`
	RPSRatio    float64 `json:"rps_ratio"`
	P50         float64 `json:"p50_us"`
	BaseP50     float64 `json:"baseline_p50_us"`
	P99         float64 `json:"p99_us"`
	BaseP99     float64 `json:"baseline_p99_us"`
	Commits     float64 `json:"commits_per_call"`
	BaseCommits float64 `json:"baseline_commits_per_call"`
}

// baselineComparison compares every paymentsd path that has a baseline
// with it.
func baselineComparison(r *results) []baselineRatios {
	var out []baselineRatios
	for _, p := range r.Phases {
		if p.Baseline || p.API == "" {
			continue
		}
		b, ok := r.phase(p.Path+baselineSuffix, p.Concurrency)
		if !ok {
			continue
		}
		out = append(out, baselineRatios{
			Path: p.Path, Concurrency: p.Concurrency,
			CPU: p.ServiceCPUPerCallMicros, BaseCPU: b.ServiceCPUPerCallMicros, CPURatio: ratio(p.ServiceCPUPerCallMicros, b.ServiceCPUPerCallMicros),
			RPS: p.RPS, BaseRPS: b.RPS, RPSRatio: ratio(p.RPS, b.RPS),
			P50: p.P50Micros, BaseP50: b.P50Micros, P99: p.P99Micros, BaseP99: b.P99Micros,
			Commits: p.CommitsPerCall, BaseCommits: b.CommitsPerCall,
		})
	}
	return out
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
	fmt.Fprintf(w, "SQLite driver %s; paymentsd binary %.1f MiB\n", r.SQLiteDriver, float64(r.BinaryBytes)/(1<<20))
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

	var window []phaseResult
	for _, p := range r.Phases {
		if p.OutcomeCommitP50Micros > 0 {
			window = append(window, p)
		}
	}
	if len(window) > 0 {
		fmt.Fprintln(w, "\nthe window a replica's death leaves, from the provider's answer to its record's commit (paymentsd_outcome_commit_seconds, interpolated in its buckets):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "path	conc	p50 µs	p99 µs	")
		for _, p := range window {
			fmt.Fprintf(tw, "%s	%d	%.0f	%.0f	\n", p.Path, p.Concurrency, p.OutcomeCommitP50Micros, p.OutcomeCommitP99Micros)
		}
		tw.Flush()
	}

	if costs := storeCosts(r); len(costs) > 0 {
		fmt.Fprintln(w, "\nrecord store cost per gRPC payment (against paymentsd with sqlite::memory:, records off-disk):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "store\tCPU/call over memory µs (c=32)\tCPU/gRPC floor (c=32)\tCPU/memory (c=32)\tcommits/call c=1\tcommits/call c=32\tadded p50 µs (c=1)\t")
		for _, c := range costs {
			fmt.Fprintf(tw, "%s\t%.1f\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t\n", c.Store, c.CPUMicros, c.CPUFloorRatio, c.MemoryRatio, c.Commits1, c.CommitsPerCall, c.AddedP50Micros)
		}
		tw.Flush()
	}

	if rs := recordFloorRatios(r); len(rs) > 0 {
		fmt.Fprintln(w, "\npaymentsd against its record floor (the floor plus one INSERT committed before forwarding and one UPDATE after, same store and group commit):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "path\trecord floor\tCPU/call µs (c=32)\tfloor's\tratio\trps (c=32)\tfloor's\tratio\tadded p50 µs (c=1)\tfloor's\tdifference\t")
		for _, q := range rs {
			fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%.2f\t%.0f\t%.0f\t%.2f\t%.0f\t%.0f\t%+.0f\t\n", q.Path, q.RecordFloor,
				q.CPU32, q.FloorCPU32, q.CPURatio, q.RPS32, q.FloorRPS32, q.RPSRatio, q.Added1, q.FloorAdded1, q.Added1-q.FloorAdded1)
		}
		tw.Flush()
		fmt.Fprintln(w, "added p50: the path's p50 at c=1 less the direct path's.")
	}

	if bs := baselineComparison(r); len(bs) > 0 {
		fmt.Fprintf(w, "\nagainst the baseline, paymentsd built at %s (PATH%s), measured in the same rounds:\n", r.Baseline, baselineSuffix)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "path\tconc\tCPU/call µs\tbaseline's\tratio\trps\tbaseline's\tratio\tp50 µs\tbaseline's\tdifference\tp99 µs\tbaseline's\tcommits/call\tbaseline's\t")
		for _, q := range bs {
			fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%.3f\t%.0f\t%.0f\t%.3f\t%.0f\t%.0f\t%+.0f\t%.0f\t%.0f\t%.2f\t%.2f\t\n", q.Path, q.Concurrency,
				q.CPU, q.BaseCPU, q.CPURatio, q.RPS, q.BaseRPS, q.RPSRatio, q.P50, q.BaseP50, q.P50-q.BaseP50, q.P99, q.BaseP99, q.Commits, q.BaseCommits)
		}
		tw.Flush()
	}

	if len(r.PeakRSS) == 0 {
		fmt.Fprintln(w, "\npeak RSS: not measured (-rss=false)")
	} else {
		printRSS(w, r)
	}

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

// printRSS writes the peak-RSS table: the floors' peaks are the
// references, and a baseline's is beside the path it was before.
func printRSS(w io.Writer, r *results) {
	fmt.Fprintln(w, "\npeak RSS (VmHWM), each a fresh process, every call in flight at once to a fake holding replies:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "process\tin flight\tclient conns\tsucceeded\tprovider held\tidle MiB\tpeak MiB\tpeak/floor\tafter MiB\tpeak/baseline's\tidle/baseline's\t")
	for _, p := range r.PeakRSS {
		q, qb, qi := "-", "-", "-"
		if f, ok := r.rss(p.Floor); ok {
			q = fmt.Sprintf("%.2f", ratio(p.PeakRSSMiB, f.PeakRSSMiB))
		}
		if b, ok := r.rss(p.Path + baselineSuffix); ok {
			qb = fmt.Sprintf("%.3f", ratio(p.PeakRSSMiB, b.PeakRSSMiB))
			qi = fmt.Sprintf("%.3f", ratio(p.IdleRSSMiB, b.IdleRSSMiB))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.1f\t%.1f\t%s\t%.1f\t%s\t%s\t\n",
			p.Path, p.InFlight, p.Conns, p.Succeeded, p.ProviderMaxInFlight, p.IdleRSSMiB, p.PeakRSSMiB, q, p.AfterRSSMiB, qb, qi)
	}
	tw.Flush()
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
