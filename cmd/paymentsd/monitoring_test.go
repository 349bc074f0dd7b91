package main

import (
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
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

type alertRule struct {
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
	in := startConfigured(t, webhookEnv(t), nil, func(c *config) { c.registry = reg })
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
	// with no series yet.
	if _, scraped := families["paymentsd_store_errors_total"]; scraped || !exp.names["paymentsd_store_errors_total"] {
		t.Fatalf("paymentsd_store_errors_total scraped %v, described %v; want only described (no store error yet)", scraped, exp.names["paymentsd_store_errors_total"])
	}

	var qs []query
	for _, r := range readAlertRules(t) {
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
