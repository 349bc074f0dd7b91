package config

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
)

// docs/configuration.md is made from the same table as usage, by a test:
//go:generate go test -run=^TestConfigurationPage$ -update .

// Usage is --help's text: the flags, then every variable of the table that
// Load reads, with its default and meaning.
func Usage() string {
	var b strings.Builder
	b.WriteString(`Usage: paymentsd [--simulate] [--version] [--help]
       paymentsd payments <command> [flags]   (the operators' CLI)

paymentsd serves payments.v1.PaymentsService over gRPC and REST, forwarding
payments to one environment of the payment provider. It is configured by the
environment variables below; an unset or empty one takes its default. A
PAYMENTS_* variable not listed here is refused at start, so a misspelt name
is never silently ignored.

The operators' CLI, a client of a running paymentsd (list, get, resolve and
export payments): paymentsd payments --help

Flags:
  --simulate  Serve against a built-in simulated provider (sandbox only): no
              base URL or key is needed, records are kept in memory, test
              keys (sim-decline-…, sim-in-doubt-…) play every outcome, and
              the windows below are seconds (docs/simulator.md).
  --version   Print the version and exit.
  --help, -h  Print this help and exit.

Variables (<ENV> is SANDBOX or LIVE; only PAYMENTS_ENVIRONMENT's are read):
`)
	for _, v := range variables() {
		def := v.def
		if def == "" {
			def = "none"
		}
		if d, ok := simulateDefaults[v.name]; ok {
			def += "; " + d + " under --simulate"
		}
		fmt.Fprintf(&b, "\n  %s (default: %s)\n", v.name, def)
		wrap(&b, v.meaning, "      ", 78)
	}
	b.WriteString("\nAlso read:\n")
	for _, v := range alsoRead {
		var m strings.Builder
		wrap(&m, v.meaning, strings.Repeat(" ", 14), 78)
		fmt.Fprintf(&b, "  %-10s  %s", v.name, strings.TrimLeft(m.String(), " "))
	}
	b.WriteString("\nAccepted and ignored:\n")
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range ignoredVariables {
			if !yield(k) {
				return
			}
		}
	}) {
		fmt.Fprintf(&b, "  %s: %s.\n", name, ignoredVariables[name])
	}
	b.WriteString(`  The variables Kubernetes sets for each Service in the namespace
  (<SERVICE>_SERVICE_HOST, <SERVICE>_SERVICE_PORT*, <SERVICE>_PORT*), so a
  Service named payments is no unknown PAYMENTS_* variable; deploy/ turns
  them off with enableServiceLinks: false.
`)
	return b.String()
}

// alsoRead are the variables paymentsd reads that are not its own: --help
// and docs/configuration.md list them after the table.
var alsoRead = []struct{ name, meaning string }{
	{"OTEL_*", "OpenTelemetry tracing: OTEL_TRACES_EXPORTER (otlp, console or none), OTEL_EXPORTER_OTLP_ENDPOINT and the other standard OTLP, sampler and resource variables. Unset: no tracing."},
	{"GOGC", "The Go GC target; paymentsd uses 400 unless it is set."},
	{"GOMEMLIMIT", "The Go runtime's soft memory limit (deploy/ sets it)."},
}

// wrap writes text in lines of at most width columns, each indented.
func wrap(b *strings.Builder, text, indent string, width int) {
	line := indent
	for _, word := range strings.Fields(text) {
		if len(line) > len(indent) && len(line)+1+len(word) > width {
			b.WriteString(line + "\n")
			line = indent
		}
		if len(line) > len(indent) {
			line += " "
		}
		line += word
	}
	b.WriteString(line + "\n")
}

// variableName is the shape of a name that may be echoed in a refusal:
// anything else (a key pasted as a name) is not repeated.
var variableName = regexp.MustCompile(`^[A-Za-z0-9_]{1,128}$`)

// unknownVariables refuses each PAYMENTS_* variable in environ that is in
// no entry of vars, naming it, with the closest known name of the
// selected environment (env, as <ENV> is written) when one is close. It
// leaves alone the variables Kubernetes sets for a Service named
// payments… (serviceLinks) and ignoredVariables. The names compared are
// upper case, so payments_grpc_addr is caught too.
func unknownVariables(environ []string, vars []variable, env string) []error {
	known := map[string]bool{}
	var suggestions []string
	for _, v := range vars {
		for _, e := range environments {
			known[v.named(e)] = true
		}
		suggestions = append(suggestions, v.named(env))
	}
	names := map[string]bool{}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		names[name] = true
	}
	links := serviceLinks(environ)
	var problems []error
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(strings.ToUpper(name), "PAYMENTS_") || known[name] || links[name] || ignoredVariables[name] != "" {
			continue
		}
		if !variableName.MatchString(name) {
			problems = append(problems, fmt.Errorf("a variable whose name starts with PAYMENTS_ (not repeated: it has characters no variable name has) is not one paymentsd reads; paymentsd --help lists them"))
			continue
		}
		msg := fmt.Sprintf("%s is not a variable paymentsd reads", name)
		s := closest(strings.ToUpper(name), suggestions)
		if withEnv := "PAYMENTS_" + env + "_" + strings.TrimPrefix(strings.ToUpper(name), "PAYMENTS_"); slices.Contains(suggestions, withEnv) {
			// PAYMENTS_API_KEY_FILE: the environment left out.
			s = withEnv
		}
		if s != "" && !names[s] {
			msg += fmt.Sprintf(": did you mean %s?", s)
		} else if s != "" {
			msg += fmt.Sprintf(" (%s, which it looks like, is set as well)", s)
		}
		problems = append(problems, fmt.Errorf("%s; paymentsd --help lists every variable", msg))
	}
	return problems
}

// linkSuffix matches what Kubernetes appends to a Service's name in the
// variables it sets for it (the "Docker links" form included):
// _SERVICE_HOST, _SERVICE_PORT, _SERVICE_PORT_<PORT NAME>, _PORT, and
// _PORT_<n>_<PROTO>[_PROTO|_PORT|_ADDR].
var linkSuffix = regexp.MustCompile(`_(SERVICE_HOST|SERVICE_PORT|SERVICE_PORT_[A-Z0-9_]+|PORT|PORT_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)$`)

// serviceLinks are the names in environ that Kubernetes set for a Service:
// those whose Service has both <SVC>_SERVICE_HOST, an IP address, and
// <SVC>_SERVICE_PORT, as Kubernetes always sets them together. A lone
// PAYMENTS_GRPC_PORT is a mistake, not a link.
func serviceLinks(environ []string) map[string]bool {
	getenv := Lookup(environ)
	links := map[string]bool{}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		loc := linkSuffix.FindStringIndex(name)
		if loc == nil || loc[0] == 0 {
			continue
		}
		svc := name[:loc[0]]
		if net.ParseIP(getenv(svc+"_SERVICE_HOST")) != nil && getenv(svc+"_SERVICE_PORT") != "" {
			links[name] = true
		}
	}
	return links
}

// closest is the name in names nearest to name by edit distance, or "" if
// none is within a third of the longer name's length.
func closest(name string, names []string) string {
	best, bestDist := "", -1
	for _, n := range names {
		d := editDistance(name, n)
		if d*3 <= max(len(name), len(n)) && (bestDist < 0 || d < bestDist) {
			best, bestDist = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
