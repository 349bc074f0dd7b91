package paymentsclient

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
)

// TLSConfig returns the mTLS configuration for calling paymentsd: it trusts
// only the CA in caFile (PEM) for the server's certificate, and presents
// the client certificate and key in certFile and keyFile (PEM), whose URI
// or DNS SAN is this caller's identity on paymentsd's allowlist.
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
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		// LoadX509KeyPair's errors never hold the key's bytes.
		return nil, fmt.Errorf("paymentsclient: load client certificate: %w", err)
	}
	return &tls.Config{
		RootCAs:      roots,
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// DialTLS returns a connection to paymentsd at target (for example
// "dns:///paymentsd.payments-live:9090") over mTLS, with TLSConfig's
// configuration, for New. Like grpc.NewClient it does not connect until
// the first call. It reconnects after a lost connection within 5 s at
// most (gRPC's default waits up to 2 minutes, which a Create with a short
// deadline would spend failing); opts, added after, may change that. Close
// it when done.
func DialTLS(target, caFile, certFile, keyFile string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	cfg, err := TLSConfig(caFile, certFile, keyFile)
	if err != nil {
		return nil, err
	}
	reconnect := backoff.DefaultConfig
	reconnect.MaxDelay = 5 * time.Second
	defaults := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: reconnect, MinConnectTimeout: 5 * time.Second}),
	}
	conn, err := grpc.NewClient(target, append(defaults, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("paymentsclient: %w", err)
	}
	return conn, nil
}
