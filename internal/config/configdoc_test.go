package config

import (
	"bytes"
	"flag"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/template"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md from docs/configuration.md.tmpl and the variables table")

const (
	configurationTemplate = "../../docs/configuration.md.tmpl"
	configurationPage     = "../../docs/configuration.md"
)

// TestConfigurationPage: docs/configuration.md is what its template and
// the variables table (the one --help prints and loadConfig reads
// through) make of it, so the page lists every variable paymentsd reads,
// and no other, with --help's default and meaning. With -update (go
// generate) it rewrites the page instead.
func TestConfigurationPage(t *testing.T) {
	t.Parallel()
	tmpl, err := os.ReadFile(configurationTemplate)
	if err != nil {
		t.Fatal(err)
	}
	want, err := renderConfigurationPage(string(tmpl))
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(configurationPage, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(configurationPage)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("docs/configuration.md is not what docs/configuration.md.tmpl and the variables table make of it: run go generate ./internal/config (-generated +file):\n%s", diff)
	}
}

// codeName matches what the page sets in code type inside a meaning:
// variable names and flags.
var codeName = regexp.MustCompile(`(PAYMENTS|OTEL)_[A-Z0-9_<>]*([A-Z0-9>]|_\*)|--[a-z][a-z-]*`)

// renderConfigurationPage executes the page's template with the tables
// --help prints: the variables, the others paymentsd reads, and the
// PAYMENTS_* names it ignores.
func renderConfigurationPage(text string) ([]byte, error) {
	type row struct{ Name, Default, Meaning string }
	cell := func(s string) string {
		s = strings.Join(strings.Fields(s), " ")
		s = strings.ReplaceAll(s, "|", `\|`)
		return codeName.ReplaceAllString(s, "`$0`")
	}
	var data struct{ Variables, AlsoRead, Ignored []row }
	for _, v := range variables() {
		def := "—"
		switch {
		case v.def == "":
		case strings.Contains(v.def, " "):
			// A default described in words, not a value.
			def = cell(v.def)
		default:
			def = "`" + v.def + "`"
		}
		if d, ok := simulateDefaults[v.name]; ok {
			def += " (`" + d + "` under `--simulate`)"
		}
		data.Variables = append(data.Variables, row{v.name, def, cell(v.meaning)})
	}
	for _, v := range alsoRead {
		data.AlsoRead = append(data.AlsoRead, row{Name: v.name, Meaning: cell(v.meaning)})
	}
	for _, name := range slices.Sorted(maps.Keys(ignoredVariables)) {
		data.Ignored = append(data.Ignored, row{Name: name, Meaning: cell(ignoredVariables[name])})
	}
	tmpl, err := template.New("configuration.md").Parse(text)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, data); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
