package daemon

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"
)

// Why a TLS handshake was refused: the values of
// paymentsd_tls_handshakes_refused_total's reason label.
const (
	// The caller's certificate is refused.
	refusedNoCertificate    = "no_certificate"    // it presented none
	refusedUnknownAuthority = "unknown_authority" // it chains to no client CA in use
	refusedExpired          = "expired"           // it, or a CA of its chain, is expired (or not yet valid)
	refusedBadCertificate   = "bad_certificate"   // anything else: not for client auth, malformed, …
	// The caller refused paymentsd's certificate (it sent an alert): it
	// trusts no CA that signed it, or dialled a name it doesn't hold.
	refusedByClient = "client_refused"
	// Not TLS at all (plaintext HTTP to a TLS port), or no version, cipher
	// suite or application protocol in common.
	refusedNotTLS   = "not_tls"
	refusedProtocol = "protocol"
	// The caller went away, or stayed silent past the handshake timeout.
	refusedClosed  = "connection_closed"
	refusedTimeout = "timeout"
	refusedOther   = "other"
)

var refusalReasons = []string{
	refusedNoCertificate, refusedUnknownAuthority, refusedExpired, refusedBadCertificate,
	refusedByClient, refusedNotTLS, refusedProtocol, refusedClosed, refusedTimeout, refusedOther,
}

// handshakeLogInterval is how often a port logs refused handshakes of one
// reason at most; the next line says how many it left out.
const handshakeLogInterval = time.Minute

// handshakeRefusals counts and logs the TLS handshakes paymentsd refuses
// on its TLS ports (gRPC, HTTP and webhooks). A caller refused there never
// reaches a handler, its access log or its metrics: before, on the gRPC
// port it left no trace at all, and a CA rotation that went wrong refused
// callers unseen.
type handshakeRefusals struct {
	refused *prometheus.CounterVec
	logger  *slog.Logger
	now     func() time.Time

	mu     sync.Mutex
	logged map[[2]string]*refusalLog // by port and reason
}

type refusalLog struct {
	at         time.Time
	suppressed int
}

func newHandshakeRefusals(reg prometheus.Registerer, logger *slog.Logger, now func() time.Time) *handshakeRefusals {
	h := &handshakeRefusals{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paymentsd_tls_handshakes_refused_total",
			Help: "TLS handshakes refused, by port (grpc, http, webhooks) and reason: no_certificate, unknown_authority (a CA not in PAYMENTS_TLS_CLIENT_CA_FILE), expired, bad_certificate, client_refused (the caller refused paymentsd's certificate), not_tls, protocol, connection_closed, timeout, other. Logged as 'TLS handshake refused', at most once a minute per port and reason.",
		}, []string{"port", "reason"}),
		logger: logger,
		now:    now,
		logged: map[[2]string]*refusalLog{},
	}
	reg.MustRegister(h.refused)
	return h
}

// serving exports port's series at zero, so that the first refusal after a
// start is seen by rate() and increase().
func (h *handshakeRefusals) serving(port string) {
	for _, r := range refusalReasons {
		h.refused.WithLabelValues(port, r)
	}
}

// refuse counts and, unless one was logged for port and its reason within
// handshakeLogInterval, logs a handshake refused with err.
func (h *handshakeRefusals) refuse(port string, remote net.Addr, err error) {
	reason, cert := refusalReason(err)
	h.refused.WithLabelValues(port, reason).Inc()
	now := h.now()
	h.mu.Lock()
	l := h.logged[[2]string{port, reason}]
	if l != nil && now.Sub(l.at) < handshakeLogInterval {
		l.suppressed++
		h.mu.Unlock()
		return
	}
	suppressed := 0
	if l != nil {
		suppressed = l.suppressed
	}
	h.logged[[2]string{port, reason}] = &refusalLog{at: now}
	h.mu.Unlock()
	// The caller wrote the certificate, and so much of the error: each
	// is clipped, so that a line stays small whatever it holds.
	attrs := []any{"port", port, "reason", reason, "error", clip(err.Error()), "suppressed", suppressed}
	if remote != nil {
		attrs = append(attrs, "remote_addr", remote.String())
	}
	if cert != nil {
		var uris, dnsNames []string
		for _, u := range cert.URIs[:min(len(cert.URIs), maxLoggedNames)] {
			uris = append(uris, clip(u.String()))
		}
		for _, n := range cert.DNSNames[:min(len(cert.DNSNames), maxLoggedNames)] {
			dnsNames = append(dnsNames, clip(n))
		}
		attrs = append(attrs, "peer_uris", uris, "peer_dns_names", dnsNames,
			"peer_issuer", clip(cert.Issuer.String()), "peer_not_after", cert.NotAfter.UTC().Format(time.RFC3339))
	}
	h.logger.Warn("TLS handshake refused", attrs...)
}

// What a refusal's log line holds of a caller's certificate at most.
const (
	maxLoggedNames = 4
	maxLoggedBytes = 256
)

// clip shortens s to maxLoggedBytes, marking that it did.
func clip(s string) string {
	if len(s) <= maxLoggedBytes {
		return s
	}
	return strings.ToValidUTF8(s[:maxLoggedBytes], "") + "…"
}

// refusalReason is why a handshake failed with err, and the caller's
// certificate when it was the one refused.
func refusalReason(err error) (reason string, cert *x509.Certificate) {
	var verify *tls.CertificateVerificationError
	if errors.As(err, &verify) {
		if len(verify.UnverifiedCertificates) > 0 {
			cert = verify.UnverifiedCertificates[0]
		}
		var invalid x509.CertificateInvalidError
		var unknown x509.UnknownAuthorityError
		switch {
		case errors.As(verify.Err, &invalid) && invalid.Reason == x509.Expired:
			return refusedExpired, cert
		case errors.As(verify.Err, &unknown):
			return refusedUnknownAuthority, cert
		}
		return refusedBadCertificate, cert
	}
	var header tls.RecordHeaderError
	var op *net.OpError
	var netErr net.Error
	switch {
	case errors.As(err, &header):
		return refusedNotTLS, nil
	case errors.As(err, &op) && op.Op == "remote error":
		return refusedByClient, nil
	case errors.As(err, &netErr) && netErr.Timeout():
		return refusedTimeout, nil
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, net.ErrClosed):
		return refusedClosed, nil
	}
	// crypto/tls gives these no type of their own.
	switch msg := err.Error(); {
	case strings.Contains(msg, "didn't provide a certificate"):
		return refusedNoCertificate, nil
	case strings.Contains(msg, "client certificate"):
		return refusedBadCertificate, nil
	case strings.Contains(msg, "version"), strings.Contains(msg, "cipher"), strings.Contains(msg, "application protocol"),
		strings.Contains(msg, "ALPN"), strings.Contains(msg, "curve"), strings.Contains(msg, "signature"):
		return refusedProtocol, nil
	}
	return refusedOther, nil
}

// grpcCreds returns creds counting the handshakes they refuse on port.
func (h *handshakeRefusals) grpcCreds(port string, creds credentials.TransportCredentials) credentials.TransportCredentials {
	h.serving(port)
	return countedCreds{TransportCredentials: creds, port: port, h: h}
}

type countedCreds struct {
	credentials.TransportCredentials
	port string
	h    *handshakeRefusals
}

func (c countedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		c.h.refuse(c.port, raw.RemoteAddr(), err)
	}
	return conn, info, err
}

func (c countedCreds) Clone() credentials.TransportCredentials {
	return countedCreds{TransportCredentials: c.TransportCredentials.Clone(), port: c.port, h: c.h}
}

// httpServer makes srv, which serves TLS on port, count and log the
// handshakes it refuses: net/http would log each one's text only, at
// whatever rate they come. It does the handshake itself, and a connection
// whose handshake failed closes with the error kept in its tls.Conn.
func (h *handshakeRefusals) httpServer(port string, srv *http.Server, logger *slog.Logger) {
	h.serving(port)
	next := srv.ConnState
	srv.ConnState = func(c net.Conn, state http.ConnState) {
		if tc, ok := c.(*tls.Conn); ok && state == http.StateClosed && !tc.ConnectionState().HandshakeComplete {
			// The handshake has run (net/http does it first thing) and
			// failed: Handshake returns its error again, at once.
			if err := tc.Handshake(); err != nil {
				h.refuse(port, c.RemoteAddr(), err)
			}
		}
		if next != nil {
			next(c, state)
		}
	}
	errorLog := srv.ErrorLog
	if errorLog == nil {
		errorLog = slog.NewLogLogger(logger.Handler(), slog.LevelWarn)
	}
	srv.ErrorLog = log.New(dropHandshakeErrors{errorLog.Writer()}, "", 0)
}

// dropHandshakeErrors passes net/http's error log on but for its lines
// about failed TLS handshakes, which handshakeRefusals logs instead.
type dropHandshakeErrors struct{ w io.Writer }

func (d dropHandshakeErrors) Write(p []byte) (int, error) {
	if bytes.HasPrefix(p, []byte("http: TLS handshake error from ")) {
		return len(p), nil
	}
	return d.w.Write(p)
}
