package paymentsclient

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"google.golang.org/grpc"
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
