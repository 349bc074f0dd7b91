package daemon

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"example.com/paymentsd/internal/config"
	"example.com/paymentsd/internal/service"
)

// The metrics port is the metrics' own listener and server, or nothing
// when PAYMENTS_METRICS_ADDR is unset. It serves GET /metrics and nothing
// else: a NetworkPolicy admits by port, so a scraper admitted to
// PAYMENTS_HTTP_ADDR could also take payments and read the webhook inbox.

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
func listenMetrics(cfg *config.Config, g prometheus.Gatherer, logger *slog.Logger, evicted prometheus.Counter) (*sidePort, error) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	return listenGuarded("PAYMENTS_METRICS_ADDR", cfg.MetricsAddr, metricsMaxConnections, evicted, mux, &http.Server{
		MaxHeaderBytes:    service.MaxHeaderBytes,
		ReadHeaderTimeout: metricsReadHeaderTimeout,
		ReadTimeout:       metricsReadHeaderTimeout,
		WriteTimeout:      metricsWriteTimeout,
		IdleTimeout:       metricsIdleTimeout,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	})
}
