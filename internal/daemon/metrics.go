package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"example.com/paymentsd/internal/config"
	"example.com/paymentsd/internal/service"
)

// scrapePort is the metrics' own listener and server, or nothing when
// PAYMENTS_METRICS_ADDR is unset. It serves GET /metrics and nothing
// else: a NetworkPolicy admits by port, so a scraper admitted to
// PAYMENTS_HTTP_ADDR could also take payments and read the webhook inbox.
type scrapePort struct {
	srv *http.Server
	ln  net.Listener
}

// Limits of the metrics port: a scrape is one small request. Past
// metricsMaxConnections a new connection takes the place of an idle one
// (connGuard), so connections held open can't lock scrapers out.
const (
	metricsReadHeaderTimeout = 5 * time.Second
	metricsWriteTimeout      = 30 * time.Second
	metricsIdleTimeout       = 2 * time.Minute
	metricsMaxConnections    = 64
)

// listenMetrics binds the metrics listener. It serves plaintext, even
// when the other ports serve TLS: a scraper presents no client
// certificate, and the metrics name no caller and hold no secret; a
// NetworkPolicy admits only the scraper to the port. evicted counts the
// connections closed to make room for new ones.
func listenMetrics(cfg *config.Config, g prometheus.Gatherer, logger *slog.Logger, evicted prometheus.Counter) (*scrapePort, error) {
	if cfg.MetricsAddr == "" {
		return &scrapePort{}, nil
	}
	ln, err := net.Listen("tcp", cfg.MetricsAddr)
	if err != nil {
		return nil, fmt.Errorf("PAYMENTS_METRICS_ADDR: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	guard := newConnGuard(metricsMaxConnections, evicted)
	s := &scrapePort{
		ln: guard.listener(ln),
		srv: &http.Server{
			Handler:           guard.track(mux),
			ConnContext:       guard.connContext,
			MaxHeaderBytes:    service.MaxHeaderBytes,
			ReadHeaderTimeout: metricsReadHeaderTimeout,
			ReadTimeout:       metricsReadHeaderTimeout,
			WriteTimeout:      metricsWriteTimeout,
			IdleTimeout:       metricsIdleTimeout,
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		},
	}
	return s, nil
}

// serve serves until shutdown; it returns at once without a listener.
func (s *scrapePort) serve(errc chan<- error) {
	if s.srv == nil {
		return
	}
	go func() { errc <- s.srv.Serve(s.ln) }()
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

// close closes the listener of a port that never served.
func (s *scrapePort) close() {
	if s.ln != nil {
		s.ln.Close()
	}
}
