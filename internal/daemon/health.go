package daemon

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"example.com/paymentsd/internal/config"
	"example.com/paymentsd/internal/service"
)

// The health port is the health checks' own listener and server, or
// nothing when PAYMENTS_HEALTH_ADDR is unset. The kubelet's probes present
// no client certificate, and its gRPC probe speaks only cleartext HTTP/2:
// with mTLS on the gRPC and HTTP ports, they can reach paymentsd only
// here. It serves health and nothing else (service.Server.Health), in
// plaintext: what it tells, up or not, is no secret.

// Limits of the health port: a probe is one small request, on a connection
// of its own. Past healthMaxConnections a new connection takes the place of
// an idle one (connGuard), so connections held open can't turn probes away.
const (
	healthReadHeaderTimeout = 5 * time.Second
	healthIdleTimeout       = 2 * time.Minute
	healthMaxConnections    = 64
)

// listenHealth binds the health listener; evicted counts the connections
// closed to make room for new ones.
func listenHealth(cfg *config.Config, h http.Handler, logger *slog.Logger, evicted prometheus.Counter) (*sidePort, error) {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	// The kubelet's gRPC probe: HTTP/2 with prior knowledge, no TLS.
	protocols.SetUnencryptedHTTP2(true)
	return listenGuarded("PAYMENTS_HEALTH_ADDR", cfg.HealthAddr, healthMaxConnections, evicted, h, &http.Server{
		Protocols:         &protocols,
		MaxHeaderBytes:    service.MaxHeaderBytes,
		ReadHeaderTimeout: healthReadHeaderTimeout,
		ReadTimeout:       healthReadHeaderTimeout,
		WriteTimeout:      healthReadHeaderTimeout,
		IdleTimeout:       healthIdleTimeout,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	})
}
