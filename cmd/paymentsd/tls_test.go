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
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// testCA is a certificate authority for the TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	pem  []byte
}

func newTestCA(t testing.TB, name string) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
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
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a leaf certificate for 127.0.0.1 signed by the CA.
func (ca *testCA) issue(t testing.TB, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "paymentsd-test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func writePEMFiles(t testing.TB, c tls.Certificate) (certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	keyDER, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
	return certFile, keyFile
}

func TestTLS(t *testing.T) {
	t.Parallel()
	serverCA, clientCA, strangerCA := newTestCA(t, "server CA"), newTestCA(t, "client CA"), newTestCA(t, "stranger CA")
	certFile, keyFile := writePEMFiles(t, serverCA.issue(t, x509.ExtKeyUsageServerAuth))
	clientCAFile := filepath.Join(t.TempDir(), "client-ca.pem")
	os.WriteFile(clientCAFile, clientCA.pem, 0o600)
	goodClient := clientCA.issueClient(t, []string{checkout}, nil)
	// Trusted, but naming no identity: a CN and an IP SAN are no names.
	namelessClient := clientCA.issue(t, x509.ExtKeyUsageClientAuth)
	strangerClient := strangerCA.issueClient(t, []string{checkout}, nil)

	tests := []struct {
		name       string
		mutual     bool
		clientCert *tls.Certificate
		wantOK     bool
	}{
		{"TLS, no client certificate", false, nil, true},
		{"mTLS, trusted client certificate", true, &goodClient, true},
		{"mTLS, no client certificate", true, nil, false},
		{"mTLS, trusted client certificate naming no identity", true, &namelessClient, false},
		{"mTLS, client certificate from another CA", true, &strangerClient, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := fakeProvider(t, "sandbox")
			env := with(sandboxEnv(p), "PAYMENTS_TLS_CERT_FILE", certFile, "PAYMENTS_TLS_KEY_FILE", keyFile)
			if tt.mutual {
				env["PAYMENTS_TLS_CLIENT_CA_FILE"] = clientCAFile
			}
			in := start(t, env)

			tc := &tls.Config{RootCAs: serverCA.pool, MinVersion: tls.VersionTLS12}
			if tt.clientCert != nil {
				tc.Certificates = []tls.Certificate{*tt.clientCert}
			}
			conn, err := grpc.NewClient(in.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_, err = paymentsv1.NewPaymentsServiceClient(conn).CreateMultiCardPayment(t.Context(), validRequest("k-tls"))
			if (err == nil) != tt.wantOK {
				t.Errorf("gRPC CreateMultiCardPayment() = %v, want success %v", err, tt.wantOK)
			}

			transport := &http.Transport{TLSClientConfig: tc}
			defer transport.CloseIdleConnections()
			resp, err := (&http.Client{Transport: transport}).Post("https://"+in.httpAddr+"/v1/multi-card-payments", "application/json", strings.NewReader(validBody("k-tls-rest")))
			restOK := err == nil && resp.StatusCode == http.StatusOK
			if err == nil {
				resp.Body.Close()
			}
			if restOK != tt.wantOK {
				t.Errorf("REST POST over TLS = %v, %v; want success %v", statusOf(resp), err, tt.wantOK)
			}
			wantCalls := 0
			if tt.wantOK {
				wantCalls = 2
			}
			if n := len(p.Requests()); n != wantCalls {
				t.Errorf("provider saw %d requests, want %d", n, wantCalls)
			}
		})
	}
}

func statusOf(resp *http.Response) int {
	if resp == nil {
		return 0
	}
	return resp.StatusCode
}
