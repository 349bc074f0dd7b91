package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"
)

// caUntil is a CA certificate, in PEM, that expires at notAfter.
func caUntil(t *testing.T, name string, notAfter time.Time) []byte {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter, IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestTLSExpiryMetrics: the metrics say when the serving certificate
// expires, and when the client CAs in use do (the last of them to, since a
// bundle holds the next CA beside the current one while they rotate), and
// how many there are; all follow the files as they are re-read.
func TestTLSExpiryMetrics(t *testing.T) {
	t.Parallel()
	s := startStreamTrust(t)
	expiry := func() (cert, ca, n float64) {
		t.Helper()
		f := scrapeMetricsPort(t, s.in)
		cert, _ = sample(f, "paymentsd_tls_certificate_expiry_timestamp_seconds", nil)
		ca, _ = sample(f, "paymentsd_tls_client_ca_expiry_timestamp_seconds", nil)
		n, _ = sample(f, "paymentsd_tls_client_ca_certificates", nil)
		return cert, ca, n
	}
	cert, ca, n := expiry()
	if want := float64(s.clientCA.cert.NotAfter.Unix()); ca != want || n != 1 {
		t.Errorf("client CA expiry %v, %v certificates; want %v, 1", ca, n, want)
	}
	if cert == 0 {
		t.Errorf("paymentsd_tls_certificate_expiry_timestamp_seconds = 0")
	}

	later := time.Now().Add(365 * 24 * time.Hour).Truncate(time.Second)
	s.caVolume.update(t, string(s.clientCA.pem)+string(caUntil(t, "next client CA", later)))
	s.in.logs.waitLines(t, "TLS file reloaded", 1)
	if _, ca, n := expiry(); ca != float64(later.Unix()) || n != 2 {
		t.Errorf("after the next CA joined: client CA expiry %v, %v certificates; want %v, 2", ca, n, float64(later.Unix()))
	}
}
