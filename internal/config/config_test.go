package config

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	sandboxKey = "sk_sandbox_SENTINEL_7f3a9c"
	liveKey    = "sk_live_SENTINEL_0b21e4"
)

// validSandbox is a configuration Load accepts, before the variable a
// test changes.
func validSandbox(t *testing.T) map[string]string {
	return map[string]string{
		"PAYMENTS_SANDBOX_BASE_URL": "https://sandbox.provider.test/v1",
		"PAYMENTS_SANDBOX_API_KEY":  sandboxKey,
		"PAYMENTS_DATABASE_URL":     "sqlite:" + filepath.Join(t.TempDir(), "records.db"),
	}
}

func validLive(t *testing.T) map[string]string {
	return map[string]string{
		"PAYMENTS_ENVIRONMENT":   "live",
		"PAYMENTS_LIVE_BASE_URL": "https://live.provider.test/v1",
		"PAYMENTS_LIVE_API_KEY":  liveKey,
		"PAYMENTS_DATABASE_URL":  "sqlite:" + filepath.Join(t.TempDir(), "records.db"),
	}
}

// with returns m plus the pairs kv.
func with(m map[string]string, kv ...string) map[string]string {
	out := make(map[string]string, len(m)+len(kv)/2)
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// envList is m as os.Environ gives an environment, sorted.
func envList(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// TestHelp: --help lists every variable of the table that Load reads,
// with its default and meaning.
func TestHelp(t *testing.T) {
	t.Parallel()
	flat := strings.Join(strings.Fields(Usage()), " ")
	for _, v := range variables() {
		def := v.def
		if def == "" {
			def = "none"
		}
		if d, ok := simulateDefaults[v.name]; ok {
			def += "; " + d + " under --simulate"
		}
		want := v.name + " (default: " + def + ") " + strings.Join(strings.Fields(v.meaning), " ")
		if !strings.Contains(flat, want) {
			t.Errorf("Usage() lacks %q", want)
		}
	}
	for _, want := range []string{"--simulate", "--version", "OTEL_", "GOGC", "_SERVICE_HOST", "paymentsd payments"} {
		if !strings.Contains(Usage(), want) {
			t.Errorf("Usage() lacks %s", want)
		}
	}
}

// TestHelpDefaultsAreTheDefaults: each default --help shows is what an
// unset variable gives: loading with nothing set and with every default
// written out gives the same configuration.
func TestHelpDefaultsAreTheDefaults(t *testing.T) {
	t.Parallel()
	base := validSandbox(t)
	unset, err := Load([]string{"paymentsd"}, envList(base))
	if err != nil {
		t.Fatal(err)
	}
	written := with(base)
	for _, v := range variables() {
		if v.parse != nil && v.def != "" {
			written[v.named("SANDBOX")] = v.def
		}
	}
	set, err := Load([]string{"paymentsd"}, envList(written))
	if err != nil {
		t.Fatalf("Load(every default written out) = %v", err)
	}
	if got, want := set.LogValue().String(), unset.LogValue().String(); got != want {
		t.Errorf("configuration with every default written out\n%s\nwant, as with none set,\n%s", got, want)
	}
}

// TestSimulateDefaults: under --simulate the settlement window, quiet
// period and upstream timeout default to the seconds --help shows, so a
// payment in doubt can be rehearsed quickly; a variable set still wins,
// and without --simulate the usual defaults hold.
func TestSimulateDefaults(t *testing.T) {
	t.Parallel()
	get := func(c *Config) []time.Duration {
		return []time.Duration{c.SettlementWindow, c.ProviderQuietPeriod, c.UpstreamTimeout}
	}
	sim, err := Load([]string{"paymentsd", "--simulate"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var want []time.Duration
	for _, name := range []string{"PAYMENTS_SETTLEMENT_WINDOW", "PAYMENTS_PROVIDER_QUIET_PERIOD", "PAYMENTS_UPSTREAM_TIMEOUT"} {
		d, err := time.ParseDuration(simulateDefaults[name])
		if err != nil {
			t.Fatalf("%s's --simulate default: %v", name, err)
		}
		want = append(want, d)
	}
	if got := get(sim); !slices.Equal(got, want) {
		t.Errorf("--simulate with nothing set: window, quiet period, upstream timeout = %v, want %v", got, want)
	}
	set, err := Load([]string{"paymentsd", "--simulate"}, []string{"PAYMENTS_SETTLEMENT_WINDOW=1m"})
	if err != nil {
		t.Fatal(err)
	}
	if set.SettlementWindow != time.Minute {
		t.Errorf("--simulate with PAYMENTS_SETTLEMENT_WINDOW=1m: window %v, want 1m", set.SettlementWindow)
	}
	real, err := Load([]string{"paymentsd"}, envList(validSandbox(t)))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := get(real), []time.Duration{10 * time.Minute, 30 * time.Second, 15 * time.Second}; !slices.Equal(got, want) {
		t.Errorf("without --simulate: window, quiet period, upstream timeout = %v, want %v", got, want)
	}
}

// TestEveryVariableIsRead sets each variable of the table, in turn, to a
// value none accepts: the refusal must name it, so loadConfig reads every
// variable --help lists.
func TestEveryVariableIsRead(t *testing.T) {
	t.Parallel()
	const garbage = "\x01not:a value"
	for _, env := range environments {
		for _, v := range variables() {
			name := v.named(env)
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				base := validSandbox(t)
				if env == "LIVE" {
					base = validLive(t)
				}
				if name == "PAYMENTS_DATABASE_URL_FILE" {
					delete(base, "PAYMENTS_DATABASE_URL")
				}
				_, err := Load([]string{"paymentsd"}, envList(with(base, name, garbage)))
				if err == nil || !strings.Contains(err.Error(), name) {
					t.Errorf("Load(%s=garbage) = %v, want a refusal naming it", name, err)
				}
			})
		}
	}
}

// TestNoVariableOutsideTheTable: every PAYMENTS_* name written in
// paymentsd's code is in the table (or ignoredVariables), so --help
// lists it and it is not refused as unknown.
func TestNoVariableOutsideTheTable(t *testing.T) {
	t.Parallel()
	known := map[string]bool{}
	for _, v := range variables() {
		known[v.name] = true
		for _, env := range environments {
			known[v.named(env)] = true
		}
	}
	// The packages paymentsd's code is in: this one, main, the daemon and
	// the CLI.
	var files []string
	for _, dir := range []string{".", "../../cmd/paymentsd", "../daemon", "../cli"} {
		fs, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, fs...)
	}
	name := regexp.MustCompile(`"(PAYMENTS_[A-Z0-9_<>]*[A-Z0-9>])[" ]`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range name.FindAllStringSubmatch(string(b), -1) {
			if !known[m[1]] && ignoredVariables[m[1]] == "" {
				t.Errorf("%s reads %s, which is not in variables()", f, m[1])
			}
		}
	}
}
