package paymentsclient

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// TLSConfig returns the mTLS configuration for calling paymentsd: it trusts
// only the CA in caFile (PEM) for the server's certificate, and presents
// the client certificate and key in certFile and keyFile (PEM), whose one
// URI SAN (a SPIFFE ID) is this caller's identity on paymentsd's
// allowlist. The certificate and key are read again at each new
// connection's handshake, and used if they changed (and still make a
// pair): an SVID that csi-driver-spiffe renews in place, every 40 minutes
// or so, is picked up without a restart. Connections already open keep
// the certificate they were made with, which paymentsd checked then.
func TLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("paymentsclient: read CA file: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("paymentsclient: CA file %s holds no PEM certificate", caFile)
	}
	if certFile == "" || keyFile == "" {
		return nil, errors.New("paymentsclient: a client certificate and key are both required for mTLS")
	}
	c := &clientCert{certFile: certFile, keyFile: keyFile}
	if err := c.load(); err != nil {
		// LoadX509KeyPair's errors never hold the key's bytes.
		return nil, fmt.Errorf("paymentsclient: load client certificate: %w", err)
	}
	return &tls.Config{
		RootCAs:              roots,
		GetClientCertificate: c.get,
		MinVersion:           tls.VersionTLS12,
	}, nil
}

// clientCert is a client certificate and key as last read from their
// files.
type clientCert struct {
	certFile, keyFile string

	mu              sync.Mutex
	certPEM, keyPEM []byte
	cert            *tls.Certificate
}

// load reads the files, and uses them if they changed and make a pair.
func (c *clientCert) load() error {
	certPEM, err := os.ReadFile(c.certFile)
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(c.keyFile)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil && bytes.Equal(certPEM, c.certPEM) && bytes.Equal(keyPEM, c.keyPEM) {
		return nil
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return err
	}
	c.cert, c.certPEM, c.keyPEM = &cert, certPEM, keyPEM
	return nil
}

// get is tls.Config.GetClientCertificate: the files as they are now, or,
// if they can't be read or don't make a pair (caught mid-rotation), the
// last good certificate, which paymentsd refuses only once it expires.
func (c *clientCert) get(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	c.load()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cert, nil
}

// DialTLS returns a connection to paymentsd at target over mTLS, with
// TLSConfig's configuration and DialOptions, for New. The target should
// name paymentsd's headless Service through the dns resolver, for example
// "dns:///paymentsd-grpc.payments-live.svc.cluster.local:9090": it
// resolves to every ready replica, and calls are spread over them all
// (see DialOptions). Like grpc.NewClient it does not connect until the
// first call. opts, added after DialOptions, may change them. Close it
// when done.
func DialTLS(target, caFile, certFile, keyFile string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	cfg, err := TLSConfig(caFile, certFile, keyFile)
	if err != nil {
		return nil, err
	}
	defaults := append(DialOptions(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	conn, err := grpc.NewClient(target, append(defaults, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("paymentsclient: %w", err)
	}
	return conn, nil
}
