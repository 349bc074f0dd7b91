package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"example.com/paymentsd/internal/config"
	"example.com/paymentsd/internal/inbox"
	"example.com/paymentsd/internal/service"
	"example.com/paymentsd/internal/store"
)

// webhooks is the webhook intake's own listener and server, or nothing when
// PAYMENTS_WEBHOOK_ADDR is unset. It shares no mux with the internal API.
type webhooks struct {
	sidePort
	handler *inbox.Handler
}

// listenWebhooks binds the intake's listener. With server TLS configured it
// serves TLS with the same certificate but never asks for a client
// certificate: the provider has none.
func listenWebhooks(cfg *config.Config, st *store.Store, events *service.Events, logger *slog.Logger, reg prometheus.Registerer, tlsConfig *tls.Config, tp trace.TracerProvider) (*webhooks, error) {
	if cfg.WebhookAddr == "" {
		return &webhooks{}, nil
	}
	tokens := make([]string, len(cfg.WebhookTokens))
	for i, t := range cfg.WebhookTokens {
		tokens[i] = string(t)
	}
	h, err := inbox.New(inbox.Config{
		Tokens:         tokens,
		Store:          st,
		MaxBytes:       cfg.WebhookMaxBytes,
		MaxInFlight:    inbox.DefaultMaxInFlight,
		Appended:       events.Appended,
		Logger:         logger,
		Metrics:        inbox.NewMetrics(reg),
		TracerProvider: tp,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.WebhookTokensFrom, err)
	}
	ln, err := net.Listen("tcp", cfg.WebhookAddr)
	if err != nil {
		return nil, fmt.Errorf("PAYMENTS_WEBHOOK_ADDR: %w", err)
	}
	// Internet-facing: the same per-port connection cap as the internal
	// ports, where a new connection takes the place of the oldest that
	// has shown no token, and a cap per address.
	srv := inbox.NewServer(h, inbox.ConnLimits{Max: cfg.MaxConnections, PerIP: cfg.WebhookMaxConnsPerIP}, logger)
	w := &webhooks{sidePort: sidePort{srv: srv.HTTP, ln: srv.Listener(ln)}, handler: h}
	if tlsConfig != nil {
		tc := tlsConfig.Clone()
		tc.ClientAuth, tc.ClientCAs = tls.NoClientCert, nil
		w.srv.TLSConfig, w.tls = tc, true
	}
	return w, nil
}

// usageInterval is how often the inbox's stored bytes are counted for
// paymentsd_webhook_stored_bytes.
const usageInterval = 10 * time.Second

// watchUsage keeps the inbox's usage gauge until ctx ends; it returns at
// once without a listener.
func (w *webhooks) watchUsage(ctx context.Context) {
	if w.handler != nil {
		w.handler.WatchUsage(ctx, usageInterval)
	}
}
