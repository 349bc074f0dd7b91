package paymentsclient_test

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
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	"example.com/paymentsd/internal/service"
	"example.com/paymentsd/paymentsclient"
)

// TestReasonsMatchService: the client's copies of the reasons are
// paymentsd's.
func TestReasonsMatchService(t *testing.T) {
	t.Parallel()
	for client, server := range map[string]string{
		paymentsclient.ReasonNotCreated:     service.ReasonNotCreated,
		paymentsclient.ReasonOutcomeUnknown: service.ReasonOutcomeUnknown,
		paymentsclient.ReasonNotSent:        service.ReasonNotSent,
		paymentsclient.ReasonInProgress:     service.ReasonInProgress,
		paymentsclient.ReasonKeyReused:      service.ReasonKeyReused,
		paymentsclient.ReasonKeyExpired:     service.ReasonKeyExpired,
		paymentsclient.ReasonKeyNotOwned:    service.ReasonKeyNotOwned,
	} {
		if client != server {
			t.Errorf("paymentsclient reason %q, paymentsd's %q", client, server)
		}
	}
}

// pki is a CA and certificates it signed, as PEM files in a directory.
type pki struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caFile string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{dir: t.TempDir(), ca: ca, caKey: key}
	p.caFile = p.write(t, "ca.crt", "CERTIFICATE", der)
	return p
}

func (p *pki) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issue returns the certificate and key files of a leaf for uri (a client)
// or for 127.0.0.1 (the server, when uri is "").
func (p *pki) issue(t *testing.T, name, uri string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if uri == "" {
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	} else {
		u, err := url.Parse(uri)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = []*url.URL{u}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return p.write(t, name+".crt", "CERTIFICATE", der), p.write(t, name+".key", "PRIVATE KEY", keyDER)
}

// TestDialTLS calls a paymentsd that requires client certificates and
// allows one caller, through DialTLS.
func TestDialTLS(t *testing.T) {
	t.Parallel()
	const checkout = "spiffe://example.com/checkout"
	p := newPKI(t)
	serverCert, serverKey := p.issue(t, "paymentsd", "")
	cert, err := tls.LoadX509KeyPair(serverCert, serverKey)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(p.ca)
	d := startPaymentsd(t, paymentsdOptions{
		allowedCallers: []string{checkout},
		grpcOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientCAs:    roots,
			ClientAuth:   tls.RequireAndVerifyClientCert,
		}))},
	})

	t.Run("allowed", func(t *testing.T) {
		t.Parallel()
		certFile, keyFile := p.issue(t, "checkout", checkout)
		conn, err := paymentsclient.DialTLS(d.addr, p.caFile, certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		key := paymentsclient.NewIdempotencyKey()
		if _, err := paymentsclient.New(conn).Create(t.Context(), payment(key)); err != nil {
			t.Fatalf("Create over mTLS as %s = %v, want the payment", checkout, err)
		}
		d.onlyKey(t, key)
	})
	t.Run("not on the allowlist", func(t *testing.T) {
		t.Parallel()
		certFile, keyFile := p.issue(t, "stranger", "spiffe://example.com/stranger")
		conn, err := paymentsclient.DialTLS(d.addr, p.caFile, certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		key := paymentsclient.NewIdempotencyKey()
		_, err = paymentsclient.New(conn).Create(t.Context(), payment(key))
		checkError(t, err, key, paymentsclient.ErrCallerNotAllowed, codes.PermissionDenied, 1)
	})
	t.Run("missing files", func(t *testing.T) {
		t.Parallel()
		if _, err := paymentsclient.DialTLS(d.addr, filepath.Join(p.dir, "nope.crt"), "a", "b"); err == nil {
			t.Error("DialTLS with a CA file that does not exist = nil error")
		}
		if _, err := paymentsclient.TLSConfig(p.caFile, "", ""); err == nil {
			t.Error("TLSConfig without a client certificate = nil error")
		}
	})
}

// TestTLSConfigReloadsClientCertificate: a renewed client certificate (as
// csi-driver-spiffe swaps the files of its volume) is presented at the
// next handshake, without a new TLSConfig; files caught half-written keep
// the last good one in use.
func TestTLSConfigReloadsClientCertificate(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	serverCert, serverKey := p.issue(t, "paymentsd", "")
	cert, err := tls.LoadX509KeyPair(serverCert, serverKey)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(p.ca)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: roots, ClientAuth: tls.RequireAndVerifyClientCert})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	seen := make(chan string)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc := c.(*tls.Conn)
			if tc.Handshake() == nil {
				seen <- tc.ConnectionState().PeerCertificates[0].URIs[0].String()
			} else {
				seen <- ""
			}
			c.Close()
		}
	}()
	certFile, keyFile := p.issue(t, "checkout", "spiffe://example.com/checkout-1")
	cfg, err := paymentsclient.TLSConfig(p.caFile, certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	handshake := func() string {
		t.Helper()
		c, err := tls.Dial("tcp", ln.Addr().String(), cfg)
		if err != nil {
			t.Fatalf("tls.Dial = %v", err)
		}
		c.Close()
		return <-seen
	}
	if got := handshake(); got != "spiffe://example.com/checkout-1" {
		t.Fatalf("first handshake presented %q", got)
	}
	// Renewed: new files in place of the old.
	renewedCert, renewedKey := p.issue(t, "renewed", "spiffe://example.com/checkout-2")
	for from, to := range map[string]string{renewedCert: certFile, renewedKey: keyFile} {
		if err := os.Rename(from, to); err != nil {
			t.Fatal(err)
		}
	}
	if got := handshake(); got != "spiffe://example.com/checkout-2" {
		t.Errorf("handshake after renewal presented %q, want the renewed certificate", got)
	}
	// Half-written: a key that is not the certificate's.
	_, otherKey := p.issue(t, "other", "spiffe://example.com/other")
	if err := os.Rename(otherKey, keyFile); err != nil {
		t.Fatal(err)
	}
	if got := handshake(); got != "spiffe://example.com/checkout-2" {
		t.Errorf("handshake with mismatched files presented %q, want the last good certificate", got)
	}
}
