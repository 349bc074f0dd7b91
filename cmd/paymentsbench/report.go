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

	Phases  []phaseResult `json:"phases"`
	PeakRSS rssResult     `json:"peak_rss"`
	Checks  []check       `json:"checks"`
}

// failedCalls counts every failed call of the run, warm-ups included.
func (r *results) failedCalls() int {
	n := r.PeakRSS.Failed
	for _, p := range r.Phases {
		n += p.Errors + p.WarmupErrors
	}
	return n
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

// checkTargets compares the results with paymentsd's performance targets.
func checkTargets(r *results) []check {
	direct1, _ := r.phase("direct", lowConcurrency)
	rest1, _ := r.phase("rest", lowConcurrency)
	direct32, _ := r.phase("direct", highConcurrency)
	grpc32, _ := r.phase("grpc", highConcurrency)
	rest32, _ := r.phase("rest", highConcurrency)

	var checks []check
	add := func(target string, measured, limit float64, unit string, pass bool, detail string) {
		checks = append(checks, check{target, measured, limit, unit, pass, detail})
	}

	ratio := grpc32.ServiceProviderCPURatio
	add("service CPU per gRPC payment ≤ 1.5 × provider CPU per request (c=32)",
		ratio, 1.5, "×", ratio <= 1.5,
		fmt.Sprintf("paymentsd %.1f µs vs fake provider %.1f µs per call", grpc32.ServiceCPUPerCallMicros, grpc32.ProviderCPUPerCallMicros))

	share := 0.0
	if direct32.RPS > 0 {
		share = 100 * rest32.RPS / direct32.RPS
	}
	add("REST rps at c=32 ≥ 60% of direct rps at c=32",
		share, 60, "%", share >= 60,
		fmt.Sprintf("REST %.0f rps vs direct %.0f rps", rest32.RPS, direct32.RPS))

	added := rest1.P50Micros - direct1.P50Micros
	add("REST p50 at c=1 − direct p50 at c=1 ≤ 100 µs",
		added, 100, "µs", added <= 100,
		fmt.Sprintf("REST %.0f µs vs direct %.0f µs", rest1.P50Micros, direct1.P50Micros))

	rss := r.PeakRSS
	add(fmt.Sprintf("peak RSS with %d in flight ≤ 100 MiB", rss.InFlight),
		rss.PeakRSSMiB, 100, "MiB", rss.PeakRSSMiB <= 100 && rss.Failed == 0,
		fmt.Sprintf("%d/%d succeeded, provider held %d at once; idle %.1f MiB", rss.Succeeded, rss.InFlight, rss.ProviderMaxInFlight, rss.IdleRSSMiB))

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
	fmt.Fprintln(tw, "path\tconc\trequests\terrors\trps\tp50 µs\tp99 µs\tsvc CPU/call µs\tprov CPU/call µs\tsvc/prov\tnew prov conns\t")
	for _, p := range r.Phases {
		svcCPU, ratio := "-", "-"
		if p.Path != "direct" { // paymentsd is idle in the direct phases
			svcCPU = fmt.Sprintf("%.1f", p.ServiceCPUPerCallMicros)
			ratio = fmt.Sprintf("%.2f", p.ServiceProviderCPURatio)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%.0f\t%.0f\t%s\t%.1f\t%s\t%d\t\n",
			p.Path, p.Concurrency, p.Requests, p.Errors+p.WarmupErrors, p.RPS, p.P50Micros, p.P99Micros,
			svcCPU, p.ProviderCPUPerCallMicros, ratio, p.MaxNewProviderConns)
	}
	tw.Flush()
	fmt.Fprintf(w, "Each row pools %d round(s); a round makes %d unmeasured warm-up calls, then the measured ones.\n", r.Rounds, r.Warmup)
	fmt.Fprintln(w, "errors: failed calls, warm-ups included. CPU: utime+stime from /proc/<pid>/stat over the measured calls.")
	fmt.Fprintln(w, "new prov conns: the most connections the fake provider accepted in one round, warm-up included.")

	rss := r.PeakRSS
	fmt.Fprintf(w, "\npeak RSS: %.1f MiB (VmHWM) with %d gRPC calls in flight over %d connections, replies delayed %s; %d succeeded, %d failed in %.1fs; provider held %d at once over %d connections; idle %.1f MiB, after %.1f MiB\n",
		rss.PeakRSSMiB, rss.InFlight, rss.GRPCConns, rss.ProviderDelay, rss.Succeeded, rss.Failed, rss.Seconds,
		rss.ProviderMaxInFlight, rss.ProviderConnections, rss.IdleRSSMiB, rss.AfterRSSMiB)

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
	}
	if rss.FirstError != "" {
		fmt.Fprintf(w, "\nfirst error, peak RSS: %s\n", rss.FirstError)
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
