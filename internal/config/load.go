package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/upstream"
)

// ErrHelp and ErrVersion are Load's answers to --help and --version:
// run prints the help or the version and exits 0.
var (
	ErrHelp    = errors.New("help requested")
	ErrVersion = errors.New("version requested")
)

// Load reads the configuration from args and environ (as
// os.Environ gives it) and validates it, reporting every problem at once,
// each naming its setting and saying what is wanted. A refusal never
// repeats a value: a key pasted into the wrong variable must not reach the
// terminal or the logs. Only the selected environment's variables are
// read, and a PAYMENTS_* variable paymentsd does not know is refused.
func Load(args, environ []string) (*Config, error) {
	simulate, err := parseFlags(args)
	if err != nil {
		return nil, err
	}
	getenv := Lookup(environ)

	var problems []error
	problem := func(format string, a ...any) { problems = append(problems, fmt.Errorf(format, a...)) }

	c := &Config{Simulate: simulate}
	vars := variables()
	// PAYMENTS_ENVIRONMENT comes first: it says which PAYMENTS_<ENV>_*
	// names are read. Should it be wrong, sandbox's are checked.
	env := "SANDBOX"
	for _, v := range vars {
		if v.parse == nil {
			continue
		}
		name := v.named(env)
		value := getenv(name)
		if value == "" {
			value = v.defaultFor(simulate)
		}
		if err := v.parse(c, value); err != nil {
			problem("%s: %w", name, err)
		}
		if name == "PAYMENTS_ENVIRONMENT" && (c.Environment == "live" || c.Environment == "sandbox") {
			env = strings.ToUpper(c.Environment)
		}
	}
	// An environment that is neither is reported above; the checks of
	// its own variables are left out.
	envValid := c.Environment == "sandbox" || c.Environment == "live"

	problems = append(problems, unknownVariables(environ, vars, env)...)

	if c.UpstreamTimeout > c.ShutdownTimeout {
		// A call still waiting on the provider when the drain ends is cut
		// off, and its caller is left not knowing whether it paid.
		problem("PAYMENTS_UPSTREAM_TIMEOUT (%v) is longer than PAYMENTS_SHUTDOWN_TIMEOUT (%v): want it no longer, or a provider call in flight at shutdown is cut off with its outcome unknown", c.UpstreamTimeout, c.ShutdownTimeout)
	}
	if c.RecordRetention < c.SettlementWindow {
		problem("PAYMENTS_RECORD_RETENTION must be at least PAYMENTS_SETTLEMENT_WINDOW: a record can't be deleted while it may still be settled")
	}
	if c.ProviderQuietPeriod < c.UpstreamTimeout {
		// paymentsd's own request may run for the whole upstream timeout:
		// a shorter presumption would end before the request does.
		problem("PAYMENTS_PROVIDER_QUIET_PERIOD (%v) is shorter than PAYMENTS_UPSTREAM_TIMEOUT (%v): want it at least as long, and as long as the provider may go on working on a request after paymentsd stops waiting", c.ProviderQuietPeriod, c.UpstreamTimeout)
	}
	if c.ProviderQuietPeriod >= c.SettlementWindow {
		problem("PAYMENTS_PROVIDER_QUIET_PERIOD (%v) must be shorter than PAYMENTS_SETTLEMENT_WINDOW (%v), or a key whose request went unanswered could never be settled", c.ProviderQuietPeriod, c.SettlementWindow)
	}
	if c.TombstoneRetention < time.Hour {
		// A tombstone must outlive its record, which retention deletes
		// minutes after writing the tombstone.
		problem("PAYMENTS_TOMBSTONE_RETENTION must be at least 1h: a tombstone refuses its key only while it is kept")
	}
	c.Hooks = loadHooks(getenv, problem)
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		problem("PAYMENTS_TLS_CERT_FILE and PAYMENTS_TLS_KEY_FILE must be set together")
	}
	if c.TLSClientCAFile != "" && c.TLSCertFile == "" {
		problem("PAYMENTS_TLS_CLIENT_CA_FILE needs PAYMENTS_TLS_CERT_FILE and PAYMENTS_TLS_KEY_FILE")
	}
	if len(c.AllowedCallers) > 0 && c.TLSClientCAFile == "" {
		// Without client certificates no caller has an identity, and the
		// allowlist would refuse everyone.
		problem("PAYMENTS_ALLOWED_CALLERS needs PAYMENTS_TLS_CLIENT_CA_FILE: callers are identified by their client certificates")
	}
	if len(c.AdminCallers) > 0 && c.TLSClientCAFile == "" {
		problem("PAYMENTS_ADMIN_CALLERS needs PAYMENTS_TLS_CLIENT_CA_FILE: admins are identified by their client certificates")
	}
	if len(c.EventReaders) > 0 && c.TLSClientCAFile == "" {
		problem("PAYMENTS_EVENT_READERS needs PAYMENTS_TLS_CLIENT_CA_FILE: event readers are identified by their client certificates")
	}
	if c.Environment == "live" && c.TLSClientCAFile == "" && !c.AllowUnidentifiedCallers && !c.Simulate {
		// Live moves money: who paid, and who resolved, must be known.
		problem("PAYMENTS_TLS_CLIENT_CA_FILE is not set: live would not know its callers (no caller isolation, no on-call admins, no event readers); set it with PAYMENTS_TLS_CERT_FILE and PAYMENTS_TLS_KEY_FILE (see docs/identity.md), or set PAYMENTS_ALLOW_UNIDENTIFIED_CALLERS=true to run live without caller identities")
	}

	c.loadDatabase(getenv, problem)
	switch {
	case c.Simulate && c.Environment == "live":
		problem("--simulate is refused in live: PAYMENTS_ENVIRONMENT is live")
	case c.Simulate:
		// The simulator provides its own URL and key; the sandbox
		// settings, if any, are not used.
	case envValid:
		c.loadProvider(getenv, problem)
	}
	if envValid {
		c.loadWebhookTokens(getenv, problem)
	}

	if err := errors.Join(problems...); err != nil {
		return nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return c, nil
}

// Lookup is getenv over environ: the last of a name's entries wins, as in
// os.Getenv.
func Lookup(environ []string) func(string) string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return func(k string) string { return m[k] }
}

// parseFlags reads --simulate, --help and --version. The flag package's
// errors, and what it prints with them, quote the argument, which may be a
// key: it prints nothing, and its errors are replaced with ones that name
// the flag alone.
func parseFlags(args []string) (simulate bool, err error) {
	fs := flag.NewFlagSet("paymentsd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var badSimulate bool
	fs.BoolFunc("simulate", "", func(v string) error {
		b, err := strconv.ParseBool(v)
		badSimulate = err != nil
		simulate = b
		return err
	})
	showVersion := fs.Bool("version", false, "")
	if err := fs.Parse(args[1:]); err != nil {
		switch {
		case errors.Is(err, flag.ErrHelp):
			return false, ErrHelp
		case badSimulate:
			return false, errors.New("--simulate: want no value, or true or false")
		default:
			return false, errors.New("unknown or malformed flag: paymentsd's flags are --simulate, --version and --help")
		}
	}
	if *showVersion {
		return false, ErrVersion
	}
	if fs.NArg() == 1 && fs.Arg(0) == "help" {
		return false, ErrHelp
	}
	if fs.NArg() > 0 {
		return false, fmt.Errorf("%d unexpected argument(s): paymentsd takes only flags, such as --simulate; the operators' CLI is 'paymentsd payments' (paymentsd payments --help)", fs.NArg())
	}
	return simulate, nil
}

// loadProvider reads the selected environment's base URL and key, and no
// other environment's.
func (c *Config) loadProvider(getenv func(string) string, problem func(string, ...any)) {
	prefix := "PAYMENTS_" + strings.ToUpper(c.Environment) + "_"
	urlVar, keyVar, fileVar := prefix+"BASE_URL", prefix+"API_KEY", prefix+"API_KEY_FILE"

	c.BaseURL = strings.TrimSpace(getenv(urlVar))
	u, err := url.Parse(c.BaseURL)
	switch checkErr := upstream.CheckBaseURL(c.BaseURL); {
	case c.BaseURL == "":
		problem("%s is not set: want the provider's base URL, ending in /v1", urlVar)
	case checkErr != nil || err != nil:
		// The error never quotes the URL.
		problem("%s: %v", urlVar, checkErr)
	case c.Environment == "live" && u.Scheme != "https":
		problem("%s must be https in live", urlVar)
	case !strings.HasSuffix(u.Path, "/v1"):
		problem("%s must end in /v1", urlVar)
	}

	key, file := getenv(keyVar), getenv(fileVar)
	switch {
	case key != "" && file != "":
		problem("%s and %s are both set: set one", keyVar, fileVar)
	case key == "" && file == "":
		problem("%s or %s must be set", keyVar, fileVar)
	case key != "":
		k := strings.TrimSpace(key)
		c.APIKeys, c.APIKeyFrom = []Secret{Secret(k)}, keyVar
		switch {
		case k == "":
			problem("%s is blank", keyVar)
		case keyProblem(k) != "":
			problem("%s %s", keyVar, keyProblem(k))
		}
	default:
		keys, err := readAPIKeys(file)
		if err != nil {
			problem("%s: %v", fileVar, err)
			return
		}
		c.APIKeys, c.APIKeyFrom = keys, fileVar+"="+file
		c.APIKeyFile, c.APIKeyFileVar = file, fileVar
	}
}

// loadWebhookTokens reads the selected environment's webhook tokens, one or
// two separated by commas or newlines, and never prints them.
func (c *Config) loadWebhookTokens(getenv func(string) string, problem func(string, ...any)) {
	prefix := "PAYMENTS_" + strings.ToUpper(c.Environment) + "_"
	tokVar, fileVar := prefix+"WEBHOOK_TOKEN", prefix+"WEBHOOK_TOKEN_FILE"
	tok, file := getenv(tokVar), getenv(fileVar)
	switch {
	case tok != "" && file != "":
		problem("%s and %s are both set: set one", tokVar, fileVar)
	case tok == "" && file == "":
		if c.WebhookAddr != "" {
			problem("PAYMENTS_WEBHOOK_ADDR is set, so %s or %s must be set", tokVar, fileVar)
		}
	case tok != "":
		tokens, err := parseWebhookTokens(tok)
		if err != nil {
			problem("%s: %v", tokVar, err)
			return
		}
		c.WebhookTokens, c.WebhookTokensFrom = tokens, tokVar
	default:
		tokens, err := readWebhookTokens(file)
		if err != nil {
			problem("%s: %v", fileVar, err)
			return
		}
		c.WebhookTokens, c.WebhookTokensFrom = tokens, fileVar+"="+file
		c.WebhookTokenFile, c.WebhookTokenFileVar = file, fileVar
	}
}

// loadDatabase reads PAYMENTS_DATABASE_URL or PAYMENTS_DATABASE_URL_FILE.
// The URL may hold a password, so no refusal repeats it.
func (c *Config) loadDatabase(getenv func(string) string, problem func(string, ...any)) {
	const urlVar, fileVar = "PAYMENTS_DATABASE_URL", "PAYMENTS_DATABASE_URL_FILE"
	v, file := strings.TrimSpace(getenv(urlVar)), getenv(fileVar)
	switch {
	case v != "" && file != "":
		problem("%s and %s are both set: set one", urlVar, fileVar)
		return
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			problem("%s: cannot read the file it names: %v", fileVar, FileError(err))
			return
		}
		v, c.DatabaseFrom = strings.TrimSpace(strings.TrimPrefix(string(b), "\uFEFF")), fileVar+"="+file
		if v == "" {
			problem("%s names an empty file", fileVar)
			return
		}
	case v != "":
		c.DatabaseFrom = urlVar
	case c.Simulate:
		v, c.DatabaseFrom = "sqlite::memory:", "--simulate default"
	case c.Environment == "live":
		// Live's records must outlive the pod: a default file in the
		// working directory would not (and a read-only root filesystem
		// can't hold it).
		problem("%s or %s must be set in live: want the PostgreSQL database the replicas share, or a sqlite:PATH on a persistent volume", urlVar, fileVar)
		return
	default:
		v, c.DatabaseFrom = "sqlite:paymentsd-"+c.Environment+".db", "default (PAYMENTS_DATABASE_URL is not set)"
	}
	c.DatabaseURL = Secret(v)
	// Only what can't hold a password is shown: the query can (pgx reads
	// password and sslpassword there), and so can what looks like the
	// host or the path when a password's '@', '#', '/' or '?' is not
	// escaped.
	c.DatabaseShown, _ = store.RedactedURL(v)
	if err := store.CheckURL(v); err != nil {
		problem("%s: %v", c.DatabaseVar(), err)
	}
}

// DatabaseVar is the variable the database URL was read from.
func (c *Config) DatabaseVar() string {
	if strings.HasPrefix(c.DatabaseFrom, "PAYMENTS_DATABASE_URL_FILE") {
		return "PAYMENTS_DATABASE_URL_FILE"
	}
	return "PAYMENTS_DATABASE_URL"
}

// keyProblem says what is wrong with a key, trimmed of surrounding
// whitespace, without quoting it; "" if nothing is. A key with a second
// line, a space, or a control or invisible character inside it is never
// what the provider issued, and would fail every call (a newline can't even
// be sent in a header).
func keyProblem(key string) string {
	if !utf8.ValidString(key) {
		return "holds a key that is not valid UTF-8: want the key alone, as issued"
	}
	for _, r := range key {
		switch {
		case unicode.IsSpace(r):
			return "holds whitespace inside the key (a second line, or a space): want the key alone, on one line"
		case unicode.IsControl(r) || !unicode.IsPrint(r):
			return "holds a control or invisible character inside the key: want the key alone, as issued"
		}
	}
	return ""
}
