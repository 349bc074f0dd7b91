package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/inbox"
	"example.com/paymentsd/internal/service"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/upstream"
)

// Secret is a value that must never be printed: every way of formatting or
// logging it gives [REDACTED].
type Secret string

const redacted = "[REDACTED]"

func (Secret) String() string               { return redacted }
func (Secret) GoString() string             { return redacted }
func (Secret) LogValue() slog.Value         { return slog.StringValue(redacted) }
func (Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// Config is paymentsd's whole configuration, from the environment and flags.
type Config struct {
	Environment string // "sandbox" or "live"
	BaseURL     string
	// APIKeys are the provider keys: one, or two (current, then next)
	// while rotating.
	APIKeys []Secret
	// APIKeyFrom says where the keys came from: a variable's name, or a
	// variable's name and the file it names; APIKeyFile is that file, which
	// is re-read while serving, and APIKeyFileVar its variable.
	APIKeyFrom    string
	APIKeyFile    string
	APIKeyFileVar string
	Simulate      bool

	GRPCAddr string
	HTTPAddr string
	// HealthAddr, if set, is a listen address serving health checks and
	// nothing else, in plaintext, for the kubelet's probes.
	HealthAddr string
	// MetricsAddr, if set, is a listen address serving GET /metrics and
	// nothing else, for a scraper that must not reach the REST API.
	MetricsAddr string

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
	DatabaseURL    Secret
	DatabaseFrom   string
	DatabaseShown  string
	ConnectTimeout time.Duration
	MigrateTimeout time.Duration

	SettlementWindow time.Duration
	RecordRetention  time.Duration
	// ProviderQuietPeriod is how long a request that ended without the
	// provider's answer is presumed still at the provider; TombstoneRetention
	// how long a deleted record's tombstone refuses its key.
	ProviderQuietPeriod time.Duration
	TombstoneRetention  time.Duration
	// MaxInFlight caps calls in progress over both ports; MaxConnections
	// caps open connections on each port; HTTPReadTimeout bounds reading a
	// REST request's header, and then its body.
	MaxInFlight     int
	MaxConnections  int
	HTTPReadTimeout time.Duration
	// AllowedCallers, when set, are the mTLS identities (SPIFFE IDs, or
	// dns: names) that may call the payments services.
	AllowedCallers []service.Identity
	// AdminCallers are the mTLS identities that may list every caller's
	// payments and resolve payments in doubt.
	AdminCallers []service.Identity
	// EventReaders are the mTLS identities that may list and watch the
	// provider's events (as may the admins).
	EventReaders []service.Identity
	// AllowUnidentifiedCallers lets live start without client
	// certificates, so without caller identities.
	AllowUnidentifiedCallers bool

	TLSCertFile     string
	TLSKeyFile      string
	TLSClientCAFile string

	LogLevel slog.Level

	// WebhookAddr, if set, is the webhook intake's listen address.
	WebhookAddr string
	// WebhookTokens are the accepted webhook URL tokens (two while
	// rotating), and WebhookTokensFrom the variable (and file) they came
	// from.
	WebhookTokens     []Secret
	WebhookTokensFrom string
	// WebhookTokenFile, if the tokens came from a file, is re-read while
	// serving; WebhookTokenFileVar is its variable.
	WebhookTokenFile    string
	WebhookTokenFileVar string
	// SecretReloadInterval is how often the key and token files are
	// re-read.
	SecretReloadInterval time.Duration
	WebhookMaxBytes      int64
	// WebhookMaxStoredBytes is the inbox's quota; WebhookMaxConnsPerIP
	// bounds the webhook port's connections from one address (0: none).
	WebhookMaxStoredBytes int64
	WebhookMaxConnsPerIP  int

	// Version is what paymentsd --version prints, and Release the version
	// alone, as one token (paymentsd/<Release> to the provider). main sets
	// them: its link-time stamps are main's.
	Version, Release string

	// Hooks are a test binary's changes; none in production builds.
	Hooks Hooks
	// Registry, if set, holds the metrics instead of a new registry, so a
	// test can read the description of every metric paymentsd registers,
	// even those with no series yet. Never set from the environment.
	Registry *prometheus.Registry
}

// A variable is one PAYMENTS_* setting. The table of them (variables) is
// the one list paymentsd knows: Load reads the environment through
// it, --help prints it, the start-up line logs it, and a PAYMENTS_* name
// that is not in it is refused. Adding a setting is adding an entry (and
// its field in config).
type variable struct {
	// name is the variable's name; "<ENV>" in it stands for SANDBOX or
	// LIVE, and only PAYMENTS_ENVIRONMENT's is read.
	name string
	// def is the default, as it would be written in the environment; an
	// unset or empty variable takes it. For a variable read by one of
	// Load's own steps (parse is nil) it only describes the default.
	def string
	// meaning is what --help says the variable does.
	meaning string
	setting
}

// A setting reads a variable's value into the configuration and shows it.
type setting struct {
	// parse reads v, the value or else the default, into c; its error
	// says what is wanted and never quotes v. nil: Load reads the
	// variable in a step of its own, with the variables it goes with.
	parse func(c *Config, v string) error
	// show is the effective value as the start-up line logs it; nil: it
	// is logged with its step's other settings, or not at all.
	show func(c *Config) slog.Value
}

// simulateDefaults are the defaults that --simulate changes, so that a
// payment whose outcome is unknown settles, or is given up on and can be
// resolved, in seconds rather than minutes (docs/simulator.md). They keep
// the rules Load checks: the quiet period at least the upstream
// timeout, and shorter than the settlement window.
var simulateDefaults = map[string]string{
	"PAYMENTS_SETTLEMENT_WINDOW":     "20s",
	"PAYMENTS_PROVIDER_QUIET_PERIOD": "5s",
	"PAYMENTS_UPSTREAM_TIMEOUT":      "5s",
}

// defaultFor is v's default, under --simulate if simulate.
func (v variable) defaultFor(simulate bool) string {
	if d, ok := simulateDefaults[v.name]; ok && simulate {
		return d
	}
	return v.def
}

// variables is paymentsd's configuration, in the order it is read and
// listed.
func variables() []variable {
	return []variable{
		{"PAYMENTS_ENVIRONMENT", "sandbox",
			"Which environment of the provider to call: sandbox or live. Only that environment's PAYMENTS_<ENV>_* variables are read.",
			setting{parse: func(c *Config, v string) error {
				c.Environment = strings.TrimSpace(v)
				if c.Environment == "" {
					c.Environment = "sandbox"
				}
				if c.Environment != "sandbox" && c.Environment != "live" {
					return errors.New("want sandbox or live")
				}
				return nil
			}}},
		{"PAYMENTS_<ENV>_BASE_URL", "",
			"The provider's base URL for the environment: ending in /v1, with a host, no credentials, no query or fragment (not even a bare ? or #), and a port, if any, from 1 to 65535; https in live. Required unless --simulate.",
			setting{}},
		{"PAYMENTS_<ENV>_API_KEY_FILE", "",
			"A file holding the environment's provider API key, or two, one a line, while rotating: the one to use first, then the next (a byte-order mark, whitespace around each line and blank lines are ignored; more than two keys, an empty file or one key twice is refused). Re-read every PAYMENTS_SECRET_RELOAD_INTERVAL; a 401 or 403 with one key is retried once with the other. Set this or PAYMENTS_<ENV>_API_KEY unless --simulate.",
			setting{}},
		{"PAYMENTS_<ENV>_API_KEY", "",
			"The environment's provider API key itself, read once at start; prefer PAYMENTS_<ENV>_API_KEY_FILE, which can be rotated without a restart.",
			setting{}},
		{"PAYMENTS_GRPC_ADDR", ":9090",
			"The gRPC listen address, host:port or :port.",
			addrSetting(func(c *Config) *string { return &c.GRPCAddr })},
		{"PAYMENTS_HTTP_ADDR", ":8080",
			"The HTTP listen address: REST, /healthz, /readyz, /metrics and /openapi.json.",
			addrSetting(func(c *Config) *string { return &c.HTTPAddr })},
		{"PAYMENTS_METRICS_ADDR", "",
			"A listen address serving GET /metrics and nothing else, in plaintext even when the other ports serve TLS, so that the scraper needs neither access to PAYMENTS_HTTP_ADDR, whose REST API takes payments, nor a client certificate. Unset: /metrics on PAYMENTS_HTTP_ADDR only.",
			addrSetting(func(c *Config) *string { return &c.MetricsAddr })},
		{"PAYMENTS_HEALTH_ADDR", "",
			"A listen address serving health checks and nothing else, in plaintext and without client certificates, for the kubelet's probes: grpc.health.v1 Check and List over cleartext HTTP/2 (service \"\" for readiness, \"liveness\" for liveness) and GET /healthz and /readyz. Unset: health checks on PAYMENTS_GRPC_ADDR and PAYMENTS_HTTP_ADDR only, which need a client certificate when PAYMENTS_TLS_CLIENT_CA_FILE is set.",
			addrSetting(func(c *Config) *string { return &c.HealthAddr })},
		{"PAYMENTS_DATABASE_URL", "sqlite:paymentsd-sandbox.db in sandbox; none in live",
			"The record store: sqlite:PATH, or a postgres:// URL for replicas sharing one database (percent-encode @ / ? # % in its user name and password). Required in live; --simulate keeps records in memory unless it is set.",
			setting{}},
		{"PAYMENTS_DATABASE_URL_FILE", "",
			"A file holding PAYMENTS_DATABASE_URL instead (its password stays out of the environment).",
			setting{}},
		{"PAYMENTS_DATABASE_CONNECT_TIMEOUT", "15s",
			"How long start-up waits for the record store's first connection before giving up; also bounds each later PostgreSQL connection whose URL sets no connect_timeout.",
			durationSetting(func(c *Config) *time.Duration { return &c.ConnectTimeout })},
		{"PAYMENTS_DATABASE_MIGRATE_TIMEOUT", "1m",
			"How long start-up waits for the record store's migrations, including another replica's running at the same time, before giving up.",
			durationSetting(func(c *Config) *time.Duration { return &c.MigrateTimeout })},
		{"PAYMENTS_SETTLEMENT_WINDOW", "10m",
			"How long after a payment's first attempt paymentsd keeps re-sending one whose outcome is unknown.",
			durationSetting(func(c *Config) *time.Duration { return &c.SettlementWindow })},
		{"PAYMENTS_RECORD_RETENTION", "720h",
			"How long payment records and webhook events are kept after their last change (720h is 30 days); at least PAYMENTS_SETTLEMENT_WINDOW.",
			durationSetting(func(c *Config) *time.Duration { return &c.RecordRetention })},
		{"PAYMENTS_TOMBSTONE_RETENTION", "9600h",
			"How long a deleted record's tombstone (the SHA-256 of its key and body, its final state and dates) refuses its key (9600h is 400 days); at least 1h.",
			durationSetting(func(c *Config) *time.Duration { return &c.TombstoneRetention })},
		{"PAYMENTS_PROVIDER_QUIET_PERIOD", "30s",
			"How long after its start a request that ended without the provider's answer is presumed still at the provider: nothing is sent with its key until then. At least PAYMENTS_UPSTREAM_TIMEOUT, and shorter than PAYMENTS_SETTLEMENT_WINDOW.",
			durationSetting(func(c *Config) *time.Duration { return &c.ProviderQuietPeriod })},
		{"PAYMENTS_UPSTREAM_TIMEOUT", "15s",
			"Bounds each payment's provider calls, retries included (a caller's deadline bounds only its own wait); at most PAYMENTS_SHUTDOWN_TIMEOUT and PAYMENTS_PROVIDER_QUIET_PERIOD.",
			durationSetting(func(c *Config) *time.Duration { return &c.UpstreamTimeout })},
		{"PAYMENTS_UPSTREAM_MAX_ATTEMPTS", strconv.Itoa(upstream.DefaultMaxAttempts),
			"Attempts per provider call, the first included, for failures that may be retried.",
			intSetting(1, 10, func(c *Config) *int { return &c.UpstreamMaxAttempts })},
		{"PAYMENTS_UPSTREAM_MAX_RESPONSE_BYTES", strconv.Itoa(upstream.DefaultMaxResponseBytes),
			"The largest provider reply read.",
			int64Setting(1024, 64<<20, func(c *Config) *int64 { return &c.UpstreamMaxResponseBytes })},
		{"PAYMENTS_UPSTREAM_BREAKER_FAILURES", strconv.Itoa(upstream.DefaultBreakerFailures),
			"Consecutive failed provider attempts that open the circuit breaker.",
			intSetting(1, 1000, func(c *Config) *int { return &c.BreakerFailures })},
		{"PAYMENTS_UPSTREAM_BREAKER_COOLDOWN", upstream.DefaultBreakerCooldown.String(),
			"How long an open circuit breaker fails calls fast before letting one through.",
			durationSetting(func(c *Config) *time.Duration { return &c.BreakerCooldown })},
		{"PAYMENTS_UPSTREAM_CA_FILE", "",
			"A PEM file of extra roots to trust for the provider's certificate (a private CA, or a TLS-inspecting egress proxy).",
			fileSetting(func(c *Config) *string { return &c.UpstreamCAFile })},
		{"PAYMENTS_MAX_REQUEST_BYTES", strconv.Itoa(64 << 10),
			"The largest REST body or gRPC message accepted.",
			intSetting(1024, 4<<20, func(c *Config) *int { return &c.MaxRequestBytes })},
		{"PAYMENTS_MAX_IN_FLIGHT", strconv.Itoa(service.DefaultMaxInFlight),
			"Calls in progress at once, over both ports together; more are refused with RESOURCE_EXHAUSTED (REST 429).",
			intSetting(1, 100000, func(c *Config) *int { return &c.MaxInFlight })},
		{"PAYMENTS_MAX_CONNECTIONS", strconv.Itoa(service.DefaultMaxConnections),
			"Open connections on each port; more are closed as they are accepted.",
			intSetting(1, 100000, func(c *Config) *int { return &c.MaxConnections })},
		{"PAYMENTS_HTTP_READ_TIMEOUT", service.DefaultReadTimeout.String(),
			"How long a REST request's header, and then its body, may take to arrive.",
			durationSetting(func(c *Config) *time.Duration { return &c.HTTPReadTimeout })},
		{"PAYMENTS_SHUTDOWN_DELAY", "0",
			"How long to keep serving after SIGTERM, with readiness already failing, while load balancers stop sending.",
			setting{
				parse: func(c *Config, v string) error {
					if v == "0" {
						c.ShutdownDelay = 0
						return nil
					}
					return parseDuration(v, &c.ShutdownDelay)
				},
				show: func(c *Config) slog.Value { return slog.StringValue(c.ShutdownDelay.String()) },
			}},
		{"PAYMENTS_SHUTDOWN_TIMEOUT", "20s",
			"How long calls in flight at SIGTERM may take to finish before they are cut off.",
			durationSetting(func(c *Config) *time.Duration { return &c.ShutdownTimeout })},
		{"PAYMENTS_TLS_CERT_FILE", "",
			"The server's PEM certificate (and its chain); with PAYMENTS_TLS_KEY_FILE, the gRPC, HTTP and webhook ports serve TLS. Re-read every PAYMENTS_SECRET_RELOAD_INTERVAL, with the key, so a renewed certificate is used without a restart. Unset: plaintext.",
			fileSetting(func(c *Config) *string { return &c.TLSCertFile })},
		{"PAYMENTS_TLS_KEY_FILE", "",
			"The server certificate's PEM private key.",
			fileSetting(func(c *Config) *string { return &c.TLSKeyFile })},
		{"PAYMENTS_TLS_CLIENT_CA_FILE", "",
			"PEM roots that callers' client certificates must chain to (mTLS) on the gRPC and HTTP ports: with it every caller has an identity, the one SPIFFE ID (URI SAN) or DNS name (DNS SAN) of its certificate, and a certificate naming none is refused (CALLER_NOT_ALLOWED). Needs the server certificate. Re-read every PAYMENTS_SECRET_RELOAD_INTERVAL. Unset: callers are not identified, which paymentsd says at start; live refuses to start so unless PAYMENTS_ALLOW_UNIDENTIFIED_CALLERS is true.",
			fileSetting(func(c *Config) *string { return &c.TLSClientCAFile })},
		{"PAYMENTS_ALLOW_UNIDENTIFIED_CALLERS", "false",
			"true lets live start without PAYMENTS_TLS_CLIENT_CA_FILE, so without caller identities: every caller that reaches the ports may pay and look up any key, nobody may list, resolve or read events, and records name no caller. For a deployment that identifies its callers some other way; paymentsd logs an error at start all the same.",
			setting{
				parse: func(c *Config, v string) error {
					b, err := strconv.ParseBool(v)
					if err != nil {
						return errors.New("want true or false")
					}
					c.AllowUnidentifiedCallers = b
					return nil
				},
				show: func(c *Config) slog.Value { return slog.BoolValue(c.AllowUnidentifiedCallers) },
			}},
		{"PAYMENTS_ALLOWED_CALLERS", "",
			"Comma-separated caller identities that may pay, and look up and list their own payments: SPIFFE IDs (spiffe://trust-domain/path, matched byte for byte) or dns: and a DNS name (dns:billing.corp.example); needs PAYMENTS_TLS_CLIENT_CA_FILE. Unset: every caller whose trusted certificate names an identity may; set to only commas or spaces: refused.",
			identitiesSetting(func(c *Config) *[]service.Identity { return &c.AllowedCallers })},
		{"PAYMENTS_ADMIN_CALLERS", "",
			"Comma-separated caller identities, written as for PAYMENTS_ALLOWED_CALLERS, that may list every caller's payments, resolve payments in doubt and read provider events: usually on-call people (spiffe://trust-domain/ns/NAMESPACE/people/NAME, the user name escaped as docs/identity.md says); needs PAYMENTS_TLS_CLIENT_CA_FILE. Not in PAYMENTS_ALLOWED_CALLERS, they may do all that but pay (CreateMultiCardPayment is refused, CALLER_NOT_ALLOWED). Unset: nobody (but everyone under --simulate).",
			identitiesSetting(func(c *Config) *[]service.Identity { return &c.AdminCallers })},
		{"PAYMENTS_EVENT_READERS", "",
			"Comma-separated caller identities, written as for PAYMENTS_ALLOWED_CALLERS, that may list and watch the provider's events (ProviderEventsService), which tell of every caller's payments; the admins may too; needs PAYMENTS_TLS_CLIENT_CA_FILE. Not in PAYMENTS_ALLOWED_CALLERS, they may call the provider-events service and nothing else. Unset: only the admins (everyone under --simulate).",
			identitiesSetting(func(c *Config) *[]service.Identity { return &c.EventReaders })},
		{"PAYMENTS_LOG_LEVEL", "info",
			"The lowest level logged: debug, info, warn or error. The start-up and shutdown lines are always logged.",
			setting{
				parse: func(c *Config, v string) error {
					if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
						return errors.New("want debug, info, warn or error")
					}
					return nil
				},
				show: func(c *Config) slog.Value { return slog.StringValue(c.LogLevel.String()) },
			}},
		{"PAYMENTS_WEBHOOK_ADDR", "",
			"The webhook intake's own listen address. Unset: no intake. Needs PAYMENTS_<ENV>_WEBHOOK_TOKEN_FILE or PAYMENTS_<ENV>_WEBHOOK_TOKEN.",
			addrSetting(func(c *Config) *string { return &c.WebhookAddr })},
		{"PAYMENTS_<ENV>_WEBHOOK_TOKEN_FILE", "",
			"A file holding the environment's webhook URL token: at least 32 of A-Z a-z 0-9 - . _ ~ (openssl rand -hex 32); two, one a line, while rotating. Re-read every PAYMENTS_SECRET_RELOAD_INTERVAL.",
			setting{}},
		{"PAYMENTS_<ENV>_WEBHOOK_TOKEN", "",
			"The webhook URL token itself (two, comma-separated, while rotating); prefer PAYMENTS_<ENV>_WEBHOOK_TOKEN_FILE.",
			setting{}},
		{"PAYMENTS_SECRET_RELOAD_INTERVAL", "10s",
			"How often PAYMENTS_<ENV>_API_KEY_FILE and PAYMENTS_<ENV>_WEBHOOK_TOKEN_FILE are re-read (by content, so a Kubernetes Secret volume's in-place update is seen). A file that becomes unreadable, empty or malformed keeps the last good keys, with a warning and paymentsd_secret_file_ok 0. At least 10ms.",
			minDurationSetting(10*time.Millisecond, func(c *Config) *time.Duration { return &c.SecretReloadInterval })},
		{"PAYMENTS_WEBHOOK_MAX_BYTES", strconv.Itoa(inbox.DefaultMaxBytes),
			"The largest webhook delivery body accepted (413 beyond); at least 1024, at most 512 KiB, so that any event fits a page a default gRPC client can read within the memory budget.",
			int64Setting(1024, inbox.LargestMaxBytes, func(c *Config) *int64 { return &c.WebhookMaxBytes })},
		{"PAYMENTS_WEBHOOK_MAX_STORED_BYTES", strconv.Itoa(1 << 30),
			"The webhook inbox's quota: past it deliveries get 503 (outcome over_quota) until retention deletes old events; at least 1 MiB.",
			int64Setting(1<<20, 1<<50, func(c *Config) *int64 { return &c.WebhookMaxStoredBytes })},
		{"PAYMENTS_WEBHOOK_MAX_CONNECTIONS_PER_IP", strconv.Itoa(inbox.DefaultMaxConnectionsPerIP),
			"Open connections to the webhook port from one address; 0 for no bound. Behind an Ingress every connection comes from its addresses: raise it there.",
			intSetting(0, 100000, func(c *Config) *int { return &c.WebhookMaxConnsPerIP })},
	}
}

// ignoredVariables are PAYMENTS_* variables that other programs read,
// which paymentsd accepts and ignores.
var ignoredVariables = map[string]string{
	"PAYMENTS_TEST_POSTGRES_URL": "the tests' PostgreSQL server (bash .ci/postgres sets it)",
	"PAYMENTS_BENCH_CPUPROFILE":  "paymentsbench's CPU profile, read only by a binary built with -tags=benchprofile",
	"PAYMENTS_CLI_ADDR":          "paymentsd payments' --addr",
	"PAYMENTS_CLI_TLS_CA_FILE":   "paymentsd payments' --tls-ca",
	"PAYMENTS_CLI_TLS_CERT_FILE": "paymentsd payments' --tls-cert",
	"PAYMENTS_CLI_TLS_KEY_FILE":  "paymentsd payments' --tls-key",
	"PAYMENTS_CLI_SERVER_NAME":   "paymentsd payments' --server-name",
}

// environments are the provider environments, as <ENV> is written.
var environments = []string{"SANDBOX", "LIVE"}

// names is the variable's name with <ENV> as env.
func (v variable) named(env string) string {
	return strings.ReplaceAll(v.name, "<ENV>", env)
}

func durationSetting(field func(*Config) *time.Duration) setting {
	return setting{
		parse: func(c *Config, v string) error { return parseDuration(v, field(c)) },
		show:  func(c *Config) slog.Value { return slog.StringValue(field(c).String()) },
	}
}

// minDurationSetting is durationSetting for a duration that must be at
// least lo, such as a polling interval that would otherwise spin.
func minDurationSetting(lo time.Duration, field func(*Config) *time.Duration) setting {
	s := durationSetting(field)
	parse := s.parse
	s.parse = func(c *Config, v string) error {
		if err := parse(c, v); err != nil {
			return err
		}
		if *field(c) < lo {
			return fmt.Errorf("want at least %v", lo)
		}
		return nil
	}
	return s
}

func parseDuration(v string, d *time.Duration) error {
	p, err := time.ParseDuration(v)
	if err != nil || p <= 0 {
		return errors.New("want a positive Go duration such as 15s")
	}
	*d = p
	return nil
}

func intSetting(lo, hi int, field func(*Config) *int) setting {
	return setting{
		parse: func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < lo || n > hi {
				return fmt.Errorf("want a whole number from %d to %d", lo, hi)
			}
			*field(c) = n
			return nil
		},
		show: func(c *Config) slog.Value { return slog.IntValue(*field(c)) },
	}
}

func int64Setting(lo, hi int64, field func(*Config) *int64) setting {
	return setting{
		parse: func(c *Config, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < lo || n > hi {
				return fmt.Errorf("want a whole number from %d to %d", lo, hi)
			}
			*field(c) = n
			return nil
		},
		show: func(c *Config) slog.Value { return slog.Int64Value(*field(c)) },
	}
}

// addrSetting reads a listen address, host:port or :port; "" (no default)
// means none.
func addrSetting(field func(*Config) *string) setting {
	return setting{
		parse: func(c *Config, v string) error {
			*field(c) = v
			if v == "" {
				return nil
			}
			host, port, err := net.SplitHostPort(v)
			if err != nil {
				return errors.New("want host:port or :port, such as :9090")
			}
			var problems []error
			if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
				problems = append(problems, errors.New("the port must be a number from 0 to 65535"))
			}
			if host != "" && net.ParseIP(host) == nil && !validHostname(host) {
				problems = append(problems, errors.New("the host must be an IP address or a host name"))
			}
			return errors.Join(problems...)
		},
		show: func(c *Config) slog.Value { return slog.StringValue(*field(c)) },
	}
}

// fileSetting reads a variable that names a file, refusing one that names
// no readable file.
func fileSetting(field func(*Config) *string) setting {
	return setting{
		parse: func(c *Config, path string) error {
			*field(c) = path
			if path == "" {
				return nil
			}
			f, err := os.Open(path)
			if err != nil {
				return fmt.Errorf("cannot read the file it names: %v", FileError(err))
			}
			defer f.Close()
			if st, err := f.Stat(); err == nil && st.IsDir() {
				// It exists, so it is a path, not a key pasted by mistake.
				return fmt.Errorf("names a directory, %s: want a file", path)
			}
			return nil
		},
		show: func(c *Config) slog.Value { return slog.StringValue(*field(c)) },
	}
}

// identitiesSetting reads a comma-separated list of caller identities.
func identitiesSetting(field func(*Config) *[]service.Identity) setting {
	return setting{
		parse: func(c *Config, v string) error { return parseIdentities(field(c), v) },
		show: func(c *Config) slog.Value {
			out := make([]string, len(*field(c)))
			for i, id := range *field(c) {
				out[i] = id.String()
			}
			return slog.AnyValue(out)
		},
	}
}

// parseIdentities parses a comma-separated list of identities into list.
// Its errors say which entry is wrong and what is wanted, without quoting
// it.
func parseIdentities(list *[]service.Identity, v string) error {
	var problems []error
	for i, entry := range strings.Split(v, ",") {
		entry = strings.TrimSpace(entry)
		switch {
		case entry == "":
		case strings.ContainsFunc(entry, func(r rune) bool { return r <= ' ' || r == 0x7f }):
			problems = append(problems, fmt.Errorf("identity %d in the list has spaces or control characters; an identity has none", i+1))
		default:
			id, err := service.ParseIdentity(entry)
			if err != nil {
				problems = append(problems, fmt.Errorf("identity %d in the list: %w", i+1, err))
				continue
			}
			*list = append(*list, id)
		}
	}
	if v != "" && len(*list) == 0 && len(problems) == 0 {
		// Set, yet empty, it would turn the allowlist off (every caller
		// with a trusted certificate could call), or name no admin.
		return errors.New("set but holds no identity: want a comma-separated list of SPIFFE IDs or dns: names, or leave it unset")
	}
	return errors.Join(problems...)
}

// Env is the environment as the API names it.
func (c *Config) Env() paymentsv1.Environment {
	if c.Environment == "live" {
		return paymentsv1.Environment_ENVIRONMENT_LIVE
	}
	return paymentsv1.Environment_ENVIRONMENT_SANDBOX
}

// LogValue is the effective configuration as logged at start: every
// variable's value, secrets redacted, named as the variable is, in lower
// case without PAYMENTS_.
func (c *Config) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.String("version", c.Version),
		slog.String("environment", c.Environment),
		slog.String("base_url", c.BaseURL),
		slog.Any("api_key", Secret("")),
		slog.Any("api_keys", fingerprints(c.APIKeys)),
		slog.String("api_key_in_use", apiKeyInUse(c.APIKeys)),
		slog.String("api_key_from", c.APIKeyFrom),
		slog.Bool("simulate", c.Simulate),
		slog.String("database", c.DatabaseShown),
		slog.String("database_from", c.DatabaseFrom),
		slog.Int("webhook_tokens", len(c.WebhookTokens)),
		slog.String("webhook_tokens_from", c.WebhookTokensFrom),
	}
	for _, v := range variables() {
		if v.show != nil {
			attrs = append(attrs, slog.Attr{Key: strings.ToLower(strings.TrimPrefix(v.name, "PAYMENTS_")), Value: v.show(c)})
		}
	}
	return slog.GroupValue(attrs...)
}

// apiKeyInUse is the fingerprint of the key requests carry first at
// start, "" if there is none.
func apiKeyInUse(keys []Secret) string {
	if len(keys) == 0 {
		return ""
	}
	return fingerprints(keys[:1])[0]
}

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

// FileError is err, from opening or reading a file, saying where its path
// leads without repeating it unless it exists: a variable meant to name a
// file may hold a key pasted by mistake, which must not be printed, but a
// path that exists on this machine is no secret. For a path that doesn't
// exist it names the nearest directory above it that does, which tells a
// mount in the wrong place from a file name mistyped.
func FileError(err error) error {
	var pe *fs.PathError
	if !errors.As(err, &pe) {
		return err
	}
	path := pe.Path
	if _, statErr := os.Stat(path); statErr == nil {
		return fmt.Errorf("%s %s: %w", pe.Op, path, pe.Err)
	}
	abs, absErr := filepath.Abs(path)
	if absErr != nil {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	dir := filepath.Dir(abs)
	for {
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return fmt.Errorf("%s: %w (the nearest directory on its path that exists is %s)", pe.Op, pe.Err, dir)
}
