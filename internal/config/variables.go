package config

import (
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"example.com/paymentsd/internal/inbox"
	"example.com/paymentsd/internal/service"
	"example.com/paymentsd/internal/upstream"
)

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
		{"PAYMENTS_UPSTREAM_MAX_ATTEMPTS", strconv.Itoa(upstream.DefaultMaxRequests),
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
