package main

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/service"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/testenv"
)

// TestAlertsOnARealPrometheus loads deploy/monitoring/alerts.yaml into a
// real Prometheus (Debian's prometheus package: 2.42 on bookworm, which
// .ci/run installs), which scrapes a running paymentsd's metrics port every
// second and evaluates the rules every second. Through
// Prometheus' HTTP API it sees every rule evaluate without error, absence
// per environment (live, never scraped here, is absent; sandbox is not),
// PaymentsdRecordsUnsettled fire once a payment's outcome stays unknown
// past its settlement window, no alert come of refused resolutions, and
// PaymentsdRecordsUnsettled clear once the on-call resolves the payment
// with the CLI.
//
// Prometheus gets a copy of the rules with every `for:` set to 0s (see
// rulesWithoutFor), so that an alert fires at the first evaluation its
// expression holds, rather than minutes later; the copy is checked to
// differ from the rules in nothing else. Without `for`, one failed scrape
// fires the absence alerts: on a loaded machine a scrape of paymentsd can
// outlast its 1 s timeout, and Prometheus then marks every series of the
// target stale, so absent() holds until the next scrape succeeds (as
// PaymentsdAbsent{environment="sandbox"} did, and the store errors query
// came back empty). The rules keep `for: 5m` against exactly that; the
// test reads alerts and queries only from evaluations that followed
// scrapes that all succeeded (onFreshScrapes), and looks again after one
// that failed.
func TestAlertsOnARealPrometheus(t *testing.T) {
	t.Parallel()
	bin := prometheusBinary(t)
	p := idempotentProvider(t)
	p.SetScript(func(_ int, r simulator.Request) simulator.Reply {
		if idempotencyKey(r.Body) == "k-doubt" {
			return simulator.Reply{Fault: simulator.Reset}
		}
		return simulator.Reply{}
	})
	d := newCLIDeployment(t, with(sandboxEnv(p),
		"PAYMENTS_UPSTREAM_MAX_ATTEMPTS", "1",
		"PAYMENTS_UPSTREAM_BREAKER_FAILURES", "1000",
		"PAYMENTS_SETTLEMENT_WINDOW", "1500ms",
		"PAYMENTS_UPSTREAM_TIMEOUT", "500ms",
		"PAYMENTS_PROVIDER_QUIET_PERIOD", "1s",
		"PAYMENTS_METRICS_ADDR", "127.0.0.1:0",
	))
	in := start(t, d.env)
	metricsAddr, _ := in.logs.lines("serving")[0]["metrics_addr"].(string)
	prom := startPrometheus(t, bin, rulesWithoutFor(t, alertsFile, t.TempDir()), metricsAddr)

	// Every rule loads and evaluates on this Prometheus.
	var alerts alertSet
	prom.onFreshScrapes(t, time.Now(), func() {
		prom.checkRulesHealthy(t)
		alerts = prom.activeAlerts(t)
	})
	if !alerts.has("PaymentsdAbsent", "live") || alerts.has("PaymentsdAbsent", "sandbox") {
		t.Errorf("active alerts with only sandbox scraped:\n%v\nwant PaymentsdAbsent for live alone", alerts)
	}

	// A payment goes unknown and settlement gives up on it.
	shop := d.checkoutClient(t, in)
	if _, err := shop.CreateMultiCardPayment(t.Context(), validRequest("k-ok")); err != nil {
		t.Fatalf("CreateMultiCardPayment(k-ok) = %v", err)
	}
	_, err := shop.CreateMultiCardPayment(t.Context(), validRequest("k-doubt"))
	checkReason(t, status.Convert(err), "PAYMENT_OUTCOME_UNKNOWN")
	waitGaveUp(t, in, 1)
	prom.waitAlert(t, "PaymentsdRecordsUnsettled", "sandbox", true)
	before := prom.settledAlerts(t)

	// Refused resolutions: a payment that is not in doubt, and one changed
	// since it was looked at (an update time from before the give-up). The
	// second also waits out the quiet period of settlement's last request,
	// refused as PAYMENT_IN_PROGRESS. (The CLI refuses the first itself,
	// before sending anything, so these go over gRPC.)
	adminCert, err := tls.LoadX509KeyPair(d.adminCert, d.adminKey)
	if err != nil {
		t.Fatal(err)
	}
	oncall := newParty(t, in, d.serverCA, adminCert, "oncall").client
	_, err = oncall.ResolveMultiCardPayment(t.Context(), &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k-ok",
		Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED, Evidence: "x"})
	checkCode(t, "ResolveMultiCardPayment of a payment that succeeded", err, codes.FailedPrecondition, service.ReasonRecordNotUnknown)
	seen, err := oncall.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-doubt"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = resolveWhenQuiet(t, oncall, &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k-doubt",
		Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED, Evidence: "x",
		ExpectedUpdateTime: timestamppb.New(seen.GetUpdateTime().AsTime().Add(-time.Millisecond))})
	checkCode(t, "ResolveMultiCardPayment with an old update time", err, codes.FailedPrecondition, service.ReasonRecordChanged)
	refused := time.Now()

	// Once Prometheus has scraped what followed and evaluated the rules on
	// it, the alerts are those from before.
	const resolveErrors = `sum(paymentsd_store_errors_total{op="resolve"})`
	var after alertSet
	var errs model.Value
	prom.onFreshScrapes(t, refused, func() {
		after = prom.activeAlerts(t)
		errs = prom.query(t, resolveErrors)
	})
	if !slices.Equal(after.keys(), before.keys()) {
		t.Errorf("active alerts after refused resolutions:\n%v\nwant those from before:\n%v", after, before)
	}
	if vec, ok := errs.(model.Vector); !ok || len(vec) != 1 || vec[0].Value != 0 {
		t.Errorf("Prometheus reads %s = %v after refused resolutions, want 0", resolveErrors, errs)
	}

	// The on-call resolves it with the CLI, as the runbook says, and the
	// alert clears.
	if r := runCLI(t, "", "resolve", d.admin(in), "k-doubt", "--outcome", "not-created", "--evidence", "not on the provider's dashboard", "--yes"); r.code != 0 {
		t.Fatalf("resolve k-doubt:\n%v\nwant exit 0", r)
	}
	prom.waitAlert(t, "PaymentsdRecordsUnsettled", "sandbox", false)
}

// prometheusBinary is Debian's prometheus. Without it the test is skipped,
// except under CI=true, where it fails: CI must not pass by skipping.
func prometheusBinary(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		testenv.Missing(t, "prometheus is not installed (Debian: apt-get install prometheus; .ci/run installs it): %v", err)
	}
	return bin
}

// rulesWithoutFor writes to dir a copy of the rules file src with every
// rule's `for:` set to 0s, and returns its path. Everything else (the
// expressions and their windows, labels, annotations) is as in src: the
// test fails if the two files, read back, differ anywhere but in `for`.
func rulesWithoutFor(t *testing.T, src, dir string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s: %v", src, err)
	}
	for _, rule := range ruleNodes(t, &doc) {
		for i := 0; i+1 < len(rule.Content); i += 2 {
			if rule.Content[i].Value == "for" {
				rule.Content[i+1].Value = "0s"
			}
		}
	}
	out, err := yaml.Marshal(&doc)
	if err != nil {
		t.Fatal(err)
	}
	// Read back, with `for` taken out of every rule, the two are equal.
	withoutFor := func(b []byte) (rules any, fors []string) {
		var v struct {
			Groups []struct {
				Name  string           `yaml:"name"`
				Rules []map[string]any `yaml:"rules"`
			} `yaml:"groups"`
		}
		if err := yaml.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		for _, g := range v.Groups {
			for _, r := range g.Rules {
				if f, ok := r["for"]; ok {
					fors = append(fors, fmt.Sprint(f))
					delete(r, "for")
				}
			}
		}
		return v, fors
	}
	orig, origFors := withoutFor(b)
	copied, copiedFors := withoutFor(out)
	if diff := cmp.Diff(orig, copied); diff != "" {
		t.Fatalf("the rules' copy differs from %s other than in `for` (-original +copy):\n%s", src, diff)
	}
	if len(copiedFors) != len(origFors) || slices.ContainsFunc(copiedFors, func(f string) bool { return f != "0s" }) {
		t.Fatalf("the rules' copy has `for` %v, want 0s wherever %s has one (%v)", copiedFors, src, origFors)
	}
	path := filepath.Join(dir, "alerts.yaml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// ruleNodes returns the mapping node of every rule of every group.
func ruleNodes(t *testing.T, doc *yaml.Node) []*yaml.Node {
	t.Helper()
	value := func(m *yaml.Node, key string) *yaml.Node {
		if m.Kind != yaml.MappingNode {
			t.Fatalf("line %d: want a mapping", m.Line)
		}
		for i := 0; i+1 < len(m.Content); i += 2 {
			if m.Content[i].Value == key {
				return m.Content[i+1]
			}
		}
		t.Fatalf("line %d: no %q", m.Line, key)
		return nil
	}
	var out []*yaml.Node
	for _, g := range value(doc.Content[0], "groups").Content {
		out = append(out, value(g, "rules").Content...)
	}
	return out
}

// prometheusServer is a running Prometheus and a client of its HTTP API.
type prometheusServer struct {
	api  promv1.API
	logs *logBuffer
	done chan struct{} // closed when the process has exited
}

// listeningOn is Prometheus' log line naming the address it bound.
var listeningOn = regexp.MustCompile(`msg="Listening on" address=(\S+)`)

// startPrometheus starts Prometheus on a free loopback port with the rules
// file rules, scraping target's /metrics (plaintext, as the metrics port
// serves it) and evaluating every second, and waits until it is ready. It
// is stopped (SIGTERM) when the test ends.
func startPrometheus(t *testing.T, bin, rules, target string) *prometheusServer {
	t.Helper()
	dir := t.TempDir()
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
- job_name: paymentsd
  static_configs: [{targets: [%q]}]
`, rules, target)
	configFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configFile, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+configFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &prometheusServer{logs: newLogBuffer(), done: make(chan struct{})}
	bound := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stderr)
		lines.Buffer(nil, 1<<20)
		for lines.Scan() {
			s.logs.Write(append(lines.Bytes(), '\n'))
			if m := listeningOn.FindSubmatch(lines.Bytes()); m != nil {
				select {
				case bound <- string(m[1]):
				default:
				}
			}
		}
		io.Copy(io.Discard, stderr)
		cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-s.done
			t.Errorf("prometheus did not exit within 30s of SIGTERM")
		}
	})
	var addr string
	select {
	case addr = <-bound:
	case <-s.done:
		t.Fatalf("prometheus exited before listening:\n%s", s.logs.String())
	case <-time.After(time.Minute):
		t.Fatalf("prometheus did not listen within a minute:\n%s", s.logs.String())
	}
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	client, err := api.NewClient(api.Config{Address: "http://" + addr, RoundTripper: transport})
	if err != nil {
		t.Fatal(err)
	}
	s.api = promv1.NewAPI(client)
	s.waitFor(t, "Prometheus to be ready", func() (bool, string) {
		resp, err := (&http.Client{Transport: transport, Timeout: 5 * time.Second}).Get("http://" + addr + "/-/ready")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return s
}

// waitFor polls cond, through Prometheus' API, until it holds; it fails
// the test after a minute, or if Prometheus exits. cond also says what it
// saw, for the failure message.
func (s *prometheusServer) waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, saw := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s; last saw: %s\nprometheus logged:\n%s", what, saw, s.logs.String())
		}
		select {
		case <-s.done:
			t.Fatalf("prometheus exited while waiting for %s:\n%s", what, s.logs.String())
		case <-tick.C:
		}
	}
}

// lastScrape is when the paymentsd target's last scrape started, and its
// error if it failed.
func (s *prometheusServer) lastScrape(t *testing.T) (time.Time, string) {
	t.Helper()
	targets, err := s.api.Targets(t.Context())
	if err != nil || len(targets.Active) != 1 {
		return time.Time{}, fmt.Sprintf("targets %v, %v", targets.Active, err)
	}
	tg := targets.Active[0]
	if tg.Health != promv1.HealthGood {
		return time.Time{}, fmt.Sprintf("target %s: %s", tg.Health, tg.LastError)
	}
	return tg.LastScrape, ""
}

// waitEvaluatedSince waits until every rule has been evaluated on samples
// scraped after since: a scrape that started after since (S1), then another
// after it, whose start means S1's samples are stored, then an evaluation
// of every rule after that. It returns when S1 started.
func (s *prometheusServer) waitEvaluatedSince(t *testing.T, since time.Time) time.Time {
	t.Helper()
	var s1, s2 time.Time
	s.waitFor(t, "a scrape after "+since.Format(time.RFC3339Nano), func() (bool, string) {
		at, problem := s.lastScrape(t)
		s1 = at
		return at.After(since), problem
	})
	s.waitFor(t, "the scrape after "+s1.Format(time.RFC3339Nano), func() (bool, string) {
		at, problem := s.lastScrape(t)
		s2 = at
		return at.After(s1), problem
	})
	s.waitFor(t, "every rule evaluated after "+s2.Format(time.RFC3339Nano), func() (bool, string) {
		rules, err := s.api.Rules(t.Context(), nil)
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, g := range rules.Groups {
			for _, r := range g.Rules {
				var last time.Time
				switch r := r.(type) {
				case promv1.AlertingRule:
					last = r.LastEvaluation
				case promv1.RecordingRule:
					last = r.LastEvaluation
				}
				if !last.After(s2) {
					return false, fmt.Sprintf("a rule of group %s last evaluated at %s", g.Name, last.Format(time.RFC3339Nano))
				}
				n++
			}
		}
		return n > 0, "no rules loaded"
	})
	return s1
}

// onFreshScrapes calls read once every rule has been evaluated on samples
// scraped after since (waitEvaluatedSince), and, for as long as a scrape of
// paymentsd failed from the first of those scrapes to read's end, again
// after fresh ones: a failed scrape marks the target's series stale, so an
// evaluation after it sees paymentsd absent. read must be one that can be
// repeated.
func (s *prometheusServer) onFreshScrapes(t *testing.T, since time.Time, read func()) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; {
		s1 := s.waitEvaluatedSince(t, since)
		read()
		failed, slowest := s.scrapesFailedSince(t, s1)
		if failed == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("for two minutes, scrapes of paymentsd kept failing; the last %d since %s (slowest %.2fs)", failed, s1.Format(time.RFC3339Nano), slowest)
		}
		t.Logf("%d scrapes of paymentsd failed since %s (slowest %.2fs, timeout 1s): reading again after fresh ones", failed, s1.Format(time.RFC3339Nano), slowest)
		since = time.Now()
	}
}

// scrapesFailedSince is how many scrapes of paymentsd that started at or
// after from failed (up 0), and the longest any of them took, as
// Prometheus recorded them.
func (s *prometheusServer) scrapesFailedSince(t *testing.T, from time.Time) (failed int, slowest float64) {
	t.Helper()
	now := time.Now()
	window := fmt.Sprintf("%dms", now.Sub(from).Milliseconds()+1)
	v, _, _, err := s.api.Query(t.Context(), `count_over_time(up{job="paymentsd"}[`+window+`]) - sum_over_time(up{job="paymentsd"}[`+window+`])`, now)
	if err != nil {
		t.Fatalf("query failed scrapes: %v", err)
	}
	vec, ok := v.(model.Vector)
	if !ok || len(vec) != 1 {
		t.Fatalf("query failed scrapes since %s = %v, want one sample", from.Format(time.RFC3339Nano), v)
	}
	if v, _, _, err := s.api.Query(t.Context(), `max_over_time(scrape_duration_seconds{job="paymentsd"}[`+window+`])`, now); err == nil {
		if d, ok := v.(model.Vector); ok && len(d) == 1 {
			slowest = float64(d[0].Value)
		}
	}
	return int(vec[0].Value), slowest
}

// checkRulesHealthy fails the test for every rule whose last evaluation
// failed on this Prometheus.
func (s *prometheusServer) checkRulesHealthy(t *testing.T) {
	t.Helper()
	rules, err := s.api.Rules(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			switch r := r.(type) {
			case promv1.AlertingRule:
				if r.Health != promv1.RuleHealthGood {
					t.Errorf("alert %s: health %s: %s", r.Name, r.Health, r.LastError)
				}
			case promv1.RecordingRule:
				if r.Health != promv1.RuleHealthGood {
					t.Errorf("recording rule %s: health %s: %s", r.Name, r.Health, r.LastError)
				}
			}
		}
	}
}

// alertSet is the active (pending or firing) alerts, by their labels.
type alertSet map[string]promv1.AlertState

func (a alertSet) keys() []string {
	ks := make([]string, 0, len(a))
	for k := range a {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func (a alertSet) String() string {
	var b strings.Builder
	for _, k := range a.keys() {
		fmt.Fprintf(&b, "  %s %s\n", a[k], k)
	}
	return b.String()
}

// has reports whether an alert named name is active for environment.
func (a alertSet) has(name, environment string) bool {
	for k := range a {
		if strings.Contains(k, `alertname="`+name+`"`) && strings.Contains(k, `environment="`+environment+`"`) {
			return true
		}
	}
	return false
}

func (s *prometheusServer) activeAlerts(t *testing.T) alertSet {
	t.Helper()
	res, err := s.api.Alerts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := alertSet{}
	for _, a := range res.Alerts {
		out[a.Labels.String()] = a.State
	}
	return out
}

// settledAlerts returns the active alerts once two evaluations in a row,
// each on fresh samples from scrapes that all succeeded, show the same
// ones.
func (s *prometheusServer) settledAlerts(t *testing.T) alertSet {
	t.Helper()
	var prev, cur alertSet
	s.onFreshScrapes(t, time.Now(), func() { prev = s.activeAlerts(t) })
	for deadline := time.Now().Add(time.Minute); ; {
		s.onFreshScrapes(t, time.Now(), func() { cur = s.activeAlerts(t) })
		if slices.Equal(cur.keys(), prev.keys()) {
			return cur
		}
		if time.Now().After(deadline) {
			t.Fatalf("the active alerts kept changing for a minute; last:\n%v", cur)
		}
		prev = cur
	}
}

// waitAlert waits until the alert named name for environment is firing
// (active) or no longer active at all (!active).
func (s *prometheusServer) waitAlert(t *testing.T, name, environment string, active bool) {
	t.Helper()
	what := fmt.Sprintf("%s{environment=%q} to fire", name, environment)
	if !active {
		what = fmt.Sprintf("%s{environment=%q} to clear", name, environment)
	}
	s.waitFor(t, what, func() (bool, string) {
		res, err := s.api.Alerts(t.Context())
		if err != nil {
			return false, err.Error()
		}
		var state promv1.AlertState // "" while inactive
		for _, a := range res.Alerts {
			if a.Labels["alertname"] == model.LabelValue(name) && a.Labels["environment"] == model.LabelValue(environment) {
				state = a.State
			}
		}
		if active {
			return state == promv1.AlertStateFiring, fmt.Sprintf("state %q", state)
		}
		return state == "", fmt.Sprintf("state %q", state)
	})
}

// query evaluates expr now. (Its value is empty while paymentsd's series
// are stale after a failed scrape.)
func (s *prometheusServer) query(t *testing.T, expr string) model.Value {
	t.Helper()
	v, _, _, err := s.api.Query(t.Context(), expr, time.Now())
	if err != nil {
		t.Fatalf("query %s: %v", expr, err)
	}
	return v
}
