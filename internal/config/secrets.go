package config

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"example.com/paymentsd/internal/inbox"
	"example.com/paymentsd/internal/upstream"
)

// maxSecretFile bounds how much of a key or token file is read: two keys
// or tokens are a few hundred bytes.
const maxSecretFile = 64 << 10

// readSecretFile reads a key or token file. Its error names the path only
// where fileError does, and never quotes the contents.
func readSecretFile(path string) ([]byte, error) {
	// Only a regular file (or a symlink to one, as in a Kubernetes Secret
	// volume) is opened: opening a named pipe blocks until something
	// writes to it, which would hang startup, the reloads and shutdown.
	switch st, err := os.Stat(path); {
	case err != nil:
		return nil, fmt.Errorf("cannot read the file it names: %v", FileError(err))
	case st.IsDir():
		return nil, fmt.Errorf("names a directory, %s: want a file", path)
	case !st.Mode().IsRegular():
		return nil, fmt.Errorf("names %s, which is not a regular file (%s): want a file", path, st.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read the file it names: %v", FileError(err))
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.IsDir() {
		return nil, fmt.Errorf("names a directory, %s: want a file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read the file it names: %v", FileError(err))
	}
	if len(b) > maxSecretFile {
		return nil, fmt.Errorf("names a file over %d bytes: want one or two lines", maxSecretFile)
	}
	return b, nil
}

// secretLines is a secret file's lines: a byte-order mark, whitespace
// around each line and blank lines are ignored.
func secretLines(b []byte) []string {
	b = bytes.TrimPrefix(b, []byte("\uFEFF"))
	var lines []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			lines = append(lines, line)
		}
	}
	return lines
}

// parseAPIKeys reads a key file's contents: one key, or two while
// rotating, one a line. The error never quotes them.
func parseAPIKeys(b []byte) ([]Secret, error) {
	lines := secretLines(b)
	switch {
	case len(lines) == 0:
		return nil, errors.New("names an empty key file: want the key, or two keys one a line while rotating")
	case len(lines) > 2:
		return nil, fmt.Errorf("names a file of %d lines: want one key, or two (current, then next) while rotating", len(lines))
	case len(lines) == 2 && lines[0] == lines[1]:
		return nil, errors.New("names a file holding the same key twice")
	}
	keys := make([]Secret, len(lines))
	for i, k := range lines {
		if p := keyProblem(k); p != "" {
			return nil, fmt.Errorf("names a file whose line %d %s", i+1, p)
		}
		keys[i] = Secret(k)
	}
	return keys, nil
}

func readAPIKeys(path string) ([]Secret, error) {
	b, err := readSecretFile(path)
	if err != nil {
		return nil, err
	}
	return parseAPIKeys(b)
}

// parseWebhookTokens reads one or two webhook tokens, separated by commas
// or newlines. The error never quotes them.
func parseWebhookTokens(raw string) ([]Secret, error) {
	var tokens []Secret
	raw = strings.TrimPrefix(raw, "\uFEFF")
	for t := range strings.FieldsFuncSeq(raw, func(r rune) bool { return r == ',' || r == '\n' || r == '\r' }) {
		if t = strings.TrimSpace(t); t != "" {
			tokens = append(tokens, Secret(t))
		}
	}
	switch {
	case len(tokens) == 0:
		return nil, errors.New("holds no token")
	case len(tokens) > 2:
		return nil, fmt.Errorf("holds %d tokens: want one, or two while rotating", len(tokens))
	case len(tokens) == 2 && tokens[0] == tokens[1]:
		return nil, errors.New("holds the same token twice")
	}
	for _, t := range tokens {
		if err := inbox.ValidateToken(string(t)); err != nil {
			return nil, err
		}
	}
	return tokens, nil
}

func readWebhookTokens(path string) ([]Secret, error) {
	b, err := readSecretFile(path)
	if err != nil {
		return nil, err
	}
	return parseWebhookTokens(string(b))
}

// Values of the secret label.
const (
	secretProviderKey   = "provider_api_key"
	secretWebhookTokens = "webhook_tokens"
)

// SecretMetrics are the reloads of key, token and TLS files.
type SecretMetrics struct {
	ok      *prometheus.GaugeVec
	reloads *prometheus.CounterVec
}

// NewSecretMetrics registers the reload metrics with reg.
func NewSecretMetrics(reg prometheus.Registerer) *SecretMetrics {
	m := &SecretMetrics{
		ok: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "paymentsd_secret_file_ok",
			Help: "1 if the secret's file (provider_api_key, webhook_tokens, tls_certificate, tls_client_ca) was readable and well formed when last read; 0 if not, and the last good secrets are in use.",
		}, []string{"secret"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paymentsd_secret_reloads_total",
			Help: "Changes seen in a secret's file, by result: ok (new secrets in use), unreadable (missing, a directory, no permission) or invalid (empty or malformed); a file that stays broken counts once.",
		}, []string{"secret", "result"}),
	}
	reg.MustRegister(m.ok, m.reloads)
	return m
}

// secretFile is a key or token file that is re-read while serving.
type secretFile struct {
	secret   string // the metric label
	variable string // the variable naming the file
	path     string
	// parse reads the file's contents; apply puts its secrets in use and
	// returns what to log of them (fingerprints).
	parse func([]byte) ([]Secret, error)
	apply func([]Secret) ([]slog.Attr, error)
}

// watch re-reads f every interval until ctx ends. New contents are put in
// use; a file that can't be read or parsed leaves the last good secrets in
// use, said once in the log and in paymentsd_secret_file_ok until it is
// good again. Contents are compared, not the file's inode or time: a
// Kubernetes Secret volume swaps a symlink, and editors replace files.
func (f *secretFile) watch(ctx context.Context, good []Secret, interval time.Duration, m *SecretMetrics, logger *slog.Logger) {
	m.ok.WithLabelValues(f.secret).Set(1)
	for _, r := range []string{"ok", "unreadable", "invalid"} {
		m.reloads.WithLabelValues(f.secret, r)
	}
	broken := "" // the last problem reported, until the file is good again
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var secrets []Secret
		var attrs []slog.Attr
		result := "unreadable"
		b, err := readSecretFile(f.path)
		if err == nil {
			result = "invalid"
			secrets, err = f.parse(b)
		}
		if err == nil && !slices.Equal(secrets, good) {
			attrs, err = f.apply(secrets)
		}
		if err != nil {
			if err.Error() != broken {
				broken = err.Error()
				m.ok.WithLabelValues(f.secret).Set(0)
				m.reloads.WithLabelValues(f.secret, result).Inc()
				logger.Warn("secret file not reloaded: the last good secrets stay in use until it is fixed",
					"secret", f.secret, "variable", f.variable, "result", result, "error", err.Error())
			}
			continue
		}
		if broken != "" {
			broken = ""
			m.ok.WithLabelValues(f.secret).Set(1)
			if attrs == nil {
				logger.Info("secret file good again, unchanged", "secret", f.secret, "variable", f.variable)
			}
		}
		if attrs != nil {
			good = secrets
			m.reloads.WithLabelValues(f.secret, "ok").Inc()
			logger.LogAttrs(ctx, slog.LevelInfo, "secret file reloaded",
				append([]slog.Attr{slog.String("secret", f.secret), slog.String("variable", f.variable)}, attrs...)...)
		}
	}
}

// WatchAPIKeys re-reads c's provider key file (if the keys came from one)
// every c.SecretReloadInterval until ctx ends, and hands new keys to use,
// which returns what to log of them.
func (c *Config) WatchAPIKeys(ctx context.Context, m *SecretMetrics, logger *slog.Logger, use func(keys []string) ([]slog.Attr, error)) {
	if c.APIKeyFile == "" {
		return
	}
	f := &secretFile{
		secret: secretProviderKey, variable: c.APIKeyFileVar, path: c.APIKeyFile,
		parse: parseAPIKeys,
		apply: func(keys []Secret) ([]slog.Attr, error) { return use(Plain(keys)) },
	}
	f.watch(ctx, c.APIKeys, c.SecretReloadInterval, m, logger)
}

// WatchWebhookTokens re-reads c's webhook token file (if the tokens came
// from one) every c.SecretReloadInterval until ctx ends, and hands new
// tokens to use.
func (c *Config) WatchWebhookTokens(ctx context.Context, m *SecretMetrics, logger *slog.Logger, use func(tokens []string) error) {
	if c.WebhookTokenFile == "" {
		return
	}
	f := &secretFile{
		secret: secretWebhookTokens, variable: c.WebhookTokenFileVar, path: c.WebhookTokenFile,
		parse: func(b []byte) ([]Secret, error) { return parseWebhookTokens(string(b)) },
		apply: func(tokens []Secret) ([]slog.Attr, error) {
			if err := use(Plain(tokens)); err != nil {
				return nil, err
			}
			return []slog.Attr{slog.Any("webhook_tokens", fingerprints(tokens))}, nil
		},
	}
	f.watch(ctx, c.WebhookTokens, c.SecretReloadInterval, m, logger)
}

// fingerprints names secrets by upstream.Fingerprint.
func fingerprints(secrets []Secret) []string {
	out := make([]string, len(secrets))
	for i, s := range secrets {
		out[i] = upstream.Fingerprint(string(s))
	}
	return out
}

// Plain is secrets as the strings they hold, for the code that uses them.
func Plain(secrets []Secret) []string {
	out := make([]string, len(secrets))
	for i, s := range secrets {
		out[i] = string(s)
	}
	return out
}
