package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/config"
	"example.com/paymentsd/internal/service"
)

// streamTrust is paymentsd serving mTLS, with the webhook intake and the
// metrics port, on a clock the test moves, its client CA file in a volume the test updates
// as the kubelet would: checkout may pay, oncall is an admin (who reads
// events), and the reader reads events.
type streamTrust struct {
	in                 *instance
	clock              *testClock
	serverCA, clientCA *testCA
	caVolume           *secretVolume
	hooks              *http.Client
}

const eventReader = "spiffe://corp.example/ns/reconciliation/sa/reconciler"

func startStreamTrust(t *testing.T) *streamTrust {
	t.Helper()
	return startStreamTrustWith(t, nil)
}

// startStreamTrustWith is startStreamTrust with a further change to the
// loaded configuration.
func startStreamTrustWith(t *testing.T, change func(*config.Config)) *streamTrust {
	t.Helper()
	s := &streamTrust{clock: newTestClock(), serverCA: newTestCA(t, "server CA"), clientCA: newTestCA(t, "client CA")}
	certFile, keyFile := writePEMFiles(t, s.serverCA.issue(t, x509.ExtKeyUsageServerAuth))
	s.caVolume = newSecretVolume(t, "ca.crt", string(s.clientCA.pem))
	s.in = startConfigured(t, with(webhookEnv(t),
		"PAYMENTS_TLS_CERT_FILE", certFile, "PAYMENTS_TLS_KEY_FILE", keyFile,
		"PAYMENTS_TLS_CLIENT_CA_FILE", s.caVolume.path(),
		"PAYMENTS_SECRET_RELOAD_INTERVAL", "20ms", "PAYMENTS_METRICS_ADDR", "127.0.0.1:0",
		"PAYMENTS_ALLOWED_CALLERS", checkout, "PAYMENTS_ADMIN_CALLERS", oncall, "PAYMENTS_EVENT_READERS", eventReader),
		nil, func(c *config.Config) {
			c.Hooks.Clock = s.clock
			if change != nil {
				change(c)
			}
		})
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.serverCA.pool, MinVersion: tls.VersionTLS12}}
	t.Cleanup(transport.CloseIdleConnections)
	s.hooks = &http.Client{Transport: transport}
	return s
}

// deliver has the provider deliver an event to the webhook intake.
func (s *streamTrust) deliver(t *testing.T, n int) {
	t.Helper()
	if code, reply := deliver(t, s.hooks, "https://"+s.in.webhookAddr+"/webhooks/"+webhookToken, "application/json", fmt.Appendf(nil, `{"n":%d}`, n)); code != http.StatusOK {
		t.Fatalf("webhook delivery = %d %s, want 200", code, reply)
	}
}

// openWatch watches the provider's events with cert, and returns what the
// stream receives: each event's sequence, then its end (a nil event and
// the status it ended with).
type watchItem struct {
	seq int64
	err error
}

func (s *streamTrust) openWatch(t *testing.T, cert tls.Certificate) <-chan watchItem {
	t.Helper()
	p := newParty(t, s.in, s.serverCA, cert, "watcher")
	// Not the test's context: the stream ends only as paymentsd ends it
	// (or the connection closes, at the test's end).
	stream, err := paymentsv1.NewProviderEventsServiceClient(p.conn).WatchProviderEvents(context.Background(), &paymentsv1.WatchProviderEventsRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("WatchProviderEvents() = %v", err)
	}
	if _, err := stream.Header(); err != nil {
		t.Fatalf("WatchProviderEvents Header() = %v", err)
	}
	items := make(chan watchItem, 100)
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				items <- watchItem{err: err}
				return
			}
			items <- watchItem{seq: resp.GetEvent().GetSequence()}
		}
	}()
	return items
}

// next waits for the stream's next item.
func next(t *testing.T, items <-chan watchItem, what string) watchItem {
	t.Helper()
	select {
	case it := <-items:
		return it
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: the stream neither delivered nor ended", what)
		return watchItem{}
	}
}

// TestStreamEndsWhenItsCertificateExpires: a WatchProviderEvents stream
// whose caller's certificate expires while it is open ends then, with
// PERMISSION_DENIED (CALLER_NOT_ALLOWED), and delivers nothing after; a
// stream whose certificate is still valid goes on.
func TestStreamEndsWhenItsCertificateExpires(t *testing.T) {
	t.Parallel()
	s := startStreamTrust(t)
	short := s.clientCA.issueClientUntil(t, eventReader, s.clock.Now().Add(10*time.Minute))
	long := s.clientCA.issueClientUntil(t, eventReader, s.clock.Now().Add(50*time.Minute))
	shortWatch, longWatch := s.openWatch(t, short), s.openWatch(t, long)
	s.deliver(t, 1)
	for name, w := range map[string]<-chan watchItem{"short": shortWatch, "long": longWatch} {
		if it := next(t, w, name+" watch before expiry"); it.err != nil || it.seq != 1 {
			t.Fatalf("%s watch before expiry = %+v, want event 1", name, it)
		}
	}

	s.clock.advance(11 * time.Minute) // past the short certificate's NotAfter
	it := next(t, shortWatch, "the watch whose certificate expired")
	if it.err == nil {
		t.Fatalf("the watch whose certificate expired delivered event %d", it.seq)
	}
	checkCode(t, "the watch whose certificate expired", it.err, codes.PermissionDenied, service.ReasonCallerNotAllowed)

	s.deliver(t, 2)
	if it := next(t, longWatch, "the watch whose certificate is valid"); it.err != nil || it.seq != 2 {
		t.Errorf("the watch whose certificate is valid = %+v, want event 2", it)
	}

	// paymentsd drains with the valid watch still open: the watch ends
	// (UNAVAILABLE, watch again), and paymentsd stops.
	if err := s.in.stop(); err != nil {
		t.Errorf("run() = %v, want nil after the context ends", err)
	}
	if it := next(t, longWatch, "the watch at shutdown"); it.err == nil {
		t.Errorf("the watch at shutdown delivered event %d", it.seq)
	} else {
		checkCode(t, "the watch at shutdown", it.err, codes.Unavailable, "")
	}
	if l := s.in.logs.lines("shutdown timeout expired: cutting off calls in flight"); len(l) > 0 {
		t.Errorf("the drain waited out its timeout for the open watch: %v", l)
	}
}

// TestStreamEndsWhenItsCAIsRemoved: once the client CA file is re-read
// without the CA that signed a watching caller's certificate, its open
// stream ends (PERMISSION_DENIED, CALLER_NOT_ALLOWED), as its one-off calls
// are refused: dropping a CA revokes what it signed. A reload that keeps
// the CA (a new one added beside it) ends nothing.
func TestStreamEndsWhenItsCAIsRemoved(t *testing.T) {
	t.Parallel()
	s := startStreamTrust(t)
	w := s.openWatch(t, s.clientCA.issueClient(t, []string{eventReader}, nil))
	s.deliver(t, 1)
	if it := next(t, w, "the watch"); it.err != nil || it.seq != 1 {
		t.Fatalf("the watch = %+v, want event 1", it)
	}

	nextCA := newTestCA(t, "next client CA")
	s.caVolume.update(t, string(s.clientCA.pem)+string(nextCA.pem))
	s.in.logs.waitLines(t, "TLS file reloaded", 1)
	s.deliver(t, 2)
	if it := next(t, w, "the watch after a CA was added"); it.err != nil || it.seq != 2 {
		t.Fatalf("the watch after a CA was added = %+v, want event 2", it)
	}

	s.caVolume.update(t, string(nextCA.pem))
	s.in.logs.waitLines(t, "TLS file reloaded", 2)
	it := next(t, w, "the watch after its CA was removed")
	if it.err == nil {
		t.Fatalf("the watch after its CA was removed delivered event %d", it.seq)
	}
	checkCode(t, "the watch after its CA was removed", it.err, codes.PermissionDenied, service.ReasonCallerNotAllowed)
}

// issueClientUntil is a client certificate for the SPIFFE ID id that
// expires at notAfter.
func (ca *testCA) issueClientUntil(t *testing.T, id string, notAfter time.Time) tls.Certificate {
	t.Helper()
	certPEM, keyPEM, _ := ca.issueLeaf(t, &x509.Certificate{
		URIs:        []*url.URL{mustURL(t, id)},
		NotBefore:   time.Now().Add(-time.Hour),
		NotAfter:    notAfter,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}
