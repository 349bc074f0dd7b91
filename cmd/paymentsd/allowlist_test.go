package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/service"
)

// issueClient returns a client certificate with the given URI and DNS
// SANs, signed by the CA.
func (ca *testCA) issueClient(t testing.TB, uris, dnsNames []string) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "caller"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		DNSNames:     dnsNames,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, u := range uris {
		parsed, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, parsed)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

const (
	checkout = "spiffe://corp.example/ns/shop/sa/checkout"
	// billingName is the billing service's DNS SAN; billing is its
	// identity, as configuration and records write it.
	billingName = "billing.corp.example"
	billing     = "dns:" + billingName
)

func TestCallerAllowlist(t *testing.T) {
	t.Parallel()
	serverCA, clientCA := newTestCA(t, "server CA"), newTestCA(t, "client CA")
	certFile, keyFile := writePEMFiles(t, serverCA.issue(t, x509.ExtKeyUsageServerAuth))
	clientCAFile := filepath.Join(t.TempDir(), "client-ca.pem")
	os.WriteFile(clientCAFile, clientCA.pem, 0o600)
	tlsEnv := func(p map[string]string) map[string]string {
		return with(p, "PAYMENTS_TLS_CERT_FILE", certFile, "PAYMENTS_TLS_KEY_FILE", keyFile, "PAYMENTS_TLS_CLIENT_CA_FILE", clientCAFile)
	}

	tests := []struct {
		name       string
		allowed    string // PAYMENTS_ALLOWED_CALLERS
		uris, dns  []string
		wantOK     bool
		wantCaller string
	}{
		{"SPIFFE ID listed", checkout + ", " + billing, []string{checkout}, nil, true, checkout},
		{"DNS name listed", checkout + "," + billing, nil, []string{billingName}, true, billing},
		{"not listed", checkout, []string{"spiffe://corp.example/ns/shop/sa/checkout-v2"}, []string{"checkout.corp.example"}, false, "spiffe://corp.example/ns/shop/sa/checkout-v2"},
		{"prefix is not a match", checkout, []string{"spiffe://corp.example/ns/shop/sa"}, nil, false, "spiffe://corp.example/ns/shop/sa"},
		{"SPIFFE ID as a DNS SAN", checkout, nil, []string{checkout}, false, ""},
		{"DNS name of a listed SPIFFE caller", checkout + "," + billing, []string{"spiffe://corp.example/ns/shop/sa/other"}, []string{billingName}, false, "spiffe://corp.example/ns/shop/sa/other"},
		{"no identity", checkout, nil, nil, false, ""},
		{"no allowlist", "", []string{checkout}, nil, true, checkout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := fakeProvider(t, "sandbox")
			env := tlsEnv(sandboxEnv(p))
			if tt.allowed != "" {
				env["PAYMENTS_ALLOWED_CALLERS"] = tt.allowed
			}
			in := start(t, env)
			tc := &tls.Config{
				RootCAs:      serverCA.pool,
				Certificates: []tls.Certificate{clientCA.issueClient(t, tt.uris, tt.dns)},
				MinVersion:   tls.VersionTLS12,
			}
			conn, err := grpc.NewClient(in.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()

			_, err = paymentsv1.NewPaymentsServiceClient(conn).CreateMultiCardPayment(t.Context(), validRequest("k-allow"))
			if tt.wantOK && err != nil {
				t.Errorf("gRPC CreateMultiCardPayment() = %v, want OK", err)
			}
			wantCode, wantReason, wantHTTP := codes.PermissionDenied, service.ReasonCallerNotAllowed, http.StatusForbidden
			if !tt.wantOK {
				st := status.Convert(err)
				if st.Code() != wantCode || reasonOf(st) != wantReason {
					t.Errorf("gRPC CreateMultiCardPayment() = %v, reason %q; want %v, %s", st.Code(), reasonOf(st), wantCode, wantReason)
				}
			}
			// Health checks stay open to every caller.
			if st, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("health = %v, %v, want SERVING", st.GetStatus(), err)
			}

			transport := &http.Transport{TLSClientConfig: tc}
			defer transport.CloseIdleConnections()
			client := &http.Client{Transport: transport}
			r := postREST(t, client, "https://"+in.httpAddr, validBody("k-allow-rest"), nil)
			wantStatus := http.StatusOK
			if !tt.wantOK {
				wantStatus = wantHTTP
			}
			if r.status != wantStatus {
				t.Errorf("REST POST = %d %s, want %d", r.status, r.raw, wantStatus)
			}
			if !tt.wantOK && restReason(r) != wantReason {
				t.Errorf("REST reason = %q, want %s", restReason(r), wantReason)
			}
			for _, path := range []string{"/healthz", "/readyz", "/metrics", "/openapi.json"} {
				resp, err := client.Get("https://" + in.httpAddr + path)
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Errorf("GET %s = %v, %v, want 200", path, statusOf(resp), err)
				}
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}

			wantCalls := 0
			if tt.wantOK {
				wantCalls = 2
			}
			if n := len(p.Requests()); n != wantCalls {
				t.Errorf("provider saw %d requests, want %d", n, wantCalls)
			}
			// The record of a payment names the caller that made it.
			if tt.wantOK {
				for _, key := range []string{"k-allow", "k-allow-rest"} {
					got, err := paymentsv1.NewPaymentsServiceClient(conn).GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
					if err != nil || got.GetCaller() != tt.wantCaller || got.GetRequestId() == "" {
						t.Errorf("GetMultiCardPayment(%s) caller %q, request_id %q, err %v; want caller %q and a request ID", key, got.GetCaller(), got.GetRequestId(), err, tt.wantCaller)
					}
				}
			}
			// The call lines name the caller, over both transports.
			var payments int
			for _, line := range in.logs.lines("call") {
				if line["method"] != paymentsv1.PaymentsService_CreateMultiCardPayment_FullMethodName {
					continue
				}
				payments++
				if got, _ := line["caller"].(string); got != tt.wantCaller {
					t.Errorf("call line caller = %q, want %q", got, tt.wantCaller)
				}
			}
			if payments != 2 {
				t.Errorf("%d call lines for payments, want 2", payments)
			}
		})
	}
}

func TestAllowlistNeedsClientCA(t *testing.T) {
	t.Parallel()
	env := with(map[string]string{"PAYMENTS_SANDBOX_BASE_URL": "http://127.0.0.1:1/v1", "PAYMENTS_SANDBOX_API_KEY": sandboxKey},
		"PAYMENTS_ALLOWED_CALLERS", checkout)
	_, err := loadConfig([]string{"paymentsd"}, envList(env))
	if err == nil || !strings.Contains(err.Error(), "PAYMENTS_ALLOWED_CALLERS") || !strings.Contains(err.Error(), "PAYMENTS_TLS_CLIENT_CA_FILE") {
		t.Errorf("loadConfig(PAYMENTS_ALLOWED_CALLERS without PAYMENTS_TLS_CLIENT_CA_FILE) = %v, want an error naming both", err)
	}
}
