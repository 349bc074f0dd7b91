package main

import (
	"bytes"
	"encoding/json"
	"maps"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/config"
	"example.com/paymentsd/internal/service"
	"example.com/paymentsd/internal/simulator"
)

// The alerting rules and the dashboard live beside the manifests.
const (
	alertsFile    = "../../deploy/monitoring/alerts.yaml"
	dashboardFile = "../../deploy/monitoring/dashboard.json"
)

// query is one PromQL expression from the rules or the dashboard, and
// where it came from.
type query struct {
	where, expr string
}

// alertRule is an alerting rule, or with Record set a recording rule.
type alertRule struct {
	Record      string            `yaml:"record"`
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func readAlertRules(t *testing.T) []alertRule {
	t.Helper()
	b, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	var rules []alertRule
	for _, g := range doc.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatalf("%s holds no rules", alertsFile)
	}
	return rules
}

// grafanaVariable is a Grafana variable in a query: $name or ${name}.
var grafanaVariable = regexp.MustCompile(`\$\{?(\w+)\}?`)

// dashboardQueries returns every query of the dashboard's panels and
// variables, with Grafana's variables replaced by values PromQL parses.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		Expr string `json:"expr"`
	}
	type panel struct {
		Title   string   `json:"title"`
		Targets []target `json:"targets"`
		Panels  []panel  `json:"panels"`
	}
	var dash struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var qs []query
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				qs = append(qs, query{"dashboard panel " + p.Title, tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	// label_values(<selector>, label) is Grafana's, not PromQL: its
	// selector is checked.
	labelValues := regexp.MustCompile(`^label_values\((.*),\s*\w+\)$`)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("dashboard variable %s: query is not {\"query\": ...}: %v", v.Name, err)
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Fatalf("dashboard variable %s: query %q is not label_values(selector, label)", v.Name, q.Query)
		}
		qs = append(qs, query{"dashboard variable " + v.Name, m[1]})
	}
	for i, q := range qs {
		qs[i].expr = grafanaVariable.ReplaceAllStringFunc(q.expr, func(v string) string {
			switch strings.Trim(v, "${}") {
			case "__rate_interval", "__interval", "__range":
				return "5m"
			}
			return "value"
		})
	}
	return qs
}

// exported is what a running paymentsd exports: the names of its metric
// families and the label names seen on their series.
type exported struct {
	names  map[string]bool
	labels map[string]map[string]bool // by series name; only for families with series
}

// descName reads a metric's name out of its description; Desc keeps it
// unexported, and its String has printed it first since client_golang's
// first release.
var descName = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)

func exportedBy(t *testing.T, reg *prometheus.Registry, families map[string]*dto.MetricFamily) exported {
	t.Helper()
	e := exported{names: map[string]bool{}, labels: map[string]map[string]bool{}}
	// Every registered family, with series or not (a vector with no
	// children yet, such as paymentsd_store_errors_total before any
	// error, is exported but shows nothing on /metrics).
	descs := make(chan *prometheus.Desc)
	go func() {
		reg.Describe(descs)
		close(descs)
	}()
	for d := range descs {
		m := descName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("can't read a name out of %s", d)
		}
		e.names[m[1]] = true
	}
	for name, f := range families {
		if !e.names[name] {
			t.Errorf("/metrics family %s has no description in the registry: the test reads the wrong registry", name)
		}
		var series []string
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			series = []string{name + "_bucket", name + "_sum", name + "_count"}
		case dto.MetricType_SUMMARY:
			series = []string{name, name + "_sum", name + "_count"}
		default:
			series = []string{name}
		}
		for _, s := range series {
			e.names[s] = true
			if e.labels[s] == nil {
				e.labels[s] = map[string]bool{}
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					e.labels[s][l.GetName()] = true
				}
			}
			if strings.HasSuffix(s, "_bucket") {
				e.labels[s]["le"] = true
			}
		}
	}
	return e
}

// selectorsOf parses expr and returns its vector selectors.
func selectorsOf(t *testing.T, q query) []*parser.VectorSelector {
	t.Helper()
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(q.expr)
	if err != nil {
		t.Errorf("%s: %q does not parse: %v", q.where, q.expr, err)
		return nil
	}
	var out []*parser.VectorSelector
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs)
		}
		return nil
	})
	return out
}

// TestMonitoringQueriesUseExportedMetrics runs paymentsd, takes a payment
// and a webhook delivery so that their series exist, and checks that every
// metric the alerting rules and the dashboard query is one paymentsd
// exports, with labels it has.
func TestMonitoringQueriesUseExportedMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	in := startConfigured(t, webhookEnv(t), nil, func(c *config.Config) { c.Registry = reg })
	if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-monitoring")); err != nil {
		t.Fatalf("CreateMultiCardPayment() = %v", err)
	}
	if status, reply := deliver(t, in.http, "http://"+in.webhookAddr+"/webhooks/"+webhookToken, "application/json", []byte(`{"event":"x"}`)); status != http.StatusOK {
		t.Fatalf("webhook delivery = %d %s, want 200", status, reply)
	}
	families, _ := scrape(t, in)
	if v, ok := sample(families, "paymentsd_ready", nil); !ok || v != 1 {
		t.Errorf("paymentsd_ready while serving = %v (present %v), want 1", v, ok)
	}
	exp := exportedBy(t, reg, families)
	// The description route must see what /metrics does not: a vector
	// with no series yet (no secret file is watched here).
	if _, scraped := families["paymentsd_secret_file_ok"]; scraped || !exp.names["paymentsd_secret_file_ok"] {
		t.Fatalf("paymentsd_secret_file_ok scraped %v, described %v; want only described (no secret file watched)", scraped, exp.names["paymentsd_secret_file_ok"])
	}
	// And what paymentsd exports only with mTLS (the TLS files' expiry,
	// refused handshakes), as deploy/ runs it.
	tlsReg := prometheus.NewRegistry()
	withTLS := startStreamTrustWith(t, func(c *config.Config) { c.Registry = tlsReg })
	tlsExp := exportedBy(t, tlsReg, scrapeMetricsPort(t, withTLS.in))
	for name := range tlsExp.names {
		if !exp.names[name] {
			exp.names[name], exp.labels[name] = true, tlsExp.labels[name]
		}
	}

	var qs []query
	recorded := map[string]bool{} // the names recording rules give their results
	for _, r := range readAlertRules(t) {
		if r.Record != "" {
			recorded[r.Record] = true
			qs = append(qs, query{"recording rule " + r.Record, r.Expr})
			continue
		}
		qs = append(qs, query{"alert " + r.Alert, r.Expr})
	}
	dash := dashboardQueries(t)
	if len(dash) == 0 {
		t.Fatalf("%s holds no queries", dashboardFile)
	}
	qs = append(qs, dash...)
	used := map[string]bool{}
	for _, q := range qs {
		sels := selectorsOf(t, q)
		if len(sels) == 0 {
			t.Errorf("%s: %q selects no metric", q.where, q.expr)
		}
		for _, vs := range sels {
			if vs.Name == "" {
				t.Errorf("%s: selector %s names no metric", q.where, vs)
				continue
			}
			used[vs.Name] = true
			if recorded[vs.Name] {
				continue
			}
			if !exp.names[vs.Name] {
				t.Errorf("%s: %s is not a metric paymentsd exports", q.where, vs.Name)
				continue
			}
			labels, ok := exp.labels[vs.Name]
			if !ok {
				continue // no series yet: its labels are unknown
			}
			for _, m := range vs.LabelMatchers {
				if m.Name != "__name__" && !labels[m.Name] {
					t.Errorf("%s: %s has no label %q", q.where, vs.Name, m.Name)
				}
			}
		}
	}
	// The areas the issue asks the dashboard to show.
	for _, want := range []string{
		"grpc_server_handled_total", "grpc_server_handling_seconds_bucket", "paymentsd_provider_requests_total",
		"paymentsd_records", "paymentsd_records_unsettled", "paymentsd_settlement_attempts_total", "paymentsd_resolutions_total",
		"paymentsd_webhook_deliveries_total",
	} {
		if !slices.ContainsFunc(dash, func(q query) bool { return strings.Contains(q.expr, want+"{") }) {
			t.Errorf("the dashboard does not query %s", want)
		}
	}
}

// TestAlertRulesHaveRunbooks checks that every alert says what it is, what
// to do, and links to its own runbook: the section of docs/runbooks.md
// named as the alert.
func TestAlertRulesHaveRunbooks(t *testing.T) {
	t.Parallel()
	runbooks, err := os.ReadFile("../../docs/runbooks.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(runbooks), "\n") {
		if h, ok := strings.CutPrefix(line, "#"); ok {
			anchors[githubAnchor(strings.TrimLeft(h, "#"))] = true
		}
	}
	for _, r := range readAlertRules(t) {
		if r.Record != "" {
			continue
		}
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("alert %s has no %s annotation", r.Alert, a)
			}
		}
		if s := r.Labels["severity"]; s != "critical" && s != "warning" {
			t.Errorf("alert %s severity = %q, want critical or warning", r.Alert, s)
		}
		anchor := githubAnchor(r.Alert)
		if want := "docs/runbooks.md#" + anchor; r.Annotations["runbook_url"] != want {
			t.Errorf("alert %s runbook_url = %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
		}
		if !anchors[anchor] {
			t.Errorf("docs/runbooks.md has no section for alert %s (a heading %q)", r.Alert, r.Alert)
		}
	}
}

// githubAnchor is the anchor GitHub gives a heading.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestLabelledSeriesStartAtZero: on a fresh process every series an alert
// takes a rate or an increase of is exported at zero before anything
// happens. A series born at its first event has no earlier sample, so
// rate() and increase() miss that event: the first short episode of an
// open circuit breaker, a revoked key or a store failure would raise
// nothing.
func TestLabelledSeriesStartAtZero(t *testing.T) {
	t.Parallel()
	in := start(t, webhookEnv(t))
	families, _ := scrape(t, in)
	type series struct {
		family string
		labels map[string]string
	}
	var want []series
	// The transport outcomes, and the two statuses the provider documents.
	for _, o := range []string{"circuit_open", "unreachable", "connection_lost", "deadline_exceeded", "canceled", "401", "403"} {
		want = append(want, series{"paymentsd_provider_requests_total", map[string]string{"outcome": o}})
	}
	for _, op := range []string{"begin", "finish", "get", "audit", "attempts", "list", "resolve", "settle_due", "release", "stats", "delete"} {
		want = append(want, series{"paymentsd_store_errors_total", map[string]string{"op": op}})
	}
	for _, o := range []string{"store_failure", "over_quota"} {
		want = append(want, series{"paymentsd_webhook_deliveries_total", map[string]string{"outcome": o, "token": "first"}})
	}
	want = append(want,
		series{"paymentsd_webhook_deliveries_total", map[string]string{"outcome": "bad_token", "token": "none"}},
		series{"paymentsd_settlement_gave_up_total", nil},
		series{"grpc_server_handled_total", map[string]string{"grpc_method": "CreateMultiCardPayment", "grpc_code": "Unavailable"}},
	)
	for _, s := range want {
		s.labels = with(s.labels, "environment", "sandbox")
		if v, ok := sample(families, s.family, s.labels); !ok || v != 0 {
			t.Errorf("%s%v on a fresh process = %v (present %v), want 0", s.family, s.labels, v, ok)
		}
	}
}

// storeErrors reads paymentsd_store_errors_total by op (a missing series
// reads 0).
func storeErrors(t *testing.T, p *party) map[string]float64 {
	t.Helper()
	r := p.do(t, http.MethodGet, "/metrics", "")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(r.raw))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	out := map[string]float64{}
	for _, m := range families["paymentsd_store_errors_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "op" {
				out[l.GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// TestRefusedResolvesAreNoStoreErrors: a resolution refused because of the
// record's state (no such record, not in doubt, changed since it was
// looked at, settlement's last request maybe still at the provider) is the
// store answering, not failing: it leaves paymentsd_store_errors_total,
// which pages on any rise, as it was. TestResolveRefusedWhileInFlight
// checks the same of a request at the provider.
func TestRefusedResolvesAreNoStoreErrors(t *testing.T) {
	t.Parallel()
	p := idempotentProvider(t)
	p.SetScript(func(_ int, r simulator.Request) simulator.Reply {
		if idempotencyKey(r.Body) == "k-doubt" {
			return simulator.Reply{Fault: simulator.Reset}
		}
		return simulator.Reply{}
	})
	in, ps := mtlsDeployment(t, with(sandboxEnv(p),
		"PAYMENTS_UPSTREAM_MAX_ATTEMPTS", "1",
		"PAYMENTS_UPSTREAM_BREAKER_FAILURES", "1000",
		"PAYMENTS_SETTLEMENT_WINDOW", "1500ms",
		"PAYMENTS_UPSTREAM_TIMEOUT", "500ms",
		"PAYMENTS_PROVIDER_QUIET_PERIOD", "1s",
	))
	co, admin := ps["checkout"], ps["oncall"]
	if _, err := co.client.CreateMultiCardPayment(t.Context(), validRequest("k-ok")); err != nil {
		t.Fatalf("CreateMultiCardPayment(k-ok) = %v", err)
	}
	_, err := co.client.CreateMultiCardPayment(t.Context(), validRequest("k-doubt"))
	checkReason(t, status.Convert(err), "PAYMENT_OUTCOME_UNKNOWN")
	in.logs.waitFor(t, gaveUpLine, nil)
	seen, err := admin.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-doubt"})
	if err != nil {
		t.Fatal(err)
	}
	stale := timestamppb.New(seen.GetUpdateTime().AsTime().Add(-time.Millisecond))

	const notCreated = paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED
	for _, tt := range []struct {
		name   string
		req    *paymentsv1.ResolveMultiCardPaymentRequest
		code   codes.Code
		reason string
	}{
		{"no such record", &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k-none", Outcome: notCreated, Evidence: "x"},
			codes.NotFound, ""},
		{"not in doubt", &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k-ok", Outcome: notCreated, Evidence: "x"},
			codes.FailedPrecondition, service.ReasonRecordNotUnknown},
		// Settlement's last request may keep k-doubt quiet a moment longer
		// (ABORTED, PAYMENT_IN_PROGRESS): resolveWhenQuiet waits it out,
		// and those refusals must not count either.
		{"changed since looked at", &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k-doubt", Outcome: notCreated, Evidence: "x", ExpectedUpdateTime: stale},
			codes.FailedPrecondition, service.ReasonRecordChanged},
	} {
		before := storeErrors(t, admin)
		_, err := resolveWhenQuiet(t, admin.client, tt.req)
		checkCode(t, "ResolveMultiCardPayment ("+tt.name+")", err, tt.code, tt.reason)
		if after := storeErrors(t, admin); !maps.Equal(after, before) {
			t.Errorf("paymentsd_store_errors_total after a refused resolve (%s) = %v, want unchanged %v", tt.name, after, before)
		}
	}
}
