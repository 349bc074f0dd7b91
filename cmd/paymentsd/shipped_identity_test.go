package main

import (
	"crypto/tls"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// party is a caller of the pod with cert, over both transports, as the
// callers in the cluster reach it: through the Service's name, which the
// serving certificate names, trusting the trust domain's CA.
func (pod *shippedPod) party(t *testing.T, cert tls.Certificate, name string) *party {
	t.Helper()
	tc := &tls.Config{RootCAs: pod.trustDomain.pool, Certificates: []tls.Certificate{cert},
		ServerName: "paymentsd." + pod.ns + ".svc", MinVersion: tls.VersionTLS12}
	conn, err := grpc.NewClient(pod.addr(t, pod.containerPort(t, "grpc")), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	transport := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}
	t.Cleanup(transport.CloseIdleConnections)
	return &party{name: name, conn: conn, client: paymentsv1.NewPaymentsServiceClient(conn),
		http: &http.Client{Transport: transport}, base: "https://" + pod.addr(t, pod.containerPort(t, "http"))}
}

// svidFor is the certificate csi-driver-spiffe (or, for a person, the
// policy payments-people) would have ca sign for id.
func svidFor(t *testing.T, ca *testCA, id string) tls.Certificate {
	t.Helper()
	certPEM, keyPEM := ca.svid(t, id)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// TestShippedRolesGrantOnlyTheirRole: on each overlay as rendered, the
// event reader (the reconciler, listed in event-readers only) reads
// provider events and nothing else, and an admin (an on-call person,
// listed in admin-callers only) lists and looks up payments but takes
// none: neither is in allowed-callers, and only those may pay. Over gRPC
// and REST alike, and no record is made.
func TestShippedRolesGrantOnlyTheirRole(t *testing.T) {
	t.Parallel()
	for _, env := range []string{"sandbox", "live"} {
		t.Run(env, func(t *testing.T) {
			t.Parallel()
			pod := startShipped(t, env)
			_, admin, reader := pod.callers(t)
			seedRecords(t, pod.db, []seedRecord{{key: "k-seeded", amount: 100, created: time.Now().Add(-time.Hour), reply: `{"id":"pay_s"}`, caller: "spiffe://corp.example/ns/elsewhere/sa/someone"}})
			parties := map[string]*party{
				"reader": pod.party(t, svidFor(t, pod.trustDomain, reader), "reader"),
				"admin":  pod.party(t, svidFor(t, pod.trustDomain, admin), "admin"),
			}
			for name, p := range parties {
				_, err := p.client.CreateMultiCardPayment(t.Context(), validRequest("k-"+name))
				checkCode(t, name+"'s gRPC CreateMultiCardPayment", err, codes.PermissionDenied, "CALLER_NOT_ALLOWED")
				r := p.do(t, http.MethodPost, "/v1/multi-card-payments", validBody("k-"+name+"-rest"))
				if r.status != http.StatusForbidden || restReason(r) != "CALLER_NOT_ALLOWED" {
					t.Errorf("%s's REST create = %d %s, want 403 CALLER_NOT_ALLOWED", name, r.status, r.raw)
				}
			}
			// The reader reads events, and no payment.
			if _, err := paymentsv1.NewProviderEventsServiceClient(parties["reader"].conn).ListProviderEvents(t.Context(), &paymentsv1.ListProviderEventsRequest{}); err != nil {
				t.Errorf("reader's ListProviderEvents = %v, want events", err)
			}
			_, err := parties["reader"].client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{})
			checkCode(t, "reader's ListMultiCardPayments", err, codes.PermissionDenied, "CALLER_NOT_ALLOWED")
			_, err = parties["reader"].client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-seeded"})
			checkCode(t, "reader's GetMultiCardPayment", err, codes.PermissionDenied, "CALLER_NOT_ALLOWED")
			// The admin still does what on-call needs; no payment was made.
			l, err := parties["admin"].client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{})
			if got := listKeys(l); err != nil || len(got) != 1 || got[0] != "k-seeded" {
				t.Errorf("admin's ListMultiCardPayments = %v, %v; want only [k-seeded]", got, err)
			}
			if _, err := parties["admin"].client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-seeded"}); err != nil {
				t.Errorf("admin's GetMultiCardPayment = %v", err)
			}
		})
	}
}

// TestShippedCARotationEndsOpenConnections: on each overlay as rendered,
// once the trust domain's CA is replaced in the mounted trust bundle (the
// step docs/identity.md "Rotation" ends with: drop the old CA) and paymentsd
// has re-read it, a caller whose certificate only the old CA signed is
// answered nothing more, not even on the gRPC and REST connections it
// opened before: the rotation revokes.
func TestShippedCARotationEndsOpenConnections(t *testing.T) {
	t.Parallel()
	for _, env := range []string{"sandbox", "live"} {
		t.Run(env, func(t *testing.T) {
			t.Parallel()
			pod := startShipped(t, env)
			_, admin, _ := pod.callers(t)
			old := pod.party(t, svidFor(t, pod.trustDomain, admin), "admin")
			list := func() (grpcErr error, restStatus int) {
				_, grpcErr = old.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{})
				r, err := old.tryDo(http.MethodGet, "/v1/multi-card-payments")
				if err != nil {
					return grpcErr, 0
				}
				return grpcErr, r.status
			}
			if err, code := list(); err != nil || code != http.StatusOK {
				t.Fatalf("admin's List before the rotation = %v, REST %d; want both answered", err, code)
			}

			next := newTestCA(t, "next trust domain CA")
			atomicWrite(t, pod.bundleDir, map[string][]byte{pod.bundleFile: next.pem})
			pod.logs.waitFor(t, "TLS file reloaded", nil)

			err, code := list()
			if s := status.Code(err); s != codes.PermissionDenied && s != codes.Unavailable {
				t.Errorf("gRPC List on the connection of a certificate of the CA removed = %v; want it refused", err)
			}
			if code == http.StatusOK {
				t.Errorf("REST List on the connection of a certificate of the CA removed = %d; want it refused", code)
			}
			// The new CA's callers are admitted.
			if _, err := pod.party(t, svidFor(t, next, admin), "admin, renewed").client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{}); err != nil {
				t.Errorf("List with a certificate of the new CA = %v", err)
			}
		})
	}
}
