package main

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// TestHistogramQuantile: the estimates are Prometheus's histogram_quantile
// (promql.BucketQuantile), worked by hand: linear within the bucket the
// rank falls in, the first bucket starting at 0, the last finite bound for
// a rank in +Inf.
func TestHistogramQuantile(t *testing.T) {
	t.Parallel()
	inf := math.Inf(1)
	tests := []struct {
		name       string
		cumulative map[float64]float64
		q          float64
		want       float64
	}{
		{"no buckets", nil, 0.5, 0},
		{"no observations", map[float64]float64{0.1: 0, inf: 0}, 0.5, 0},
		{"within the first bucket, from 0", map[float64]float64{0.1: 10, inf: 10}, 0.5, 0.05},
		{"within the second bucket", map[float64]float64{0.1: 4, 0.2: 10, inf: 10}, 0.5, 0.1 + 0.1*1/6},
		{"at a bucket's top", map[float64]float64{0.1: 5, 0.2: 10, inf: 10}, 0.5, 0.1},
		{"past an empty bucket", map[float64]float64{0.1: 2, 0.2: 2, 0.4: 10, inf: 10}, 0.5, 0.2 + 0.2*3/8},
		{"in +Inf: the last finite bound", map[float64]float64{0.1: 5, 0.2: 6, inf: 10}, 0.99, 0.2},
		{"the whole", map[float64]float64{0.1: 5, 0.2: 10, inf: 10}, 1, 0.2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := histogramQuantile(tt.cumulative, tt.q)
			if math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("histogramQuantile(%v, %v) = %v, want %v", tt.cumulative, tt.q, got, tt.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	ms := func(ns ...int) []time.Duration {
		var d []time.Duration
		for _, n := range ns {
			d = append(d, time.Duration(n)*time.Millisecond)
		}
		return d
	}
	// Two rounds of a paymentsd path: 4 and 6 measured calls, 1 s each.
	paymentsd := &path{name: "grpc/sqlite", api: "grpc", store: "sqlite", floor: "grpc-floor", recordFloor: "record-grpc/sqlite", svc: &serviceProcess{}}
	samples := []sample{
		{
			round:        roundResult{Requests: 4, Errors: 1, NewProviderConns: 3, Replays: 0},
			load:         load{latencies: ms(1, 2, 3, 4), elapsed: time.Second},
			warmupErrors: 2, firstErr: "first",
			cpu: cpuReading{svc: 40 * time.Millisecond, fake: 20 * time.Millisecond, self: 10 * time.Millisecond},
			storeOps: serviceMetrics{storeOps: map[string]float64{"begin": 4, "finish": 4}, commits: 6, hasCommits: true,
				window: map[float64]float64{0.001: 2, 0.01: 4, math.Inf(1): 4}},
		},
		{
			round:    roundResult{Requests: 6, NewProviderConns: 1, Replays: 1},
			load:     load{latencies: ms(5, 6, 7, 8, 9, 10), elapsed: time.Second},
			firstErr: "second",
			cpu:      cpuReading{svc: 60 * time.Millisecond, fake: 30 * time.Millisecond, self: 15 * time.Millisecond},
			storeOps: serviceMetrics{storeOps: map[string]float64{"begin": 6, "finish": 6}, commits: 4, hasCommits: true,
				window: map[float64]float64{0.001: 4, 0.01: 6, math.Inf(1): 6}},
		},
	}
	got := summarize(paymentsd, 32, samples)
	want := phaseResult{
		Path: "grpc/sqlite", API: "grpc", Store: "sqlite", Floor: "grpc-floor", RecordFloor: "record-grpc/sqlite",
		Concurrency: 32, Requests: 10, Rounds: 2, Errors: 1, WarmupErrors: 2, FirstError: "first",
		Seconds: 2, RPS: 5,
		P50Micros: 5000, P99Micros: 10000, MaxMicros: 10000, // pooled over both rounds
		ServiceCPUMicros: 100000, ProviderCPUMicros: 50000, LoadCPUMicros: 25000,
		ServiceCPUPerCallMicros: 10000, ProviderCPUPerCallMicros: 5000, LoadCPUPerCallMicros: 2500,
		ServiceProviderCPURatio: 2,
		MaxNewProviderConns:     3,
		StoreOpsPerCall:         map[string]float64{"begin": 1, "finish": 1},
		CommitsPerCall:          1,
		Replays:                 1,
		// 10 observations: 6 under 1 ms, 10 under 10 ms. The median (rank
		// 5) is 5/6 of the way up the first bucket; the 99th (rank 9.9)
		// 3.9/4 of the way up the second.
		OutcomeCommitP50Micros: 1e6 * 0.001 * 5 / 6,
		OutcomeCommitP99Micros: 1e6 * (0.001 + 0.009*3.9/4),
		PerRound:               []roundResult{samples[0].round, samples[1].round},
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("summarize(paymentsd, 32, two rounds) differs (-want +got):\n%s", diff)
	}

	// A path that is not paymentsd has no store figures; a provider that
	// used no CPU, no CPU ratio.
	direct := &path{name: "direct", proto: "http"}
	samples[0].cpu.fake, samples[1].cpu.fake = 0, 0
	got = summarize(direct, 1, samples)
	if got.StoreOpsPerCall != nil || got.CommitsPerCall != 0 || got.OutcomeCommitP50Micros != 0 || got.ServiceProviderCPURatio != 0 {
		t.Errorf("summarize(direct) = store ops %v, commits %v, outcome p50 %v, CPU ratio %v; want none", got.StoreOpsPerCall, got.CommitsPerCall, got.OutcomeCommitP50Micros, got.ServiceProviderCPURatio)
	}
}

// exposition is paymentsd's /metrics as its Prometheus client writes
// them, cut to the families the benchmark reads (and one it doesn't).
const exposition = `# HELP paymentsd_provider_connections_opened_total Connections opened to the provider.
# TYPE paymentsd_provider_connections_opened_total counter
paymentsd_provider_connections_opened_total{environment="sandbox"} 12
# HELP paymentsd_replays_total Calls answered from an earlier record.
# TYPE paymentsd_replays_total counter
paymentsd_replays_total{environment="sandbox"} 1
# HELP paymentsd_store_commits_total Write transactions committed.
# TYPE paymentsd_store_commits_total counter
paymentsd_store_commits_total{environment="sandbox"} 700
# HELP paymentsd_store_duration_seconds Record store operations.
# TYPE paymentsd_store_duration_seconds histogram
paymentsd_store_duration_seconds_bucket{environment="sandbox",op="begin",le="0.001"} 400
paymentsd_store_duration_seconds_bucket{environment="sandbox",op="begin",le="+Inf"} 500
paymentsd_store_duration_seconds_sum{environment="sandbox",op="begin"} 0.9
paymentsd_store_duration_seconds_count{environment="sandbox",op="begin"} 500
paymentsd_store_duration_seconds_bucket{environment="sandbox",op="finish",le="0.001"} 300
paymentsd_store_duration_seconds_bucket{environment="sandbox",op="finish",le="+Inf"} 499
paymentsd_store_duration_seconds_sum{environment="sandbox",op="finish"} 0.8
paymentsd_store_duration_seconds_count{environment="sandbox",op="finish"} 499
# HELP paymentsd_outcome_commit_seconds From the provider's answer to its record's commit.
# TYPE paymentsd_outcome_commit_seconds histogram
paymentsd_outcome_commit_seconds_bucket{environment="sandbox",le="0.001"} 200
paymentsd_outcome_commit_seconds_bucket{environment="sandbox",le="0.01"} 480
paymentsd_outcome_commit_seconds_bucket{environment="sandbox",le="+Inf"} 500
paymentsd_outcome_commit_seconds_sum{environment="sandbox"} 1.5
paymentsd_outcome_commit_seconds_count{environment="sandbox"} 500
# HELP go_goroutines Number of goroutines.
# TYPE go_goroutines gauge
go_goroutines 42
`

func TestParseMetrics(t *testing.T) {
	t.Parallel()
	inf := math.Inf(1)
	full := serviceMetrics{
		connsOpened: 12, replays: 1, commits: 700, hasCommits: true,
		storeOps: map[string]float64{"begin": 500, "finish": 499},
		window:   map[float64]float64{0.001: 200, 0.01: 480, inf: 500},
	}
	tests := []struct {
		name    string
		text    string
		want    serviceMetrics
		wantErr bool
	}{
		{"as paymentsd writes them", exposition, full, false},
		{
			// The text format allows a timestamp after the value.
			"with timestamps",
			strings.ReplaceAll(exposition, "} 12\n", "} 12 1764300000000\n"),
			full, false,
		},
		{
			// Series of two environments (or replicas) add up.
			"two series of a counter",
			exposition + `paymentsd_provider_connections_opened_total{environment="live"} 3` + "\n",
			func() serviceMetrics { m := full; m.connsOpened = 15; return m }(), false,
		},
		{
			// An op is a label's value, wherever the label is.
			"labels in another order",
			strings.ReplaceAll(exposition, `{environment="sandbox",op="begin"`, `{op="begin",environment="sandbox"`),
			full, false,
		},
		{
			"a paymentsd without store commits or the outcome histogram",
			`# TYPE paymentsd_provider_connections_opened_total counter
paymentsd_provider_connections_opened_total{environment="sandbox"} 2
# TYPE paymentsd_store_duration_seconds histogram
paymentsd_store_duration_seconds_bucket{environment="sandbox",op="begin",le="+Inf"} 4
paymentsd_store_duration_seconds_sum{environment="sandbox",op="begin"} 0.1
paymentsd_store_duration_seconds_count{environment="sandbox",op="begin"} 4
`,
			serviceMetrics{connsOpened: 2, storeOps: map[string]float64{"begin": 4}, window: map[float64]float64{}}, false,
		},
		{"not paymentsd's", "# TYPE go_goroutines gauge\ngo_goroutines 42\n", serviceMetrics{}, true},
		{"not Prometheus text", "<html>502 Bad Gateway</html>\n", serviceMetrics{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseMetrics(strings.NewReader(tt.text))
			if tt.wantErr {
				if err == nil {
					t.Errorf("parseMetrics = %+v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseMetrics = %v", err)
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(serviceMetrics{})); diff != "" {
				t.Errorf("parseMetrics differs (-want +got):\n%s", diff)
			}
		})
	}
}
