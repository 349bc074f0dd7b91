package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
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
						case codes.Unauthenticated, codes.PermissionDenied, codes.Unavailable:
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
