package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// phaseResult is one path at one concurrency, over every round.
type phaseResult struct {
	Path        string `json:"path"`
	Concurrency int    `json:"concurrency"`
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
}

// sample is what one round of a phase measured.
type sample struct {
	round        roundResult
	load         load
	warmupErrors int
	firstErr     string
	cpu          cpuReading // used during the measured calls
}

// summarize pools the rounds of one phase.
func summarize(path string, concurrency int, samples []sample) phaseResult {
	r := phaseResult{Path: path, Concurrency: concurrency, Rounds: len(samples)}
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
	return r
}

// meter runs phases against one paymentsd and one fake provider.
type meter struct {
	svc    *serviceProcess
	fake   *fakeProcess
	tick   time.Duration
	scrape *http.Client
}

// cpuReading is CPU time used by each process.
type cpuReading struct{ svc, fake, self time.Duration }

func (m *meter) readCPU() (cpuReading, error) {
	var r cpuReading
	var err1, err2, err3 error
	r.svc, err1 = cpuTime(m.svc.pid(), m.tick)
	r.fake, err2 = cpuTime(m.fake.pid(), m.tick)
	r.self, err3 = cpuTime(os.Getpid(), m.tick)
	return r, errors.Join(err1, err2, err3)
}

// round makes warmup unmeasured calls, then n measured ones, at
// concurrency, and measures them.
func (m *meter) round(ctx context.Context, call caller, keyPrefix string, concurrency, n, warmup int, prof *profiler) (sample, error) {
	var s sample
	statsBefore, err := m.fake.readStats(ctx, m.scrape)
	if err != nil {
		return s, err
	}
	openedBefore, err := m.svc.connectionsOpened(ctx, m.scrape)
	if err != nil {
		return s, err
	}
	if warmup > 0 {
		w := generate(ctx, call, keyPrefix+"warmup-", warmup, concurrency)
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
	before, err := m.readCPU()
	if err != nil {
		return s, err
	}
	s.load = generate(ctx, call, keyPrefix, n, concurrency)
	if prof != nil {
		defer prof.stop()
	}
	if err := errors.Join(m.svc.checkRunning(), m.fake.checkRunning()); err != nil {
		return s, err
	}
	after, err := m.readCPU()
	if err != nil {
		return s, err
	}
	if err := ctx.Err(); err != nil {
		return s, err
	}
	statsAfter, err := m.fake.readStats(ctx, m.scrape)
	if err != nil {
		return s, err
	}
	openedAfter, err := m.svc.connectionsOpened(ctx, m.scrape)
	if err != nil {
		return s, err
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
		ServiceConnsOpened:       openedAfter - openedBefore,
		ProviderRequests:         statsAfter.Requests - statsBefore.Requests,
	}
	return s, nil
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// newScrapeClient is for statistics and metrics, apart from the load, so
// that reading them neither uses nor opens the load's connections.
func newScrapeClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2}, Timeout: 10 * time.Second}
}

// connectionsOpened reads paymentsd_provider_connections_opened_total
// from paymentsd's /metrics.
func (s *serviceProcess) connectionsOpened(ctx context.Context, client *http.Client) (float64, error) {
	const name = "paymentsd_provider_connections_opened_total"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.httpAddr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		// paymentsd_provider_connections_opened_total{environment="sandbox"} 3
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name); ok && rest != "" && (rest[0] == '{' || rest[0] == ' ') {
			f := strings.Fields(line)
			return strconv.ParseFloat(f[len(f)-1], 64)
		}
	}
	io.Copy(io.Discard, resp.Body)
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("GET /metrics: no %s", name)
}

// profiler records a perf profile of one process, with call graphs.
type profiler struct {
	pid int
	out string
	log io.Writer
	cmd *exec.Cmd
}

func (p *profiler) start(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(p.out), 0o755); err != nil {
		return err
	}
	p.cmd = exec.CommandContext(ctx, "perf", "record", "-F", "999", "-g", "-p", strconv.Itoa(p.pid), "-o", p.out)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	setDeathSignal(p.cmd)
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("perf: %w", err)
	}
	return nil
}

// stop ends the recording; perf writes its file when interrupted.
func (p *profiler) stop() {
	p.cmd.Process.Signal(os.Interrupt)
	p.cmd.Wait()
	fmt.Fprintf(p.log, "perf profile of paymentsd: %s (perf report -i %s)\n", p.out, p.out)
}
