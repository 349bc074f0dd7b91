package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"example.com/paymentsd/internal/proc"
)

// phaseResult is one path at one concurrency, over every round.
type phaseResult struct {
	Path string `json:"path"`
	// API is "grpc" or "rest" for paymentsd; Store its record store; Floor
	// the path its ratios are against.
	API   string `json:"api,omitempty"`
	Store string `json:"store,omitempty"`
	Floor string `json:"floor,omitempty"`
	// RecordFloor is the record floor of paymentsd's path and store (see
	// recordFloor), "" for the other paths and the in-memory store.
	RecordFloor string `json:"record_floor,omitempty"`
	// Baseline: the path is paymentsd as built at -baseline, and its name
	// ends in baselineSuffix.
	Baseline    bool `json:"baseline,omitempty"`
	Concurrency int  `json:"concurrency"`
	// Requests counts the measured calls of every round together.
	Requests int `json:"requests"`
	Rounds   int `json:"rounds"`
	Errors   int `json:"errors"`
	// WarmupErrors are failed calls among the unmeasured warm-up calls.
	WarmupErrors int    `json:"warmup_errors"`
	FirstError   string `json:"first_error,omitempty"`

	// Seconds is the measured time of every round together; RPS and the
	// latency percentiles are over every measured call.
	Seconds   float64 `json:"seconds"`
	RPS       float64 `json:"rps"`
	P50Micros float64 `json:"p50_us"`
	P99Micros float64 `json:"p99_us"`
	MaxMicros float64 `json:"max_us"`

	// CPU time used during the measured calls, in total and per call, by
	// paymentsd, the fake provider and this load generator.
	ServiceCPUMicros         float64 `json:"service_cpu_us"`
	ProviderCPUMicros        float64 `json:"provider_cpu_us"`
	LoadCPUMicros            float64 `json:"loadgen_cpu_us"`
	ServiceCPUPerCallMicros  float64 `json:"service_cpu_per_call_us"`
	ProviderCPUPerCallMicros float64 `json:"provider_cpu_per_call_us"`
	LoadCPUPerCallMicros     float64 `json:"loadgen_cpu_per_call_us"`
	// ServiceProviderCPURatio is service over provider CPU per call.
	ServiceProviderCPURatio float64 `json:"service_provider_cpu_ratio"`

	// MaxNewProviderConns is the most connections the fake provider
	// accepted (from anyone) in one round, from the start of its warm-up
	// to its end; the first round is the one that fills the pools.
	MaxNewProviderConns int64 `json:"max_new_provider_connections_per_round"`

	// StoreOpsPerCall counts paymentsd's record store operations per
	// measured call, by op; CommitsPerCall its transactions per call.
	StoreOpsPerCall map[string]float64 `json:"store_ops_per_call,omitempty"`
	CommitsPerCall  float64            `json:"commits_per_call,omitempty"`
	// Replays counts calls paymentsd answered from an earlier record,
	// warm-ups included: with a key per call it must be 0.
	Replays float64 `json:"replays"`
	// OutcomeCommitP50Micros and OutcomeCommitP99Micros estimate, from
	// paymentsd's paymentsd_outcome_commit_seconds histogram over the
	// measured calls (interpolating within its buckets), the time from
	// the provider's answer to the commit of its record: the window in
	// which a replica that dies leaves the key to be sent again. Absent for
	// a paymentsd without the histogram.
	OutcomeCommitP50Micros float64 `json:"outcome_commit_p50_us,omitempty"`
	OutcomeCommitP99Micros float64 `json:"outcome_commit_p99_us,omitempty"`

	PerRound []roundResult `json:"per_round"`
}

// roundResult is one round of a phase: its warm-up, then Requests
// measured calls.
type roundResult struct {
	Requests                 int     `json:"requests"`
	Errors                   int     `json:"errors"`
	RPS                      float64 `json:"rps"`
	P50Micros                float64 `json:"p50_us"`
	P99Micros                float64 `json:"p99_us"`
	ServiceCPUPerCallMicros  float64 `json:"service_cpu_per_call_us"`
	ProviderCPUPerCallMicros float64 `json:"provider_cpu_per_call_us"`
	// NewProviderConns were accepted by the fake provider, and
	// ServiceConnsOpened counted by paymentsd's
	// paymentsd_provider_connections_opened_total, warm-up included.
	NewProviderConns   int64   `json:"new_provider_connections"`
	ServiceConnsOpened float64 `json:"service_provider_connections_opened"`
	// ProviderRequests is what the fake provider served, warm-up included:
	// more than the calls would mean paymentsd retried.
	ProviderRequests int64 `json:"provider_requests"`
	// Replays is paymentsd's paymentsd_replays_total over the round.
	Replays float64 `json:"replays"`
}

// sample is what one round of a phase measured.
type sample struct {
	round        roundResult
	load         load
	warmupErrors int
	firstErr     string
	cpu          cpuReading     // used during the measured calls
	storeOps     serviceMetrics // paymentsd's store counts over the measured calls
}

// summarize pools the rounds of one phase.
func summarize(p *path, concurrency int, samples []sample) phaseResult {
	r := phaseResult{Path: p.name, API: p.api, Store: p.store, Floor: p.floor, RecordFloor: p.recordFloor, Baseline: p.baseline,
		Concurrency: concurrency, Rounds: len(samples)}
	ops := map[string]float64{}
	window := map[float64]float64{}
	var commits float64
	var latencies [][]time.Duration
	var elapsed time.Duration
	var cpu cpuReading
	for _, s := range samples {
		r.Requests += s.round.Requests
		r.Errors += s.round.Errors
		r.WarmupErrors += s.warmupErrors
		if r.FirstError == "" {
			r.FirstError = s.firstErr
		}
		latencies = append(latencies, s.load.latencies)
		elapsed += s.load.elapsed
		cpu.svc += s.cpu.svc
		cpu.fake += s.cpu.fake
		cpu.self += s.cpu.self
		r.MaxNewProviderConns = max(r.MaxNewProviderConns, s.round.NewProviderConns)
		r.Replays += s.round.Replays
		for op, n := range s.storeOps.storeOps {
			ops[op] += n
		}
		commits += s.storeOps.commitCount()
		for le, c := range s.storeOps.window {
			window[le] += c
		}
		r.PerRound = append(r.PerRound, s.round)
	}
	all := slices.Concat(latencies...)
	slices.Sort(all)
	n := float64(r.Requests)
	r.Seconds = elapsed.Seconds()
	r.RPS = n / r.Seconds
	r.P50Micros = micros(percentile(all, 50))
	r.P99Micros = micros(percentile(all, 99))
	r.MaxMicros = micros(percentile(all, 100))
	r.ServiceCPUMicros = micros(cpu.svc)
	r.ProviderCPUMicros = micros(cpu.fake)
	r.LoadCPUMicros = micros(cpu.self)
	r.ServiceCPUPerCallMicros = r.ServiceCPUMicros / n
	r.ProviderCPUPerCallMicros = r.ProviderCPUMicros / n
	r.LoadCPUPerCallMicros = r.LoadCPUMicros / n
	if cpu.fake > 0 {
		r.ServiceProviderCPURatio = r.ServiceCPUMicros / r.ProviderCPUMicros
	}
	if p.svc != nil {
		r.StoreOpsPerCall = map[string]float64{}
		for op, c := range ops {
			r.StoreOpsPerCall[op] = c / n
		}
		r.CommitsPerCall = commits / n
		r.OutcomeCommitP50Micros = 1e6 * histogramQuantile(window, 0.50)
		r.OutcomeCommitP99Micros = 1e6 * histogramQuantile(window, 0.99)
	}
	return r
}

// histogramQuantile estimates the q-quantile of a histogram's cumulative
// bucket counts (by upper bound, +Inf included) as Prometheus's
// histogram_quantile does: linearly within the bucket it falls in. 0 for
// an empty histogram.
func histogramQuantile(cumulative map[float64]float64, q float64) float64 {
	les := slices.Sorted(maps.Keys(cumulative))
	if len(les) == 0 || cumulative[les[len(les)-1]] == 0 {
		return 0
	}
	total := cumulative[les[len(les)-1]]
	rank := q * total
	lower, below := 0.0, 0.0
	for _, le := range les {
		c := cumulative[le]
		if c >= rank {
			if math.IsInf(le, 1) {
				return lower // past the last finite bucket: its bound
			}
			if c == below {
				return le
			}
			return lower + (le-lower)*(rank-below)/(c-below)
		}
		lower, below = le, c
	}
	return lower
}

// path is one way of making a payment that the benchmark measures.
type path struct {
	name string // "direct", "proxy-floor", "grpc-floor", "grpc/sqlite", …
	// proto is "http" (direct and the ReverseProxy) or "grpc"; api is
	// "grpc" or "rest" for paymentsd, "" otherwise.
	proto, api string
	// store is paymentsd's record store, "" for the direct path and floors.
	store string
	// floor is the name of the path this one's ratios are taken against;
	// recordFloor, for paymentsd, its record floor's.
	floor, recordFloor string
	call               caller
	// proc is the process whose CPU is the path's ("svc"); nil for direct.
	proc *proc.Process
	// svc is set for paymentsd, whose /metrics are read.
	svc *serviceProcess
	// baseline: the path is paymentsd built at -baseline.
	baseline bool
}

// meter runs phases against one fake provider.
type meter struct {
	fake   *fakeProcess
	tick   time.Duration
	scrape *http.Client
}

// cpuReading is CPU time used by each process.
type cpuReading struct{ svc, fake, self time.Duration }

func (m *meter) readCPU(p *path) (cpuReading, error) {
	var r cpuReading
	var err1, err2, err3 error
	if p.proc != nil {
		r.svc, err1 = cpuTime(p.proc.Pid(), m.tick)
	}
	r.fake, err2 = cpuTime(m.fake.Pid(), m.tick)
	r.self, err3 = cpuTime(os.Getpid(), m.tick)
	return r, errors.Join(err1, err2, err3)
}

// round makes warmup unmeasured calls, then n measured ones, at
// concurrency, and measures them.
func (m *meter) round(ctx context.Context, p *path, keyPrefix string, concurrency, n, warmup int, prof *profiler) (sample, error) {
	var s sample
	statsBefore, err := m.fake.readStats(ctx, m.scrape)
	if err != nil {
		return s, err
	}
	var metricsBefore, metricsAfter serviceMetrics
	if p.svc != nil {
		if metricsBefore, err = p.svc.readMetrics(ctx, m.scrape); err != nil {
			return s, err
		}
	}
	if warmup > 0 {
		w := generate(ctx, p.call, keyPrefix+"warmup-", warmup, concurrency)
		s.warmupErrors = w.errors
		if w.firstErr != nil {
			s.firstErr = "warm-up: " + w.firstErr.Error()
		}
	}

	if prof != nil {
		if err := prof.start(ctx); err != nil {
			return s, err
		}
	}
	var storeBefore, storeAfter serviceMetrics
	if p.svc != nil {
		if storeBefore, err = p.svc.readMetrics(ctx, m.scrape); err != nil {
			return s, err
		}
	}
	before, err := m.readCPU(p)
	if err != nil {
		return s, err
	}
	s.load = generate(ctx, p.call, keyPrefix, n, concurrency)
	after, err := m.readCPU(p)
	if prof != nil {
		prof.stop()
	}
	if err != nil {
		return s, err
	}
	if p.proc != nil {
		if err := p.proc.CheckRunning(); err != nil {
			return s, err
		}
	}
	if err := m.fake.CheckRunning(); err != nil {
		return s, err
	}
	if err := ctx.Err(); err != nil {
		return s, err
	}
	statsAfter, err := m.fake.readStats(ctx, m.scrape)
	if err != nil {
		return s, err
	}
	if p.svc != nil {
		if storeAfter, err = p.svc.readMetrics(ctx, m.scrape); err != nil {
			return s, err
		}
		metricsAfter = storeAfter
	}

	s.cpu = cpuReading{svc: after.svc - before.svc, fake: after.fake - before.fake, self: after.self - before.self}
	if s.load.firstErr != nil && s.firstErr == "" {
		s.firstErr = s.load.firstErr.Error()
	}
	s.round = roundResult{
		Requests:                 n,
		Errors:                   s.load.errors,
		RPS:                      float64(n) / s.load.elapsed.Seconds(),
		P50Micros:                micros(percentile(s.load.latencies, 50)),
		P99Micros:                micros(percentile(s.load.latencies, 99)),
		ServiceCPUPerCallMicros:  micros(s.cpu.svc) / float64(n),
		ProviderCPUPerCallMicros: micros(s.cpu.fake) / float64(n),
		NewProviderConns:         statsAfter.Connections - statsBefore.Connections,
		ServiceConnsOpened:       metricsAfter.connsOpened - metricsBefore.connsOpened,
		ProviderRequests:         statsAfter.Requests - statsBefore.Requests,
		Replays:                  metricsAfter.replays - metricsBefore.replays,
	}
	if p.svc != nil {
		s.storeOps = storeAfter.sub(storeBefore)
	}
	return s, nil
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// newScrapeClient is for statistics and metrics, apart from the load, so
// that reading them neither uses nor opens the load's connections.
func newScrapeClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2}, Timeout: 10 * time.Second}
}

// serviceMetrics are the figures read from paymentsd's /metrics.
type serviceMetrics struct {
	connsOpened float64 // paymentsd_provider_connections_opened_total
	replays     float64 // paymentsd_replays_total
	// storeOps counts record store operations by op, from
	// paymentsd_store_duration_seconds_count{op}; commits counts the
	// store's transactions, from paymentsd_store_commits_total, where
	// several operations may share one (and one fsync).
	storeOps map[string]float64
	commits  float64
	// hasCommits: paymentsd exports paymentsd_store_commits_total; without
	// it, every operation is taken as a commit of its own.
	hasCommits bool
	// window is paymentsd_outcome_commit_seconds's cumulative bucket
	// counts, by upper bound.
	window map[float64]float64
}

// sub is m − before, for the store's counts.
func (m serviceMetrics) sub(before serviceMetrics) serviceMetrics {
	d := serviceMetrics{storeOps: map[string]float64{}, hasCommits: m.hasCommits}
	for op, n := range m.storeOps {
		d.storeOps[op] = n - before.storeOps[op]
	}
	d.commits = m.commits - before.commits
	d.connsOpened = m.connsOpened - before.connsOpened
	d.replays = m.replays - before.replays
	d.window = map[float64]float64{}
	for le, c := range m.window {
		d.window[le] = c - before.window[le]
	}
	return d
}

// commitCount is the number of commits m counts.
func (m serviceMetrics) commitCount() float64 {
	if m.hasCommits {
		return m.commits
	}
	var n float64
	for op, c := range m.storeOps {
		if op != "get" && op != "stats" { // reads commit nothing
			n += c
		}
	}
	return n
}

// readMetrics reads paymentsd's /metrics.
func (s *serviceProcess) readMetrics(ctx context.Context, client *http.Client) (serviceMetrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.httpAddr+"/metrics", nil)
	if err != nil {
		return serviceMetrics{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return serviceMetrics{}, err
	}
	defer resp.Body.Close()
	m, err := parseMetrics(resp.Body)
	io.Copy(io.Discard, resp.Body)
	if err != nil {
		return m, fmt.Errorf("GET /metrics: %w", err)
	}
	return m, nil
}

// parseMetrics reads the figures of serviceMetrics from paymentsd's
// /metrics, in Prometheus's text format, with Prometheus's own parser.
// A counter's series (one per environment) add up.
func parseMetrics(r io.Reader) (serviceMetrics, error) {
	m := serviceMetrics{storeOps: map[string]float64{}, window: map[float64]float64{}}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return m, err
	}
	opened, ok := families["paymentsd_provider_connections_opened_total"]
	if !ok {
		return m, errors.New("no paymentsd_provider_connections_opened_total")
	}
	m.connsOpened = counterSum(opened)
	m.replays = counterSum(families["paymentsd_replays_total"])
	if commits, ok := families["paymentsd_store_commits_total"]; ok {
		m.commits, m.hasCommits = counterSum(commits), true
	}
	for _, s := range families["paymentsd_store_duration_seconds"].GetMetric() {
		for _, l := range s.GetLabel() {
			if l.GetName() == "op" {
				m.storeOps[l.GetValue()] += float64(s.GetHistogram().GetSampleCount())
			}
		}
	}
	for _, s := range families["paymentsd_outcome_commit_seconds"].GetMetric() {
		h := s.GetHistogram()
		for _, b := range h.GetBucket() {
			m.window[b.GetUpperBound()] += float64(b.GetCumulativeCount())
		}
		if len(h.GetBucket()) > 0 && !math.IsInf(h.GetBucket()[len(h.GetBucket())-1].GetUpperBound(), 1) {
			// +Inf's count is the histogram's, when not given as a bucket.
			m.window[math.Inf(1)] += float64(h.GetSampleCount())
		}
	}
	return m, nil
}

// counterSum is the sum of a counter family's series.
func counterSum(f *dto.MetricFamily) float64 {
	var n float64
	for _, s := range f.GetMetric() {
		n += s.GetCounter().GetValue()
	}
	return n
}

// profiler takes a CPU profile of a paymentsd built with the
// benchprofile tag, from SIGUSR1 to SIGUSR2, and copies it to out.
type profiler struct {
	svc *serviceProcess
	out string
	log io.Writer
}

func (p *profiler) start(context.Context) error {
	os.Remove(p.svc.profile + ".done")
	return p.svc.Signal(syscall.SIGUSR1)
}

func (p *profiler) stop() {
	if err := p.svc.Signal(syscall.SIGUSR2); err != nil {
		fmt.Fprintf(p.log, "profile: %v\n", err)
		return
	}
	for range 100 {
		if _, err := os.Stat(p.svc.profile + ".done"); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	b, err := os.ReadFile(p.svc.profile)
	if err == nil {
		if err = os.MkdirAll(filepath.Dir(p.out), 0o755); err == nil {
			err = os.WriteFile(p.out, b, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintf(p.log, "profile: %v\n", err)
		return
	}
	fmt.Fprintf(p.log, "CPU profile of %s: %s (go tool pprof -top %s)\n", p.svc.Name, p.out, p.out)
}
