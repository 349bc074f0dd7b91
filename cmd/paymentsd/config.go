package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/inbox"
	"example.com/paymentsd/service"
	"example.com/paymentsd/store"
	"example.com/paymentsd/upstream"
)

// secret is a value that must never be printed: every way of formatting or
// logging it gives [REDACTED].
type secret string

const redacted = "[REDACTED]"

func (secret) String() string               { return redacted }
func (secret) GoString() string             { return redacted }
func (secret) LogValue() slog.Value         { return slog.StringValue(redacted) }
func (secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// config is paymentsd's whole configuration, from the environment and flags.
type config struct {
	Environment string // "sandbox" or "live"
	BaseURL     string
	APIKey      secret
	// APIKeyFrom says where the key came from: a variable's name, or a
	// variable's name and the file it names.
	APIKeyFrom string
	Simulate   bool

	GRPCAddr string
	HTTPAddr string

	// UpstreamCAFile, if set, holds extra PEM roots to trust for the
	// provider's certificate (a private CA or a TLS-inspecting egress proxy).
	UpstreamCAFile string

	UpstreamMaxAttempts      int
	UpstreamTimeout          time.Duration
	UpstreamMaxResponseBytes int64
	BreakerFailures          int
	BreakerCooldown          time.Duration
	MaxRequestBytes          int
	ShutdownTimeout          time.Duration
	ShutdownDelay            time.Duration

	// DatabaseURL names the record store: sqlite:PATH or postgres://…. It
	// may hold a password, so it is a secret; DatabaseFrom says where it
	// came from, and DatabaseShown is what of it may be shown (see
	// store.RedactedURL).
	DatabaseURL      secret
	DatabaseFrom     string
	DatabaseShown    string
	SettlementWindow time.Duration
	RecordRetention  time.Duration
	// MaxInFlight caps calls in progress over both ports; MaxConnections
	// caps open connections on each port; HTTPReadTimeout bounds reading a
	// REST request's header, and then its body.
	MaxInFlight     int
	MaxConnections  int
	HTTPReadTimeout time.Duration
	// AllowedCallers, when set, are the mTLS identities (URI or DNS SANs)
	// that may call the payments services.
	AllowedCallers []string

	TLSCertFile     string
	TLSKeyFile      string
	TLSClientCAFile string

	LogLevel slog.Level

	// WebhookAddr, if set, is the webhook intake's listen address.
	WebhookAddr string
	// WebhookTokens are the accepted webhook URL tokens (two while
	// rotating), and WebhookTokensFrom the variable (and file) they came
	// from.
	WebhookTokens     []secret
	WebhookTokensFrom string
	WebhookMaxBytes   int64
	// WebhookMaxStoredBytes is the inbox's quota; WebhookMaxConnsPerIP
	// bounds the webhook port's connections from one address (0: none).
	WebhookMaxStoredBytes int64
	WebhookMaxConnsPerIP  int
}

func (c *config) env() paymentsv1.Environment {
	if c.Environment == "live" {
		return paymentsv1.Environment_ENVIRONMENT_LIVE
	}
	return paymentsv1.Environment_ENVIRONMENT_SANDBOX
}

// LogValue is the effective configuration as logged at start, key redacted.
func (c *config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("environment", c.Environment),
		slog.String("base_url", c.BaseURL),
		slog.Any("api_key", c.APIKey),
		slog.String("api_key_from", c.APIKeyFrom),
		slog.Bool("simulate", c.Simulate),
		slog.String("grpc_addr", c.GRPCAddr),
		slog.String("http_addr", c.HTTPAddr),
		slog.String("upstream_ca_file", c.UpstreamCAFile),
		slog.Int("upstream_max_attempts", c.UpstreamMaxAttempts),
		slog.String("upstream_timeout", c.UpstreamTimeout.String()),
		slog.Int64("upstream_max_response_bytes", c.UpstreamMaxResponseBytes),
		slog.Int("upstream_breaker_failures", c.BreakerFailures),
		slog.String("upstream_breaker_cooldown", c.BreakerCooldown.String()),
		slog.Int("max_request_bytes", c.MaxRequestBytes),
		slog.String("shutdown_timeout", c.ShutdownTimeout.String()),
		slog.String("shutdown_delay", c.ShutdownDelay.String()),
		slog.String("database", c.DatabaseShown),
		slog.String("database_from", c.DatabaseFrom),
		slog.String("settlement_window", c.SettlementWindow.String()),
		slog.String("record_retention", c.RecordRetention.String()),
		slog.Int("max_in_flight", c.MaxInFlight),
		slog.Int("max_connections", c.MaxConnections),
		slog.String("http_read_timeout", c.HTTPReadTimeout.String()),
		slog.Any("allowed_callers", c.AllowedCallers),
		slog.Bool("tls", c.TLSCertFile != ""),
		slog.Bool("mtls", c.TLSClientCAFile != ""),
		slog.String("log_level", c.LogLevel.String()),
		slog.String("webhook_addr", c.WebhookAddr),
		slog.Int("webhook_tokens", len(c.WebhookTokens)),
		slog.String("webhook_tokens_from", c.WebhookTokensFrom),
		slog.Int64("webhook_max_bytes", c.WebhookMaxBytes),
		slog.Int64("webhook_max_stored_bytes", c.WebhookMaxStoredBytes),
		slog.Int("webhook_max_connections_per_ip", c.WebhookMaxConnsPerIP),
	)
}

// loadConfig reads the configuration from args and getenv and validates it,
// reporting every problem at once, each naming its setting and saying what
// is wanted. A refusal never repeats a value: a key pasted into the wrong
// variable must not reach the terminal or the logs. Only the selected
// environment's variables are read.
func loadConfig(args []string, getenv func(string) string, stderr io.Writer) (*config, error) {
	// The flag package's errors, and what it prints with them, quote the
	// argument, which may be a key: it prints nothing, and its errors are
	// replaced with ones that name the flag alone.
	fs := flag.NewFlagSet("paymentsd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var simulate, badSimulate bool
	fs.BoolFunc("simulate", "serve against a built-in simulated provider (sandbox only)", func(v string) error {
		b, err := strconv.ParseBool(v)
		badSimulate = err != nil
		simulate = b
		return err
	})
	if err := fs.Parse(args[1:]); err != nil {
		switch {
		case errors.Is(err, flag.ErrHelp):
			fs.SetOutput(stderr)
			fs.Usage()
			return nil, err
		case badSimulate:
			return nil, errors.New("--simulate: want no value, or true or false")
		default:
			return nil, errors.New("unknown or malformed flag: paymentsd's only flag is --simulate (and -h for help)")
		}
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%d unexpected argument(s): paymentsd takes only flags, such as --simulate", fs.NArg())
	}

	var problems []error
	problem := func(format string, a ...any) { problems = append(problems, fmt.Errorf(format, a...)) }

	c := &config{
		Environment: strings.TrimSpace(getenv("PAYMENTS_ENVIRONMENT")),
		Simulate:    simulate,
		GRPCAddr:    addrVar(getenv, "PAYMENTS_GRPC_ADDR", ":9090", problem),
		HTTPAddr:    addrVar(getenv, "PAYMENTS_HTTP_ADDR", ":8080", problem),

		UpstreamCAFile:  fileVar(getenv, "PAYMENTS_UPSTREAM_CA_FILE", problem),
		TLSCertFile:     fileVar(getenv, "PAYMENTS_TLS_CERT_FILE", problem),
		TLSKeyFile:      fileVar(getenv, "PAYMENTS_TLS_KEY_FILE", problem),
		TLSClientCAFile: fileVar(getenv, "PAYMENTS_TLS_CLIENT_CA_FILE", problem),
	}
	if c.Environment == "" {
		c.Environment = "sandbox"
	}
	if c.Environment != "sandbox" && c.Environment != "live" {
		problem("PAYMENTS_ENVIRONMENT: want sandbox or live")
	}

	c.UpstreamMaxAttempts = intVar(getenv, "PAYMENTS_UPSTREAM_MAX_ATTEMPTS", upstream.DefaultMaxAttempts, 1, 10, problem)
	c.UpstreamTimeout = durationVar(getenv, "PAYMENTS_UPSTREAM_TIMEOUT", 15*time.Second, problem)
	c.UpstreamMaxResponseBytes = int64(intVar(getenv, "PAYMENTS_UPSTREAM_MAX_RESPONSE_BYTES", upstream.DefaultMaxResponseBytes, 1024, 64<<20, problem))
	c.BreakerFailures = intVar(getenv, "PAYMENTS_UPSTREAM_BREAKER_FAILURES", upstream.DefaultBreakerFailures, 1, 1000, problem)
	c.BreakerCooldown = durationVar(getenv, "PAYMENTS_UPSTREAM_BREAKER_COOLDOWN", upstream.DefaultBreakerCooldown, problem)
	c.MaxRequestBytes = intVar(getenv, "PAYMENTS_MAX_REQUEST_BYTES", 64<<10, 1024, 4<<20, problem)
	c.ShutdownTimeout = durationVar(getenv, "PAYMENTS_SHUTDOWN_TIMEOUT", 20*time.Second, problem)
	if v := getenv("PAYMENTS_SHUTDOWN_DELAY"); v != "" && v != "0" {
		c.ShutdownDelay = durationVar(getenv, "PAYMENTS_SHUTDOWN_DELAY", 0, problem)
	}
	if c.UpstreamTimeout > c.ShutdownTimeout {
		// A call still waiting on the provider when the drain ends is cut
		// off, and its caller is left not knowing whether it paid.
		problem("PAYMENTS_UPSTREAM_TIMEOUT (%v) is longer than PAYMENTS_SHUTDOWN_TIMEOUT (%v): want it no longer, or a provider call in flight at shutdown is cut off with its outcome unknown", c.UpstreamTimeout, c.ShutdownTimeout)
	}

	c.SettlementWindow = durationVar(getenv, "PAYMENTS_SETTLEMENT_WINDOW", 10*time.Minute, problem)
	c.RecordRetention = durationVar(getenv, "PAYMENTS_RECORD_RETENTION", 30*24*time.Hour, problem)
	if c.RecordRetention < c.SettlementWindow {
		problem("PAYMENTS_RECORD_RETENTION must be at least PAYMENTS_SETTLEMENT_WINDOW: a record can't be deleted while it may still be settled")
	}
	c.loadDatabase(getenv, problem)
	c.MaxInFlight = intVar(getenv, "PAYMENTS_MAX_IN_FLIGHT", service.DefaultMaxInFlight, 1, 100000, problem)
	c.MaxConnections = intVar(getenv, "PAYMENTS_MAX_CONNECTIONS", service.DefaultMaxConnections, 1, 100000, problem)
	c.HTTPReadTimeout = durationVar(getenv, "PAYMENTS_HTTP_READ_TIMEOUT", service.DefaultReadTimeout, problem)
	callers := getenv("PAYMENTS_ALLOWED_CALLERS")
	badCallers := false
	for i, caller := range strings.Split(callers, ",") {
		caller = strings.TrimSpace(caller)
		switch {
		case caller == "":
		case strings.ContainsFunc(caller, func(r rune) bool { return r <= ' ' || r == 0x7f }):
			problem("PAYMENTS_ALLOWED_CALLERS: identity %d in the list has spaces or control characters; an identity has none", i+1)
			badCallers = true
		default:
			c.AllowedCallers = append(c.AllowedCallers, caller)
		}
	}
	if callers != "" && len(c.AllowedCallers) == 0 && !badCallers {
		// Set, yet empty, it would turn the allowlist off: every caller
		// with a trusted certificate could call.
		problem("PAYMENTS_ALLOWED_CALLERS is set but holds no identity: want a comma-separated list of URI or DNS SANs, or leave it unset for no allowlist")
	}

	if err := c.LogLevel.UnmarshalText([]byte(orDefault(getenv("PAYMENTS_LOG_LEVEL"), "info"))); err != nil {
		problem("PAYMENTS_LOG_LEVEL: want debug, info, warn or error")
	}

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

	switch {
	case c.Simulate && c.Environment == "live":
		problem("--simulate is refused in live: PAYMENTS_ENVIRONMENT is live")
	case c.Simulate:
		// The simulator provides its own URL and key; the sandbox
		// settings, if any, are not used.
	case c.Environment == "sandbox" || c.Environment == "live":
		c.loadProvider(getenv, problem)
	}

	c.WebhookAddr = addrVar(getenv, "PAYMENTS_WEBHOOK_ADDR", "", problem)
	c.WebhookMaxBytes = int64(intVar(getenv, "PAYMENTS_WEBHOOK_MAX_BYTES", inbox.DefaultMaxBytes, 1024, inbox.LargestMaxBytes, problem))
	c.WebhookMaxStoredBytes = int64(intVar(getenv, "PAYMENTS_WEBHOOK_MAX_STORED_BYTES", 1<<30, 1<<20, 1<<50, problem))
	c.WebhookMaxConnsPerIP = intVar(getenv, "PAYMENTS_WEBHOOK_MAX_CONNECTIONS_PER_IP", inbox.DefaultMaxConnectionsPerIP, 0, 100000, problem)
	if c.Environment == "sandbox" || c.Environment == "live" {
		c.loadWebhookTokens(getenv, problem)
	}

	if err := errors.Join(problems...); err != nil {
		return nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return c, nil
}

// loadProvider reads the selected environment's base URL and key, and no
// other environment's.
func (c *config) loadProvider(getenv func(string) string, problem func(string, ...any)) {
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
		c.APIKey, c.APIKeyFrom = secret(strings.TrimSpace(key)), keyVar
		switch {
		case c.APIKey == "":
			problem("%s is blank", keyVar)
		case keyProblem(string(c.APIKey)) != "":
			problem("%s %s", keyVar, keyProblem(string(c.APIKey)))
		}
	default:
		b, err := os.ReadFile(file)
		if err != nil {
			// Neither the path (which may be a key pasted into the wrong
			// variable) nor the contents: only why it can't be read.
			problem("%s: cannot read the file it names: %v", fileVar, pathless(err))
			return
		}
		// Editors on some systems start a file with a byte-order mark.
		b = bytes.TrimPrefix(b, []byte("\uFEFF"))
		c.APIKey, c.APIKeyFrom = secret(strings.TrimSpace(string(b))), fileVar+"="+file
		switch {
		case c.APIKey == "":
			problem("%s names an empty key file", fileVar)
		case keyProblem(string(c.APIKey)) != "":
			problem("%s names a file that %s", fileVar, keyProblem(string(c.APIKey)))
		}
	}
}

// loadWebhookTokens reads the selected environment's webhook tokens, one or
// two separated by commas or newlines, and never prints them.
func (c *config) loadWebhookTokens(getenv func(string) string, problem func(string, ...any)) {
	prefix := "PAYMENTS_" + strings.ToUpper(c.Environment) + "_"
	tokVar, fileVar := prefix+"WEBHOOK_TOKEN", prefix+"WEBHOOK_TOKEN_FILE"
	tok, file := getenv(tokVar), getenv(fileVar)
	var raw, from string
	switch {
	case tok != "" && file != "":
		problem("%s and %s are both set: set one", tokVar, fileVar)
		return
	case tok == "" && file == "":
		if c.WebhookAddr != "" {
			problem("PAYMENTS_WEBHOOK_ADDR is set, so %s or %s must be set", tokVar, fileVar)
		}
		return
	case tok != "":
		raw, from = tok, tokVar
	default:
		b, err := os.ReadFile(file)
		if err != nil {
			// Neither the path nor the contents: only why it can't be read.
			problem("%s: cannot read the token file: %v", fileVar, pathless(err))
			return
		}
		raw, from = string(b), fileVar+"="+file
	}
	var tokens []secret
	for t := range strings.FieldsFuncSeq(raw, func(r rune) bool { return r == ',' || r == '\n' || r == '\r' }) {
		if t = strings.TrimSpace(t); t != "" {
			tokens = append(tokens, secret(t))
		}
	}
	switch {
	case len(tokens) == 0:
		problem("%s holds no token", from)
		return
	case len(tokens) > 2:
		problem("%s holds %d tokens: want one, or two while rotating", from, len(tokens))
		return
	case len(tokens) == 2 && tokens[0] == tokens[1]:
		problem("%s holds the same token twice", from)
		return
	}
	for _, t := range tokens {
		if err := inbox.ValidateToken(string(t)); err != nil {
			problem("%s: %v", from, err)
			return
		}
	}
	c.WebhookTokens, c.WebhookTokensFrom = tokens, from
}

// loadDatabase reads PAYMENTS_DATABASE_URL or PAYMENTS_DATABASE_URL_FILE.
// The URL may hold a password, so no refusal repeats it.
func (c *config) loadDatabase(getenv func(string) string, problem func(string, ...any)) {
	const urlVar, fileVar = "PAYMENTS_DATABASE_URL", "PAYMENTS_DATABASE_URL_FILE"
	v, file := strings.TrimSpace(getenv(urlVar)), getenv(fileVar)
	switch {
	case v != "" && file != "":
		problem("%s and %s are both set: set one", urlVar, fileVar)
		return
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			problem("%s: cannot read the file it names: %v", fileVar, pathless(err))
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
	default:
		v, c.DatabaseFrom = "sqlite:paymentsd-"+c.Environment+".db", "default"
	}
	c.DatabaseURL = secret(v)
	// Only what can't hold a password is shown: the query can (pgx reads
	// password and sslpassword there), and so can what looks like the
	// host or the path when a password's '#', '/' or '?' is not escaped.
	shown, ok := store.RedactedURL(v)
	c.DatabaseShown = shown
	switch {
	case strings.HasPrefix(v, "sqlite:"):
		if strings.TrimPrefix(v, "sqlite:") == "" {
			problem("%s: sqlite: needs a file path, e.g. sqlite:/var/lib/paymentsd/records.db", c.databaseVar())
		}
	case strings.HasPrefix(v, "postgres://"), strings.HasPrefix(v, "postgresql://"):
		u, err := url.Parse(v)
		switch {
		case err != nil || (u.Host == "" && u.Query().Get("host") == ""):
			problem("%s is not a valid postgres:// URL (it names no host, in the URL or as host= in its query)", c.databaseVar())
		case !ok:
			problem("%s holds a '#', or an '@' in its path or a query parameter's name, as a password with an unescaped # / ? or @ gives: percent-encode those in the user name and password (%%23 %%2F %%3F %%40)", c.databaseVar())
		}
	default:
		problem("%s must be sqlite:PATH or a postgres:// URL", c.databaseVar())
	}
}

func (c *config) databaseVar() string {
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

// addrVar reads a listen address, host:port or :port, refusing one that
// can't be, without repeating it.
func addrVar(getenv func(string) string, name, def string, problem func(string, ...any)) string {
	v := orDefault(getenv(name), def)
	if v == "" {
		return v
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		problem("%s: want host:port or :port, such as :9090", name)
		return v
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		problem("%s: the port must be a number from 0 to 65535", name)
	}
	if host != "" && net.ParseIP(host) == nil && !validHostname(host) {
		problem("%s: the host must be an IP address or a host name", name)
	}
	return v
}

// validHostname reports whether h has the shape of a DNS name: labels of
// letters, digits and hyphens, separated by dots.
func validHostname(h string) bool {
	if len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// fileVar reads a variable that names a file, refusing one that names no
// readable file, without repeating the path: a key pasted into the wrong
// variable must not be printed.
func fileVar(getenv func(string) string, name string, problem func(string, ...any)) string {
	path := getenv(name)
	if path == "" {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		problem("%s: cannot read the file it names: %v", name, pathless(err))
		return path
	}
	f.Close()
	return path
}

// pathless is err without the path a *fs.PathError carries.
func pathless(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return err
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func intVar(getenv func(string) string, name string, def, lo, hi int, problem func(string, ...any)) int {
	v := getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		problem("%s: want a whole number from %d to %d", name, lo, hi)
		return def
	}
	return n
}

func durationVar(getenv func(string) string, name string, def time.Duration, problem func(string, ...any)) time.Duration {
	v := getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		problem("%s: want a positive Go duration such as 15s", name)
		return def
	}
	return d
}
