package main

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/config"
	"example.com/paymentsd/internal/service"
)

// clockedMTLS starts paymentsd with mTLS (oncall an admin) on a clock the
// test moves forward, as if time passed: the certificates it issues
// expire an hour from now.
func clockedMTLS(t *testing.T) (in *instance, serverCA, clientCA *testCA, advance func(time.Duration)) {
	t.Helper()
	clock := newTestClock()
	serverCA, clientCA = newTestCA(t, "server CA"), newTestCA(t, "client CA")
	certFile, keyFile := writePEMFiles(t, serverCA.issue(t, x509.ExtKeyUsageServerAuth))
	clientCAFile := filepath.Join(t.TempDir(), "client-ca.pem")
	if err := os.WriteFile(clientCAFile, clientCA.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	in = startConfigured(t, with(sandboxEnv(idempotentProvider(t)), "PAYMENTS_TLS_CERT_FILE", certFile, "PAYMENTS_TLS_KEY_FILE", keyFile,
		"PAYMENTS_TLS_CLIENT_CA_FILE", clientCAFile, "PAYMENTS_ALLOWED_CALLERS", checkout, "PAYMENTS_ADMIN_CALLERS", oncall),
		nil, func(c *config.Config) { c.Hooks.Clock = clock })
	return in, serverCA, clientCA, clock.advance
}

// TestExpiredCertificateEndsOpenConnections: a caller whose certificate
// expires while its gRPC and REST connections are open (an on-call
// person's lasts 8 hours; a REST connection in use stays open for as long
// as it is used) is answered nothing more on them; a new connection with
// it is refused at the handshake, as it always was.
func TestExpiredCertificateEndsOpenConnections(t *testing.T) {
	t.Parallel()
	in, serverCA, clientCA, advance := clockedMTLS(t)
	admin := newParty(t, in, serverCA, clientCA.issueClient(t, []string{oncall}, nil), "oncall")
	list := func() (grpcErr error, rest restResult, restErr error) {
		_, grpcErr = admin.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{})
		rest, restErr = admin.tryDo(http.MethodGet, "/v1/multi-card-payments")
		return grpcErr, rest, restErr
	}
	if grpcErr, rest, restErr := list(); grpcErr != nil || restErr != nil || rest.status != http.StatusOK {
		t.Fatalf("admin's List = %v; REST %d %v; want both answered", grpcErr, rest.status, restErr)
	}

	advance(time.Hour + time.Minute) // past the certificate's NotAfter
	grpcErr, rest, restErr := list()
	if s := status.Code(grpcErr); s != codes.PermissionDenied && s != codes.Unavailable {
		t.Errorf("gRPC List on an open connection after the certificate expired = %v; want it refused", grpcErr)
	} else if s == codes.PermissionDenied {
		checkCode(t, "gRPC List after the certificate expired", grpcErr, codes.PermissionDenied, service.ReasonCallerNotAllowed)
	}
	if restErr == nil && rest.status == http.StatusOK {
		t.Errorf("REST List on an open connection after the certificate expired = %d; want it refused", rest.status)
	}
}

// TestRESTConnectionsAge: the REST port closes a connection once it is
// older than service.MaxConnectionAge, gracefully (its last answer says
// Connection: close over HTTP/1.1, and HTTP/2 sends GOAWAY), as the gRPC
// port does: so a REST caller reconnects with the certificate it holds
// now, well before the one it connected with expires (csi-driver-spiffe
// renews an SVID at two thirds of its life), and to whichever replica.
func TestRESTConnectionsAge(t *testing.T) {
	t.Parallel()
	in, serverCA, clientCA, advance := clockedMTLS(t)
	cert := clientCA.issueClient(t, []string{checkout}, nil)
	for _, proto := range []string{"http/1.1", "h2"} {
		tc := &tls.Config{RootCAs: serverCA.pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{proto}}
		transport := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: proto == "h2"}
		t.Cleanup(transport.CloseIdleConnections)
		client := &http.Client{Transport: transport}
		// get lists, and says whether it went over a connection used before.
		get := func() (reused bool) {
			t.Helper()
			req, err := http.NewRequest(http.MethodGet, "https://"+in.httpAddr+"/v1/multi-card-payments", nil)
			if err != nil {
				t.Fatal(err)
			}
			req = req.WithContext(httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{
				GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
			}))
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s GET: %v", proto, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Proto != map[string]string{"http/1.1": "HTTP/1.1", "h2": "HTTP/2.0"}[proto] {
				t.Fatalf("%s GET = %s %d, want %s 200", proto, resp.Proto, resp.StatusCode, proto)
			}
			return reused
		}
		get()
		if !get() {
			t.Fatalf("%s: a young connection was not reused", proto)
		}
		advance(service.MaxConnectionAge + time.Second)
		// The next answer is the connection's last: the one after it goes
		// over a new connection (over HTTP/2 the client may send one more
		// before GOAWAY reaches it).
		get()
		newConn := false
		for range 3 {
			if !get() {
				newConn = true
				break
			}
		}
		if !newConn {
			t.Errorf("%s: a connection older than %v is still used", proto, service.MaxConnectionAge)
		}
	}
}
