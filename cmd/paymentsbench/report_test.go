package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRatio(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ a, b, want float64 }{
		{3, 2, 1.5},
		{0, 2, 0},
		{3, 0, 0}, // nothing to compare with: 0, never +Inf or NaN
		{0, 0, 0},
	} {
		if got := ratio(tt.a, tt.b); got != tt.want {
			t.Errorf("ratio(%v, %v) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}

// run is a run's results that meet every target: paymentsd on SQLite over
// gRPC and REST, each against its record floor, paymentsd with its
// records in memory against the gRPC floor, and peak and idle RSS.
func passingRun() *results {
	phase := func(path string, c int, cpu, rps, p50 float64) phaseResult {
		p := phaseResult{Path: path, Concurrency: c, ServiceCPUPerCallMicros: cpu, RPS: rps, P50Micros: p50,
			PerRound: []roundResult{{Requests: 1000, NewProviderConns: 8, ServiceConnsOpened: 8}}, MaxNewProviderConns: 8}
		if name, store, ok := strings.Cut(path, "/"); ok && (name == "grpc" || name == "rest") {
			p.API, p.Store = name, store
			if store != storeMemory {
				p.RecordFloor = map[string]string{"grpc": "record-grpc/", "rest": "record-proxy/"}[name] + store
			}
		}
		return p
	}
	return &results{
		Phases: []phaseResult{
			phase("direct", 1, 0, 0, 100),
			phase("grpc-floor", 32, 50, 0, 0),
			phase("record-grpc/sqlite", 1, 0, 0, 300),
			phase("record-grpc/sqlite", 32, 100, 5000, 0),
			phase("grpc/sqlite", 1, 0, 0, 350),
			phase("grpc/sqlite", 32, 130, 4800, 0),
			phase("record-proxy/sqlite", 1, 0, 0, 400),
			phase("record-proxy/sqlite", 32, 100, 4000, 0),
			phase("rest/sqlite", 1, 0, 0, 550), // adds 450 µs over direct; the floor 300: within 200
			phase("rest/sqlite", 32, 120, 3200, 0),
			phase("grpc/memory", 1, 0, 0, 200),
			phase("grpc/memory", 32, 90, 6000, 0),
		},
		PeakRSS: []rssResult{
			{Path: "grpc/sqlite", Floor: "record-grpc/sqlite", InFlight: 2000, Succeeded: 2000, IdleRSSMiB: 20, PeakRSSMiB: 120},
			{Path: "record-grpc/sqlite", InFlight: 2000, Succeeded: 2000, PeakRSSMiB: 100},
			{Path: "rest/sqlite", Floor: "record-proxy/sqlite", InFlight: 2000, Succeeded: 2000, PeakRSSMiB: 125},
			{Path: "record-proxy/sqlite", InFlight: 2000, Succeeded: 2000, PeakRSSMiB: 100},
		},
	}
}

func TestCheckTargets(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// change makes the run miss the target that starts with fails.
		change func(r *results)
		fails  string
	}{
		{"every target met", func(*results) {}, ""},
		{"gRPC CPU over its record floor's", func(r *results) {
			setPhase(r, "grpc/sqlite", 32, func(p *phaseResult) { p.ServiceCPUPerCallMicros = 141 })
		}, "[sqlite] CPU per GRPC payment"},
		{"REST CPU over its record floor's", func(r *results) {
			setPhase(r, "rest/sqlite", 32, func(p *phaseResult) { p.ServiceCPUPerCallMicros = 141 })
		}, "[sqlite] CPU per REST payment"},
		{"REST throughput under its record floor's", func(r *results) { setPhase(r, "rest/sqlite", 32, func(p *phaseResult) { p.RPS = 2999 }) }, "[sqlite] REST throughput"},
		{"REST added p50 past the slack", func(r *results) { setPhase(r, "rest/sqlite", 1, func(p *phaseResult) { p.P50Micros = 601 }) }, "[sqlite] REST added p50"},
		{"records in memory over the gRPC floor", func(r *results) {
			setPhase(r, "grpc/memory", 32, func(p *phaseResult) { p.ServiceCPUPerCallMicros = 101 })
		}, "[memory] CPU per gRPC payment"},
		{"peak RSS over the record floor's", func(r *results) { r.PeakRSS[0].PeakRSSMiB = 131 }, "[sqlite] grpc peak RSS"},
		{"a call failed while measuring RSS", func(r *results) { r.PeakRSS[3].Failed = 1 }, "[sqlite] rest peak RSS"},
		{"idle RSS", func(r *results) { r.PeakRSS[0].IdleRSSMiB = 25 }, "idle RSS"},
		{"too many provider connections", func(r *results) { setPhase(r, "rest/sqlite", 32, func(p *phaseResult) { p.MaxNewProviderConns = 33 }) }, "new provider connections"},
		{"a baseline's figures are not held to the targets", func(r *results) {
			r.Phases = append(r.Phases,
				phaseResult{Path: "grpc/sqlite@base", API: "grpc", Store: "sqlite", RecordFloor: "record-grpc/sqlite", Baseline: true, Concurrency: 32, ServiceCPUPerCallMicros: 500},
				phaseResult{Path: "grpc/sqlite@base", API: "grpc", Store: "sqlite", RecordFloor: "record-grpc/sqlite", Baseline: true, Concurrency: 1})
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := passingRun()
			tt.change(r)
			checks := checkTargets(r)
			if len(checks) != 9 {
				t.Errorf("checkTargets made %d checks, want 9: %v", len(checks), checks)
			}
			for _, c := range checks {
				if wantPass := tt.fails == "" || !strings.HasPrefix(c.Target, tt.fails); c.Pass != wantPass {
					t.Errorf("check %q: pass %v (measured %v, limit %v), want %v", c.Target, c.Pass, c.Measured, c.Limit, wantPass)
				}
			}
		})
	}
}

func setPhase(r *results, path string, c int, change func(*phaseResult)) {
	for i := range r.Phases {
		if r.Phases[i].Path == path && r.Phases[i].Concurrency == c {
			change(&r.Phases[i])
		}
	}
}

func TestRecordFloorRatios(t *testing.T) {
	t.Parallel()
	r := passingRun()
	want := []recordRatios{
		{Path: "grpc/sqlite", RecordFloor: "record-grpc/sqlite", CPU32: 130, FloorCPU32: 100, CPURatio: 1.3,
			RPS32: 4800, FloorRPS32: 5000, RPSRatio: 0.96, Added1: 250, FloorAdded1: 200},
		{Path: "rest/sqlite", RecordFloor: "record-proxy/sqlite", CPU32: 120, FloorCPU32: 100, CPURatio: 1.2,
			RPS32: 3200, FloorRPS32: 4000, RPSRatio: 0.8, Added1: 450, FloorAdded1: 300},
	}
	if diff := cmp.Diff(want, recordFloorRatios(r)); diff != "" {
		t.Errorf("recordFloorRatios differs (-want +got):\n%s", diff)
	}
	// A path whose record floor was not measured at both concurrencies
	// is left out, not compared with zeros.
	r.Phases = slices.DeleteFunc(r.Phases, func(p phaseResult) bool { return p.Path == "record-proxy/sqlite" && p.Concurrency == 1 })
	if got := recordFloorRatios(r); len(got) != 1 || got[0].Path != "grpc/sqlite" {
		t.Errorf("recordFloorRatios without record-proxy/sqlite at c=1 = %v, want grpc/sqlite's alone", got)
	}
}

func TestBaselineComparison(t *testing.T) {
	t.Parallel()
	r := &results{Phases: []phaseResult{
		{Path: "grpc/sqlite", API: "grpc", Concurrency: 32, ServiceCPUPerCallMicros: 120, RPS: 3000, P50Micros: 400, P99Micros: 900, CommitsPerCall: 1.5},
		{Path: "grpc/sqlite" + baselineSuffix, API: "grpc", Baseline: true, Concurrency: 32, ServiceCPUPerCallMicros: 100, RPS: 4000, P50Micros: 300, P99Micros: 800, CommitsPerCall: 2},
		{Path: "rest/sqlite", API: "rest", Concurrency: 32}, // no baseline measured
		{Path: "grpc-floor", Concurrency: 32},               // not paymentsd
	}}
	want := []baselineRatios{{
		Path: "grpc/sqlite", Concurrency: 32,
		CPU: 120, BaseCPU: 100, CPURatio: 1.2,
		RPS: 3000, BaseRPS: 4000, RPSRatio: 0.75,
		P50: 400, BaseP50: 300, P99: 900, BaseP99: 800,
		Commits: 1.5, BaseCommits: 2,
	}}
	if diff := cmp.Diff(want, baselineComparison(r)); diff != "" {
		t.Errorf("baselineComparison differs (-want +got):\n%s", diff)
	}
}

func TestStoreCosts(t *testing.T) {
	t.Parallel()
	r := &results{Phases: []phaseResult{
		{Path: "grpc-floor", Concurrency: 32, ServiceCPUPerCallMicros: 50},
		{Path: "grpc/memory", Concurrency: 1, P50Micros: 200, CommitsPerCall: 2},
		{Path: "grpc/memory", Concurrency: 32, ServiceCPUPerCallMicros: 80, CommitsPerCall: 2},
		{Path: "grpc/sqlite", Concurrency: 1, P50Micros: 350, CommitsPerCall: 2},
		{Path: "grpc/sqlite", Concurrency: 32, ServiceCPUPerCallMicros: 120, CommitsPerCall: 1.25},
	}}
	want := []storeCost{
		{Store: "sqlite", CPUMicros: 40, CPUFloorRatio: 2.4, MemoryRatio: 1.5, CommitsPerCall: 1.25, Commits1: 2, AddedP50Micros: 150},
		{Store: "memory", CPUMicros: 0, CPUFloorRatio: 1.6, MemoryRatio: 1, CommitsPerCall: 2, Commits1: 2, AddedP50Micros: 0},
	}
	if diff := cmp.Diff(want, storeCosts(r)); diff != "" {
		t.Errorf("storeCosts differs (-want +got):\n%s (postgres, not measured, is left out)", diff)
	}
}
