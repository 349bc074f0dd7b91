package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// The identities of a run. The replicas serve mTLS, as deploy/ runs them,
// so that a person can resolve payments: only an admin's client
// certificate may (docs/identity.md).
const (
	callerIdentity = "spiffe://chaos.example/ns/chaos/sa/caller"
	adminIdentity  = "spiffe://chaos.example/people/careless"
)

// pki is a run's certificates: one CA signs the replicas' serving
// certificate (for 127.0.0.1) and the callers' and the admin's client
// certificates.
type pki struct {
	// Files for the replicas.
	certFile, keyFile, caFile string
	roots                     *x509.CertPool
	caller, admin             tls.Certificate
}

// newPKI writes the CA's certificate and the serving certificate and key
// into dir.
func newPKI(dir string) (*pki, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "paymentschaos CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	issue := func(serial int64, tmpl *x509.Certificate) (tls.Certificate, []byte, []byte, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return tls.Certificate{}, nil, nil, err
		}
		tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = big.NewInt(serial), now.Add(-time.Hour), now.Add(24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return tls.Certificate{}, nil, nil, err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return tls.Certificate{}, nil, nil, err
		}
		certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		return cert, certPEM, keyPEM, err
	}
	client := func(serial int64, identity string) (tls.Certificate, error) {
		u, err := url.Parse(identity)
		if err != nil {
			return tls.Certificate{}, err
		}
		cert, _, _, err := issue(serial, &x509.Certificate{URIs: []*url.URL{u}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		return cert, err
	}
	p := &pki{
		certFile: filepath.Join(dir, "tls.crt"), keyFile: filepath.Join(dir, "tls.key"), caFile: filepath.Join(dir, "ca.crt"),
		roots: x509.NewCertPool(),
	}
	p.roots.AddCert(ca)
	_, certPEM, keyPEM, err := issue(2, &x509.Certificate{
		Subject: pkix.Name{CommonName: "paymentsd"}, DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return nil, err
	}
	if p.caller, err = client(3, callerIdentity); err != nil {
		return nil, err
	}
	if p.admin, err = client(4, adminIdentity); err != nil {
		return nil, err
	}
	for path, b := range map[string][]byte{
		p.certFile: certPEM, p.keyFile: keyPEM,
		p.caFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
	} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// env is the replicas' TLS configuration: mTLS, with the admin identity
// allowed to list and resolve.
func (p *pki) env() []string {
	return []string{
		"PAYMENTS_TLS_CERT_FILE=" + p.certFile, "PAYMENTS_TLS_KEY_FILE=" + p.keyFile,
		"PAYMENTS_TLS_CLIENT_CA_FILE=" + p.caFile, "PAYMENTS_ADMIN_CALLERS=" + adminIdentity,
	}
}

// clientTLS is a client's TLS configuration with cert as its identity.
func (p *pki) clientTLS(cert tls.Certificate) *tls.Config {
	return &tls.Config{RootCAs: p.roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, ServerName: "127.0.0.1"}
}
