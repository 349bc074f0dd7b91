package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"example.com/paymentsd/internal/config"
	"example.com/paymentsd/internal/service"
)

// probePort is the health checks' own listener and server, or nothing when
// PAYMENTS_HEALTH_ADDR is unset. The kubelet's probes present no client
// certificate, and its gRPC probe speaks only cleartext HTTP/2: with mTLS
// on the gRPC and HTTP ports, they can reach paymentsd only here. It serves
// health and nothing else (service.Server.Health), in plaintext: what it
// tells, up or not, is no secret.
type probePort struct {
	srv *http.Server
	ln  net.Listener
}

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
func listenHealth(cfg *config.Config, h http.Handler, logger *slog.Logger, evicted prometheus.Counter) (*probePort, error) {
	if cfg.HealthAddr == "" {
		return &probePort{}, nil
	}
	ln, err := net.Listen("tcp", cfg.HealthAddr)
	if err != nil {
		return nil, fmt.Errorf("PAYMENTS_HEALTH_ADDR: %w", err)
	}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	// The kubelet's gRPC probe: HTTP/2 with prior knowledge, no TLS.
	protocols.SetUnencryptedHTTP2(true)
	guard := newConnGuard(healthMaxConnections, evicted)
	return &probePort{
		ln: guard.listener(ln),
		srv: &http.Server{
			Handler:           guard.track(h),
			ConnContext:       guard.connContext,
			Protocols:         &protocols,
			MaxHeaderBytes:    service.MaxHeaderBytes,
			ReadHeaderTimeout: healthReadHeaderTimeout,
			ReadTimeout:       healthReadHeaderTimeout,
			WriteTimeout:      healthReadHeaderTimeout,
			IdleTimeout:       healthIdleTimeout,
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		},
	}, nil
}

// serve serves until shutdown; it returns at once without a listener.
func (p *probePort) serve(errc chan<- error) {
	if p.srv == nil {
		return
	}
	go func() { errc <- p.srv.Serve(p.ln) }()
}

// addr is the bound address, or "" without a listener.
func (p *probePort) addr() string {
	if p.ln == nil {
		return ""
	}
	return p.ln.Addr().String()
}

// shutdown stops the listener and waits, until ctx ends, for checks in
// progress.
func (p *probePort) shutdown(ctx context.Context) {
	if p.srv == nil {
		return
	}
	if err := p.srv.Shutdown(ctx); err != nil {
		p.srv.Close()
	}
}
