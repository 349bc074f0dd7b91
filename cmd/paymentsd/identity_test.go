package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// sanName is one SubjectAltName entry, encoded exactly as given.
type sanName struct {
	tag   int // 1 email, 2 DNS, 6 URI, 7 IP
	value string
}

// issueForged returns a client certificate signed by the CA whose
// SubjectAltName extension holds names byte for byte (crypto/x509 would
// write only some of them), with subject common name cn.
func (ca *testCA) issueForged(t testing.TB, cn string, names ...sanName) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if len(names) > 0 {
		raw := make([]asn1.RawValue, len(names))
		for i, n := range names {
			raw[i] = asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: n.tag, Bytes: []byte(n.value)}
		}
		b, err := asn1.Marshal(raw)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.ExtraExtensions = []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Value: b}}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// forgeries are certificates the callers' CA may well sign (each names
// something), none of which is the admin's or checkout's identity: every
// spelling of finding 3 of issue 24, and more.
func forgeries() map[string][]sanName {
	uri := func(v string) sanName { return sanName{6, v} }
	dns := func(v string) sanName { return sanName{2, v} }
	return map[string][]sanName{
		"DNS SAN holding the admin's SPIFFE ID":    {dns(oncall)},
		"DNS SAN holding checkout's SPIFFE ID":     {dns(checkout)},
		"empty fragment":                           {uri(oncall + "#")},
		"fragment":                                 {uri(oncall + "#admin")},
		"upper-case scheme":                        {uri("SPIFFE://corp.example/ns/ops/sa/oncall")},
		"trailing slash":                           {uri(oncall + "/")},
		"percent-encoding":                         {uri("spiffe://corp.example/ns/ops/sa/%6Fncall")},
		"port":                                     {uri("spiffe://corp.example:443/ns/ops/sa/oncall")},
		"userinfo":                                 {uri("spiffe://admin@corp.example/ns/ops/sa/oncall")},
		"query":                                    {uri(oncall + "?x=1")},
		"mixed-case trust domain":                  {uri("spiffe://Corp.Example/ns/ops/sa/oncall")},
		"path in another case":                     {uri("spiffe://corp.example/ns/ops/sa/ONCALL")},
		"dot segment":                              {uri("spiffe://corp.example/ns/ops/sa/./oncall")},
		"empty segment":                            {uri("spiffe://corp.example/ns/ops//sa/oncall")},
		"a longer path":                            {uri(oncall + "/x")},
		"second URI SAN, the admin's":              {uri("spiffe://corp.example/ns/shop/sa/nobody"), uri(oncall)},
		"the admin's URI SAN, then checkout's":     {uri(oncall), uri(checkout)},
		"email SAN holding the admin's SPIFFE ID":  {{1, oncall}},
		"email SAN":                                {{1, "oncall@corp.example"}},
		"URI SAN spelling billing's DNS identity":  {uri(billing)},
		"DNS SAN spelling billing's DNS identity":  {dns(billing)},
		"billing's DNS name in upper case":         {dns("BILLING.corp.example")},
		"billing's DNS name with a trailing dot":   {dns(billingName + ".")},
		"billing's DNS name and another":           {dns(billingName), dns("x.corp.example")},
		"NUL after the admin's SPIFFE ID":          {uri(oncall + "\x00")},
		"NUL inside the admin's SPIFFE ID":         {uri("spiffe://corp.example/ns/ops/sa/oncall\x00.evil.example")},
		"NUL after billing's DNS name":             {dns(billingName + "\x00")},
		"non-ASCII look-alike of the admin's":      {uri("spiffe://corp.example/ns/ops/sa/onc\u0430ll")},
		"leading space":                            {uri(" " + oncall)},
		"IP SAN only":                              {{7, "\x7f\x00\x00\x01"}},
		"Subject CN holding the admin's SPIFFE ID": nil, // the common name is set below
	}
}

// TestForgedIdentitiesRefused: no certificate of forgeries() is the admin,
// reads or replays checkout's payments, lists anyone's, or reads provider
// events, with the allowlist and without it (where every identity may
// call); and the admin and checkout themselves still are who they are.
func TestForgedIdentitiesRefused(t *testing.T) {
	t.Parallel()
	for _, allowlist := range []bool{true, false} {
		name := "allowlist"
		if !allowlist {
			name = "no allowlist"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := idempotentProvider(t)
			serverCA, clientCA := newTestCA(t, "server CA"), newTestCA(t, "client CA")
			certFile, keyFile := writePEMFiles(t, serverCA.issue(t, x509.ExtKeyUsageServerAuth))
			clientCAFile := filepath.Join(t.TempDir(), "client-ca.pem")
			os.WriteFile(clientCAFile, clientCA.pem, 0o600)
			env := with(sandboxEnv(p), "PAYMENTS_TLS_CERT_FILE", certFile, "PAYMENTS_TLS_KEY_FILE", keyFile,
				"PAYMENTS_TLS_CLIENT_CA_FILE", clientCAFile,
				"PAYMENTS_ADMIN_CALLERS", oncall,
				"PAYMENTS_EVENT_READERS", billing)
			if allowlist {
				env["PAYMENTS_ALLOWED_CALLERS"] = checkout + "," + billing
			}
			in := start(t, env)
			co := newParty(t, in, serverCA, clientCA.issueClient(t, []string{checkout}, nil), "checkout")
			if _, err := co.client.CreateMultiCardPayment(t.Context(), validRequest("k-checkout")); err != nil {
				t.Fatalf("checkout's CreateMultiCardPayment() = %v", err)
			}
			sent := len(p.Requests())

			for forgery, names := range forgeries() {
				t.Run(forgery, func(t *testing.T) {
					cn := "caller"
					if names == nil {
						cn = oncall
					}
					cert := clientCA.issueForged(t, cn, names...)
					f := newParty(t, in, serverCA, cert, forgery)
					// Refused outright (no identity, not allowed, or the
					// handshake itself), or admitted as a caller of its
					// own that is nobody else.
					refused := func(what string, err error, alsoOK ...codes.Code) {
						t.Helper()
						code := status.Code(err)
						switch code {
						case codes.PermissionDenied, codes.Unavailable:
							return
						}
						for _, c := range alsoOK {
							if code == c {
								return
							}
						}
						t.Errorf("%s = %v; want it refused", what, err)
					}
					l, err := f.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{})
					if err == nil && len(l.GetPayments()) > 0 {
						t.Errorf("ListMultiCardPayments() = %v; it lists another caller's payments", listKeys(l))
					}
					_, err = f.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{Caller: checkout})
					refused("ListMultiCardPayments(caller: checkout)", err)
					_, err = f.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-checkout"})
					refused("GetMultiCardPayment(checkout's key)", err, codes.NotFound)
					resp, err := f.client.CreateMultiCardPayment(t.Context(), validRequest("k-checkout"))
					if err == nil || resp.GetReplayed() {
						t.Errorf("CreateMultiCardPayment(checkout's key) = %v, %v; want it refused, never replayed", resp, err)
					}
					// Resolving a record that is not in doubt: an admin
					// would get FAILED_PRECONDITION, anyone else a refusal.
					_, err = f.client.ResolveMultiCardPayment(t.Context(), &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k-checkout",
						Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED, Evidence: "forged"})
					refused("ResolveMultiCardPayment", err)
					_, err = paymentsv1.NewProviderEventsServiceClient(f.conn).ListProviderEvents(t.Context(), &paymentsv1.ListProviderEventsRequest{})
					refused("ListProviderEvents", err)
					if r, err := f.tryDo(http.MethodGet, "/v1/multi-card-payments/k-checkout"); err == nil && r.status == http.StatusOK {
						t.Errorf("REST GET of checkout's key = %d %s; want it refused", r.status, r.raw)
					}
					if r, err := f.tryDo(http.MethodGet, "/v1/multi-card-payments"); err == nil && r.status == http.StatusOK && strings.Contains(string(r.raw), "k-checkout") {
						t.Errorf("REST list = %d %s; it lists checkout's payment", r.status, r.raw)
					}
				})
			}
			if n := len(p.Requests()); n != sent {
				t.Errorf("provider got %d requests from forged identities, want none", n-sent)
			}

			// The real ones are unaffected.
			admin := newParty(t, in, serverCA, clientCA.issueClient(t, []string{oncall}, nil), "oncall")
			l, err := admin.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{})
			if got := listKeys(l); err != nil || len(got) != 1 || got[0] != "k-checkout" {
				t.Errorf("admin's List = %v, %v; want [k-checkout]", got, err)
			}
			reader := newParty(t, in, serverCA, clientCA.issueClient(t, nil, []string{billingName}), "billing")
			if _, err := paymentsv1.NewProviderEventsServiceClient(reader.conn).ListProviderEvents(t.Context(), &paymentsv1.ListProviderEventsRequest{}); err != nil {
				t.Errorf("event reader's ListProviderEvents() = %v", err)
			}
			if resp, err := co.client.CreateMultiCardPayment(t.Context(), validRequest("k-checkout")); err != nil || !resp.GetReplayed() {
				t.Errorf("checkout's replay = %v, %v", resp, err)
			}
		})
	}
}

// TestEventsOnlyForReaders: provider events are read only by the callers
// PAYMENTS_EVENT_READERS names and by the admins; any other caller is
// refused, with CALLER_NOT_EVENT_READER, over gRPC and REST, List and
// Watch alike; and without mTLS nobody reads them.
func TestEventsOnlyForReaders(t *testing.T) {
	t.Parallel()
	_, ps := mtlsDeployment(t, with(sandboxEnv(idempotentProvider(t)), "PAYMENTS_EVENT_READERS", billing))
	for name, wantOK := range map[string]bool{"billing": true, "oncall": true, "checkout": false} {
		pt := ps[name]
		events := paymentsv1.NewProviderEventsServiceClient(pt.conn)
		_, err := events.ListProviderEvents(t.Context(), &paymentsv1.ListProviderEventsRequest{})
		stream, werr := events.WatchProviderEvents(t.Context(), &paymentsv1.WatchProviderEventsRequest{})
		if werr == nil {
			_, werr = stream.Header()
			if werr == nil && !wantOK {
				_, werr = stream.Recv()
			}
		}
		r := pt.do(t, http.MethodGet, "/v1/provider-events", "")
		if wantOK {
			if err != nil || werr != nil || r.status != http.StatusOK {
				t.Errorf("%s: List = %v, Watch = %v, REST = %d %s; want all allowed", name, err, werr, r.status, r.raw)
			}
			continue
		}
		checkCode(t, name+"'s ListProviderEvents", err, codes.PermissionDenied, "CALLER_NOT_EVENT_READER")
		checkCode(t, name+"'s WatchProviderEvents", werr, codes.PermissionDenied, "CALLER_NOT_EVENT_READER")
		if r.status != http.StatusForbidden || restReason(r) != "CALLER_NOT_EVENT_READER" {
			t.Errorf("%s: REST GET /v1/provider-events = %d %s, want 403 CALLER_NOT_EVENT_READER", name, r.status, r.raw)
		}
	}
	plain := start(t, sandboxEnv(idempotentProvider(t)))
	_, err := paymentsv1.NewProviderEventsServiceClient(plain.conn).ListProviderEvents(t.Context(), &paymentsv1.ListProviderEventsRequest{})
	checkCode(t, "ListProviderEvents without mTLS", err, codes.PermissionDenied, "CALLER_NOT_EVENT_READER")
}

// tryDo is party.do that returns a transport error (a refused handshake)
// instead of failing.
func (p *party) tryDo(method, path string) (restResult, error) {
	req, err := http.NewRequest(method, p.base+path, nil)
	if err != nil {
		return restResult{}, err
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return restResult{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return restResult{status: resp.StatusCode, header: resp.Header, raw: raw}, err
}

// TestLiveRequiresCallerIdentity: live refuses to start without client
// certificates, naming the variable and the opt-out; with the opt-out it
// starts and says at ERROR that callers are not identified; sandbox says
// so at WARN; with mTLS nothing is said.
func TestLiveRequiresCallerIdentity(t *testing.T) {
	t.Parallel()
	live := liveEnv(t, fakeProvider(t, "live"))
	delete(live, "PAYMENTS_ALLOW_UNIDENTIFIED_CALLERS")
	_, _, err := runRefused(t, with(live, "PAYMENTS_GRPC_ADDR", "127.0.0.1:0", "PAYMENTS_HTTP_ADDR", "127.0.0.1:0",
		"PAYMENTS_DATABASE_URL", "sqlite:"+filepath.Join(t.TempDir(), "live.db")))
	if err == nil || !strings.Contains(err.Error(), "PAYMENTS_TLS_CLIENT_CA_FILE") || !strings.Contains(err.Error(), "PAYMENTS_ALLOW_UNIDENTIFIED_CALLERS") {
		t.Errorf("live without client certificates = %v; want a refusal naming PAYMENTS_TLS_CLIENT_CA_FILE and the opt-out", err)
	}

	const unidentified = "callers are not identified: PAYMENTS_TLS_CLIENT_CA_FILE is not set"
	in := start(t, with(live, "PAYMENTS_ALLOW_UNIDENTIFIED_CALLERS", "true"))
	if l := in.logs.lines(unidentified); len(l) != 1 || l[0]["level"] != "ERROR" || l[0]["variable"] != "PAYMENTS_TLS_CLIENT_CA_FILE" {
		t.Errorf("live with the opt-out logged %v; want one ERROR line naming PAYMENTS_TLS_CLIENT_CA_FILE", l)
	}
	sandbox := start(t, sandboxEnv(fakeProvider(t, "sandbox")))
	if l := sandbox.logs.lines(unidentified); len(l) != 1 || l[0]["level"] != "WARN" {
		t.Errorf("sandbox without client certificates logged %v; want one WARN line", l)
	}
	mtls, _ := mtlsDeployment(t, sandboxEnv(fakeProvider(t, "sandbox")))
	if l := mtls.logs.lines(unidentified); len(l) != 0 {
		t.Errorf("with mTLS paymentsd logged %v", l)
	}
}

// TestProbesNeedNoClientCertificate: with client certificates required on
// the gRPC and HTTP ports, the kubelet's probes (cleartext gRPC health
// checks, plain HTTP GETs, no certificate) get their answers on the health
// port, which serves nothing else; and the metrics port is scraped
// without a certificate.
func TestProbesNeedNoClientCertificate(t *testing.T) {
	t.Parallel()
	in, _ := mtlsDeployment(t, with(sandboxEnv(fakeProvider(t, "sandbox")),
		"PAYMENTS_HEALTH_ADDR", "127.0.0.1:0", "PAYMENTS_METRICS_ADDR", "127.0.0.1:0"))
	serving := in.logs.lines("serving")[0]
	health, metrics := serving["health_addr"].(string), serving["metrics_addr"].(string)
	for service, want := range map[string]healthpb.HealthCheckResponse_ServingStatus{"": healthpb.HealthCheckResponse_SERVING, "liveness": healthpb.HealthCheckResponse_SERVING} {
		if got, err := grpcProbe(t, health, service); err != nil || got != want {
			t.Errorf("gRPC probe of %q on the health port = %v, %v; want %v", service, got, err, want)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code := httpProbe(t, "http://"+health+path); code != http.StatusOK {
			t.Errorf("HTTP probe GET %s = %d, want 200", path, code)
		}
	}
	for _, path := range []string{"/metrics", "/openapi.json", "/v1/multi-card-payments"} {
		if code := httpProbe(t, "http://"+health+path); code != http.StatusNotFound {
			t.Errorf("health port GET %s = %d, want 404: it serves health and nothing else", path, code)
		}
	}
	conn, err := grpc.NewClient(health, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := paymentsv1.NewPaymentsServiceClient(conn).ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("PaymentsService on the health port = %v, want UNIMPLEMENTED", err)
	}
	// The same probes on the gRPC port fail: it wants a certificate.
	if _, err := grpcProbe(t, in.grpcAddr, ""); err == nil {
		t.Error("a cleartext gRPC probe of the gRPC port succeeded; it serves mTLS only")
	}
	if code := httpProbe(t, "http://"+metrics+"/metrics"); code != http.StatusOK {
		t.Errorf("scrape of the metrics port without a certificate = %d, want 200", code)
	}
}

// grpcProbe checks service's health at addr as the kubelet's gRPC probe
// does: cleartext HTTP/2, no certificate, grpc.health.v1 Check.
func grpcProbe(t *testing.T, addr, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUserAgent("kube-probe/1.33"))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	return resp.GetStatus(), err
}

// httpProbe GETs url as the kubelet's httpGet probe does, and returns the
// status, or 0 if the request failed.
func httpProbe(t *testing.T, url string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("User-Agent", "kube-probe/1.33")
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	resp, err := (&http.Client{Transport: transport, Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestTLSFilesRotate: a renewed serving certificate, swapped into its
// Secret volume as the kubelet does, is what the next handshake gets,
// without a restart; a new client CA admits the callers it signs from the
// next handshake on; a file that no longer makes a key pair leaves the last
// good one in use, and says so in paymentsd_secret_file_ok.
func TestTLSFilesRotate(t *testing.T) {
	t.Parallel()
	serverCA, oldCA, newCA := newTestCA(t, "server CA"), newTestCA(t, "client CA"), newTestCA(t, "next client CA")
	dir := filepath.Join(t.TempDir(), "paymentsd-tls")
	serve := func(ca *testCA, dnsName string) {
		t.Helper()
		certPEM, keyPEM, _ := serverCA.issueLeaf(t, &x509.Certificate{DNSNames: []string{dnsName},
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		atomicWrite(t, dir, map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM, "ca.crt": ca.pem})
	}
	serve(oldCA, "first.paymentsd.test")
	in := start(t, with(sandboxEnv(fakeProvider(t, "sandbox")),
		"PAYMENTS_TLS_CERT_FILE", filepath.Join(dir, "tls.crt"), "PAYMENTS_TLS_KEY_FILE", filepath.Join(dir, "tls.key"),
		"PAYMENTS_TLS_CLIENT_CA_FILE", filepath.Join(dir, "ca.crt"),
		"PAYMENTS_SECRET_RELOAD_INTERVAL", "20ms", "PAYMENTS_METRICS_ADDR", "127.0.0.1:0"))
	// handshake connects with cert, and returns the server certificate's
	// DNS name, or the handshake's error.
	handshake := func(cert tls.Certificate) (string, error) {
		conn, err := tls.Dial("tcp", in.grpcAddr, &tls.Config{RootCAs: serverCA.pool, Certificates: []tls.Certificate{cert},
			InsecureSkipVerify: true, NextProtos: []string{"h2"}}) // the name is what is looked at
		if err != nil {
			return "", err
		}
		defer conn.Close()
		// TLS 1.3 reports a refused client certificate on the first read.
		conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := conn.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return "", err
		}
		return conn.ConnectionState().PeerCertificates[0].DNSNames[0], nil
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10s", what)
			}
			time.Sleep(20 * time.Millisecond) // the next reload; it has no other signal than the next handshake
		}
	}
	oldClient, newClient := oldCA.issueClient(t, []string{checkout}, nil), newCA.issueClient(t, []string{checkout}, nil)
	if name, err := handshake(oldClient); err != nil || name != "first.paymentsd.test" {
		t.Fatalf("handshake = %q, %v; want the first certificate", name, err)
	}
	if _, err := handshake(newClient); err == nil {
		t.Fatal("a client of the next CA was admitted before the CA rotated")
	}

	serve(newCA, "renewed.paymentsd.test")
	waitFor("the renewed certificate served", func() bool { name, _ := handshake(newClient); return name == "renewed.paymentsd.test" })
	if _, err := handshake(oldClient); err == nil {
		t.Error("a client of the old CA is still admitted after the CA file changed")
	}
	in.logs.waitFor(t, "TLS file reloaded", nil)

	// Half-written: a key that is not the certificate's.
	_, otherKey, _ := serverCA.issueLeaf(t, &x509.Certificate{DNSNames: []string{"other.paymentsd.test"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)})
	certPEM, _ := os.ReadFile(filepath.Join(dir, "tls.crt"))
	atomicWrite(t, dir, map[string][]byte{"tls.crt": certPEM, "tls.key": otherKey, "ca.crt": newCA.pem})
	in.logs.waitFor(t, "TLS file not reloaded: the last good one stays in use until it is fixed", nil)
	if name, err := handshake(newClient); err != nil || name != "renewed.paymentsd.test" {
		t.Errorf("handshake with a broken key file = %q, %v; want the last good certificate", name, err)
	}
	resp, err := http.Get("http://" + in.logs.lines("serving")[0]["metrics_addr"].(string) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	metrics, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := sample(metrics, "paymentsd_secret_file_ok", map[string]string{"secret": "tls_certificate"}); v != 0 {
		t.Errorf("paymentsd_secret_file_ok{tls_certificate} = %v with a broken key file, want 0", v)
	}
}
