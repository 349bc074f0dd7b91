package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"example.com/paymentsd/service"
)

// scrapePort is the metrics' own listener and server, or nothing when
// PAYMENTS_METRICS_ADDR is unset. It serves GET /metrics and nothing
// else: a NetworkPolicy admits by port, so a scraper admitted to
// PAYMENTS_HTTP_ADDR could also take payments and read the webhook inbox.
type scrapePort struct {
	srv *http.Server
	ln  net.Listener
	tls bool
}

// Timeouts of the metrics port: a scrape is one small request.
const (
	metricsReadHeaderTimeout = 5 * time.Second
	metricsWriteTimeout      = 30 * time.Second
	metricsIdleTimeout       = 2 * time.Minute
	metricsMaxConnections    = 16
)

// listenMetrics binds the metrics listener, with the server's TLS (and
// client certificates, if required) as on the other ports.
func listenMetrics(cfg *config, g prometheus.Gatherer, tlsConfig *tls.Config, logger *slog.Logger) (*scrapePort, error) {
	if cfg.MetricsAddr == "" {
		return &scrapePort{}, nil
	}
	ln, err := net.Listen("tcp", cfg.MetricsAddr)
	if err != nil {
		return nil, fmt.Errorf("PAYMENTS_METRICS_ADDR: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	s := &scrapePort{
		ln: service.LimitListener(ln, metricsMaxConnections),
		srv: &http.Server{
			Handler: mux,
			// Its own copy: ServeTLS adds HTTP/2 to the config it is given,
			// which the http port's server reads at the same time.
			TLSConfig:         tlsConfig.Clone(),
			MaxHeaderBytes:    service.MaxHeaderBytes,
			ReadHeaderTimeout: metricsReadHeaderTimeout,
			ReadTimeout:       metricsReadHeaderTimeout,
			WriteTimeout:      metricsWriteTimeout,
			IdleTimeout:       metricsIdleTimeout,
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		},
		tls: tlsConfig != nil,
	}
	return s, nil
}

// serve serves until shutdown; it returns at once without a listener.
func (s *scrapePort) serve(errc chan<- error) {
	if s.srv == nil {
		return
	}
	go func() {
		if s.tls {
			errc <- s.srv.ServeTLS(s.ln, "", "")
			return
		}
		errc <- s.srv.Serve(s.ln)
	}()
}

// addr is the bound address, or "" without a listener.
func (s *scrapePort) addr() string {
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// shutdown stops the listener and waits, until ctx ends, for scrapes in
// progress.
func (s *scrapePort) shutdown(ctx context.Context) {
	if s.srv == nil {
		return
	}
	if err := s.srv.Shutdown(ctx); err != nil {
		s.srv.Close()
	}
}
