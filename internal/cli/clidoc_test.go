package cli

import (
	"bytes"
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const operationsPage = "../../docs/operations.md"

// TestCLIFlagsDocumented keeps the operators' CLI section of
// docs/operations.md, which is written by hand, true to the flags: its
// table lists exactly the flags every command takes to reach paymentsd,
// each with the variable that is its default, and every other flag of
// every command is named in the section.
func TestCLIFlagsDocumented(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(operationsPage)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## The operators' CLI\n")
	if !ok {
		t.Fatalf("%s has no section \"The operators' CLI\"", operationsPage)
	}
	section, _, _ = strings.Cut(section, "\n## ")

	// The table: flag -> its variable ("" for none), as documented.
	documented := map[string]string{}
	code := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `-") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			t.Fatalf("%s: table row %q has fewer than three cells", operationsPage, line)
		}
		var flags, vars []string
		for _, m := range code.FindAllStringSubmatch(cells[1], -1) {
			flags = append(flags, strings.TrimLeft(m[1], "-"))
		}
		for _, m := range code.FindAllStringSubmatch(cells[2], -1) {
			vars = append(vars, m[1])
		}
		for i, f := range flags {
			switch {
			case len(vars) == 0:
				documented[f] = ""
			case len(vars) == len(flags):
				documented[f] = vars[i]
			default:
				t.Errorf("%s: table row %q names %d flags and %d variables", operationsPage, line, len(flags), len(vars))
			}
		}
	}

	// What ConnFlags registers, with the variable its usage names.
	fs := flag.NewFlagSet("connection", flag.ContinueOnError)
	var c ConnFlags
	c.register(fs, func(string) string { return "" })
	variable := regexp.MustCompile(`\(\$(PAYMENTS_CLI_[A-Z_]+)\)`)
	registered := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) {
		registered[f.Name] = ""
		if m := variable.FindStringSubmatch(f.Usage); m != nil {
			registered[f.Name] = m[1]
		}
	})
	if diff := cmp.Diff(registered, documented); diff != "" {
		t.Errorf("%s's table of connection flags and their variables differs from what every command registers (-registered +documented):\n%s", operationsPage, diff)
	}

	// Every command's own flags, as its --help lists them, are named in
	// the section.
	listed := regexp.MustCompile(`(?m)^  -(\S+)`)
	for _, command := range []string{"list", "get", "resolve", "export"} {
		var stdout, stderr bytes.Buffer
		if err := Run(t.Context(), []string{command, "--help"}, nil, strings.NewReader(""), &stdout, &stderr); err != nil {
			t.Fatalf("paymentsd payments %s --help: %v\n%s", command, err, stderr.String())
		}
		flags := listed.FindAllStringSubmatch(stdout.String(), -1)
		if len(flags) == 0 {
			t.Fatalf("paymentsd payments %s --help lists no flags:\n%s", command, stdout.String())
		}
		for _, m := range flags {
			name := m[1]
			if _, ok := registered[name]; ok {
				continue
			}
			dashes := "--"
			if len(name) == 1 {
				dashes = "-"
			}
			if !regexp.MustCompile(`(^|[^\w-])` + dashes + regexp.QuoteMeta(name) + `\b`).MatchString(section) {
				t.Errorf("%s: the operators' CLI section never names %s%s, a flag of paymentsd payments %s", operationsPage, dashes, name, command)
			}
		}
	}
}
