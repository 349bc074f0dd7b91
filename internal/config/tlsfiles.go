package config

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Values of the secret label for the TLS files.
const (
	secretTLSCertificate = "tls_certificate"
	secretTLSClientCA    = "tls_client_ca"
)

// maxTLSFile bounds how much of a certificate, key or CA file is read: a
// chain is a few KiB, and a CA bundle of a few hundred roots under 1 MiB.
const maxTLSFile = 1 << 20

// ServerTLS is the server's certificate and key, and the CA that callers'
// client certificates must chain to, as last read from their files.
// cert-manager renews the certificate, and the kubelet swaps a Secret
// volume's files in place: watch re-reads them, and every new handshake
// uses what was last read, so a rotation needs no restart.
type ServerTLS struct {
	certFile, keyFile, caFile string

	cert      atomic.Pointer[tls.Certificate]
	clientCAs atomic.Pointer[clientCAs] // nil without PAYMENTS_TLS_CLIENT_CA_FILE

	// caChanged is closed, and replaced, each time new client CAs are put
	// in use.
	caMu      sync.Mutex
	caChanged chan struct{}

	// now is the clock certificates are verified by.
	now func() time.Time

	// notAfter is paymentsd_tls_certificate_expiry_timestamp_seconds;
	// caNotAfter and caCount, paymentsd_tls_client_ca_*.
	notAfter, caNotAfter, caCount prometheus.Gauge
}

// clientCAs are the CAs of PAYMENTS_TLS_CLIENT_CA_FILE as last read: the
// pool that handshakes verify by, and each certificate's DER, by which
// StillTrusted knows whether a chain verified earlier ends at one still in
// use.
type clientCAs struct {
	pool *x509.CertPool
	der  map[string]bool
}

// LoadServerTLS reads the TLS files that cfg names; nil for plaintext.
// Certificates are verified by now.
func LoadServerTLS(cfg *Config, now func() time.Time, reg prometheus.Registerer) (*ServerTLS, error) {
	if cfg.TLSCertFile == "" {
		return nil, nil
	}
	t := &ServerTLS{certFile: cfg.TLSCertFile, keyFile: cfg.TLSKeyFile, caFile: cfg.TLSClientCAFile, now: now, caChanged: make(chan struct{}),
		notAfter: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paymentsd_tls_certificate_expiry_timestamp_seconds",
			Help: "When the serving certificate in use (PAYMENTS_TLS_CERT_FILE) expires, in Unix seconds: it is re-read every PAYMENTS_SECRET_RELOAD_INTERVAL, so this moves forward at each renewal.",
		}),
	}
	if err := reg.Register(t.notAfter); err != nil {
		return nil, fmt.Errorf("register TLS metrics: %w", err)
	}
	if t.caFile != "" {
		t.caNotAfter = prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paymentsd_tls_client_ca_expiry_timestamp_seconds",
			Help: "When the last to expire of the client CAs in use (PAYMENTS_TLS_CLIENT_CA_FILE) expires, in Unix seconds: after it, no caller's certificate can be verified. During a CA rotation the file holds the next CA too, so this is the next CA's.",
		})
		t.caCount = prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paymentsd_tls_client_ca_certificates",
			Help: "How many CA certificates the client CA file in use (PAYMENTS_TLS_CLIENT_CA_FILE) holds: 2 while a CA rotation's bundle holds the old and the new.",
		})
		if err := errors.Join(reg.Register(t.caNotAfter), reg.Register(t.caCount)); err != nil {
			return nil, fmt.Errorf("register TLS metrics: %w", err)
		}
	}
	certPEM, keyPEM, err := t.readKeyPair()
	if err != nil {
		return nil, fmt.Errorf("PAYMENTS_TLS_CERT_FILE, PAYMENTS_TLS_KEY_FILE: %w", err)
	}
	if _, err := t.useKeyPair(certPEM, keyPEM); err != nil {
		return nil, fmt.Errorf("PAYMENTS_TLS_CERT_FILE, PAYMENTS_TLS_KEY_FILE: %w", err)
	}
	if t.caFile != "" {
		caPEM, err := readTLSFile(t.caFile)
		if err != nil {
			return nil, fmt.Errorf("PAYMENTS_TLS_CLIENT_CA_FILE: %w", err)
		}
		if _, err := t.useClientCA(caPEM); err != nil {
			return nil, fmt.Errorf("PAYMENTS_TLS_CLIENT_CA_FILE: %w", err)
		}
	}
	return t, nil
}

// Config is the TLS configuration of a listener offering nextProtos.
// With clientAuth, and a client CA configured, it requires a client
// certificate that chains to the CA (the gRPC and HTTP ports); without,
// it asks for none (the webhook port: the provider has none). Each
// handshake takes the certificate and CA last read.
func (t *ServerTLS) Config(nextProtos []string, clientAuth bool) *tls.Config {
	current := func() *tls.Config {
		c := &tls.Config{
			MinVersion:   tls.VersionTLS12,
			NextProtos:   nextProtos,
			Certificates: []tls.Certificate{*t.cert.Load()},
			Time:         t.now,
		}
		if cas := t.clientCAs.Load(); clientAuth && cas != nil {
			c.ClientAuth = tls.RequireAndVerifyClientCert
			c.ClientCAs = cas.pool
			// No resumption: every connection's certificate is verified
			// against the CA in use now, not the one of an earlier
			// session. gRPC connections are long-lived; this costs little.
			c.SessionTicketsDisabled = true
		}
		return c
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return current(), nil
		},
	}
}

// StillTrusted reports whether a client certificate whose chains were
// verified when its connection opened would be verified now: one chain
// whose every certificate is within its validity, and whose last is one
// of the client CAs in use now (service.Options.StillTrusted).
func (t *ServerTLS) StillTrusted(verifiedChains [][]*x509.Certificate) error {
	now, cas := t.now(), t.clientCAs.Load()
	expired := false
	for _, chain := range verifiedChains {
		valid := true
		for _, c := range chain {
			if now.Before(c.NotBefore) || now.After(c.NotAfter) {
				valid, expired = false, true
			}
		}
		if valid && len(chain) > 0 && cas != nil && cas.der[string(chain[len(chain)-1].Raw)] {
			return nil
		}
	}
	if expired {
		return errors.New("it, or a CA certificate it chains to, has expired since its connection opened")
	}
	return errors.New("the CA it chains to was removed from PAYMENTS_TLS_CLIENT_CA_FILE since its connection opened")
}

// ClientCAsChanged returns a channel that is closed the next time new
// client CAs are put in use (service.Options.TrustChanged).
func (t *ServerTLS) ClientCAsChanged() <-chan struct{} {
	t.caMu.Lock()
	defer t.caMu.Unlock()
	return t.caChanged
}

// RequiresClientCerts reports whether callers must present certificates.
func (t *ServerTLS) RequiresClientCerts() bool {
	return t != nil && t.caFile != ""
}

func (t *ServerTLS) readKeyPair() (certPEM, keyPEM []byte, err error) {
	if certPEM, err = readTLSFile(t.certFile); err != nil {
		return nil, nil, err
	}
	if keyPEM, err = readTLSFile(t.keyFile); err != nil {
		return nil, nil, err
	}
	return certPEM, keyPEM, nil
}

// useKeyPair puts the key pair in use, and returns what to log of it.
func (t *ServerTLS) useKeyPair(certPEM, keyPEM []byte) ([]slog.Attr, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// X509KeyPair's errors never hold the key's bytes.
		return nil, err
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, err
		}
	}
	t.cert.Store(&cert)
	t.notAfter.Set(float64(leaf.NotAfter.Unix()))
	sum := sha256.Sum256(leaf.Raw)
	return []slog.Attr{
		slog.String("certificate_sha256", hex.EncodeToString(sum[:8])),
		slog.String("not_after", leaf.NotAfter.UTC().Format(time.RFC3339)),
		slog.Any("dns_names", leaf.DNSNames),
	}, nil
}

// useClientCA puts the CA bundle in use, and returns what to log of it.
func (t *ServerTLS) useClientCA(caPEM []byte) ([]slog.Attr, error) {
	cas := &clientCAs{pool: x509.NewCertPool(), der: map[string]bool{}}
	n := 0
	var last time.Time
	for rest := caPEM; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("a certificate in the file can't be parsed: %w", err)
		}
		cas.pool.AddCert(c)
		cas.der[string(c.Raw)] = true
		n++
		if c.NotAfter.After(last) {
			last = c.NotAfter
		}
	}
	if n == 0 {
		return nil, errors.New("the file it names holds no PEM certificates")
	}
	t.clientCAs.Store(cas)
	t.caNotAfter.Set(float64(last.Unix()))
	t.caCount.Set(float64(n))
	t.caMu.Lock()
	close(t.caChanged)
	t.caChanged = make(chan struct{})
	t.caMu.Unlock()
	return []slog.Attr{slog.Int("client_ca_certificates", n), slog.String("client_ca_not_after", last.UTC().Format(time.RFC3339))}, nil
}

// Watch re-reads the files every interval until ctx ends, as the key and
// token files are (see secretFile.watch): new contents are put in use for
// the next handshakes, connections already open keep theirs; a file that
// can't be read or used leaves the last good in use, said once in the log
// and in paymentsd_secret_file_ok until it is good again.
func (t *ServerTLS) Watch(ctx context.Context, interval time.Duration, m *SecretMetrics, logger *slog.Logger) {
	type file struct {
		secret, variable string
		read             func() ([]byte, error)
		use              func([]byte) ([]slog.Attr, error)
		last             []byte
		broken           string
	}
	certPEM, keyPEM, _ := t.readKeyPair()
	files := []*file{{
		secret: secretTLSCertificate, variable: "PAYMENTS_TLS_CERT_FILE, PAYMENTS_TLS_KEY_FILE",
		read: func() ([]byte, error) {
			c, k, err := t.readKeyPair()
			// The two files are one secret: compared, and used, together.
			return append(append(c, 0), k...), err
		},
		use: func(b []byte) ([]slog.Attr, error) {
			i := bytes.IndexByte(b, 0)
			return t.useKeyPair(b[:i], b[i+1:])
		},
		last: append(append(certPEM, 0), keyPEM...),
	}}
	if t.caFile != "" {
		caPEM, _ := readTLSFile(t.caFile)
		files = append(files, &file{
			secret: secretTLSClientCA, variable: "PAYMENTS_TLS_CLIENT_CA_FILE",
			read: func() ([]byte, error) { return readTLSFile(t.caFile) },
			use:  t.useClientCA,
			last: caPEM,
		})
	}
	for _, f := range files {
		m.ok.WithLabelValues(f.secret).Set(1)
		for _, r := range []string{"ok", "unreadable", "invalid"} {
			m.reloads.WithLabelValues(f.secret, r)
		}
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, f := range files {
			b, err := f.read()
			result := "unreadable"
			var attrs []slog.Attr
			changed := err == nil && !bytes.Equal(b, f.last)
			if changed {
				result = "invalid"
				attrs, err = f.use(b)
			}
			if err != nil {
				if err.Error() != f.broken {
					f.broken = err.Error()
					m.ok.WithLabelValues(f.secret).Set(0)
					m.reloads.WithLabelValues(f.secret, result).Inc()
					logger.Warn("TLS file not reloaded: the last good one stays in use until it is fixed",
						"secret", f.secret, "variable", f.variable, "result", result, "error", err.Error())
				}
				continue
			}
			if f.broken != "" {
				f.broken = ""
				m.ok.WithLabelValues(f.secret).Set(1)
				if !changed {
					logger.Info("TLS file good again, unchanged", "secret", f.secret, "variable", f.variable)
				}
			}
			if changed {
				f.last = b
				m.reloads.WithLabelValues(f.secret, "ok").Inc()
				logger.LogAttrs(ctx, slog.LevelInfo, "TLS file reloaded",
					append([]slog.Attr{slog.String("secret", f.secret), slog.String("variable", f.variable)}, attrs...)...)
			}
		}
	}
}

// readTLSFile reads a certificate, key or CA file: a regular file, or a
// symlink to one as in a Secret or CSI volume. Its error names the path
// only where fileError does.
func readTLSFile(path string) ([]byte, error) {
	switch st, err := os.Stat(path); {
	case err != nil:
		return nil, fmt.Errorf("cannot read the file it names: %v", FileError(err))
	case !st.Mode().IsRegular():
		return nil, fmt.Errorf("names %s, which is not a regular file: want a file", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read the file it names: %v", FileError(err))
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTLSFile+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read the file it names: %v", FileError(err))
	}
	if len(b) > maxTLSFile {
		return nil, fmt.Errorf("names a file over %d bytes", maxTLSFile)
	}
	return b, nil
}
