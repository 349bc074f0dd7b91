package config

import (
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/service"
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
