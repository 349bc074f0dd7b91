package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrapeMetricsPort reads the metrics port's families.
func scrapeMetricsPort(t *testing.T, in *instance) map[string]*dto.MetricFamily {
	t.Helper()
	addr, _ := in.logs.lines("serving")[0]["metrics_addr"].(string)
	code, body := scrapeOnce(t, addr)
	if code != 200 {
		t.Fatalf("GET /metrics on the metrics port = %d %s", code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics is not Prometheus text: %v", err)
	}
	return families
}

// waitSample waits until the series reads want.
func waitSample(t *testing.T, in *instance, family string, labels map[string]string, want float64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, _ := sample(scrapeMetricsPort(t, in), family, labels)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %v, want %v", family, labels, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// handshake makes a TLS handshake with addr as tc says, and then reads,
// so that a refusal the server decides after the client's last flight
// (TLS 1.3 verifies the client's certificate there) reaches the client
// too; or, with tc nil, sends a plaintext HTTP request.
func handshake(t *testing.T, addr string, tc *tls.Config) {
	t.Helper()
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(10 * time.Second))
	if tc == nil {
		io.WriteString(raw, "GET / HTTP/1.1\r\nHost: paymentsd\r\n\r\n")
		io.Copy(io.Discard, raw)
		return
	}
	c := tls.Client(raw, tc)
	if err := c.Handshake(); err == nil {
		c.Read(make([]byte, 1))
	}
}

// TestRefusedHandshakesAreCountedAndLogged: every TLS handshake paymentsd
// refuses, on each of its TLS ports, is counted in
// paymentsd_tls_handshakes_refused_total by port and reason, and logged
// (`TLS handshake refused`, with the port, reason, remote address, and
// what the caller's certificate names), at most once a minute for each
// port and reason, the next line saying how many were not logged.
func TestRefusedHandshakesAreCountedAndLogged(t *testing.T) {
	t.Parallel()
	s := startStreamTrust(t)
	stranger := newTestCA(t, "another CA")
	good := s.clientCA.issueClient(t, []string{checkout}, nil)
	expiredPEM, expiredKey, _ := s.clientCA.issueLeaf(t, &x509.Certificate{URIs: []*url.URL{mustURL(t, checkout)},
		NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	expired, err := tls.X509KeyPair(expiredPEM, expiredKey)
	if err != nil {
		t.Fatal(err)
	}
	serverOnly := s.clientCA.issue(t, x509.ExtKeyUsageServerAuth)
	client := func(cert *tls.Certificate, roots *x509.CertPool, protos ...string) *tls.Config {
		tc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12, NextProtos: protos, ServerName: "127.0.0.1"}
		if cert != nil {
			// Sent whatever CAs paymentsd asks for. (A Go client sends
			// none that chains to none of them: it is refused as
			// no_certificate.)
			tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		}
		return tc
	}
	strangerCert := stranger.issueClient(t, []string{checkout}, nil)
	serving, _ := s.in.logs.lines("serving")[0]["webhook_addr"].(string)
	ports := map[string]string{"grpc": s.in.grpcAddr, "http": s.in.httpAddr, "webhooks": serving}
	type attempt struct {
		reason string
		tc     *tls.Config // nil: plaintext HTTP
	}
	for port, addr := range ports {
		attempts := []attempt{
			{"not_tls", nil},
			{"client_refused", client(&good, stranger.pool, "h2")}, // the caller doesn't trust paymentsd's certificate
		}
		if port != "webhooks" {
			attempts = append(attempts,
				attempt{"no_certificate", client(nil, s.serverCA.pool, "h2")},
				attempt{"unknown_authority", client(&strangerCert, s.serverCA.pool, "h2")},
				attempt{"expired", client(&expired, s.serverCA.pool, "h2")},
				attempt{"bad_certificate", client(&serverOnly, s.serverCA.pool, "h2")},
			)
		}
		for _, a := range attempts {
			labels := map[string]string{"port": port, "reason": a.reason}
			if v, ok := sample(scrapeMetricsPort(t, s.in), "paymentsd_tls_handshakes_refused_total", labels); !ok || v != 0 {
				t.Errorf("paymentsd_tls_handshakes_refused_total%v before = %v (present %v), want 0", labels, v, ok)
			}
			for range 3 {
				handshake(t, addr, a.tc)
			}
			waitSample(t, s.in, "paymentsd_tls_handshakes_refused_total", labels, 3)
		}
	}

	// One line per port and reason, until a minute has passed; then the
	// next says how many were left out.
	logged := func(port, reason string) []map[string]any {
		var out []map[string]any
		for _, l := range s.in.logs.lines("TLS handshake refused") {
			if l["port"] == port && l["reason"] == reason {
				out = append(out, l)
			}
		}
		return out
	}
	if l := logged("grpc", "unknown_authority"); len(l) != 1 || l[0]["peer_uris"] == nil || !strings.Contains(fmt.Sprint(l[0]["peer_uris"]), checkout) || l[0]["remote_addr"] == nil {
		t.Errorf("grpc unknown_authority log lines = %v, want one naming the certificate's URI and the remote address", l)
	}
	if l := logged("http", "expired"); len(l) != 1 {
		t.Errorf("http expired log lines = %v, want one", l)
	}
	s.clock.advance(time.Minute + time.Second)
	handshake(t, s.in.httpAddr, client(&expired, s.serverCA.pool, "h2"))
	waitSample(t, s.in, "paymentsd_tls_handshakes_refused_total", map[string]string{"port": "http", "reason": "expired"}, 4)
	if l := logged("http", "expired"); len(l) != 2 || fmt.Sprint(l[1]["suppressed"]) != "2" {
		t.Errorf("http expired log lines after a minute = %v, want a second one with suppressed 2", l)
	}

	// A good caller is counted nowhere.
	before := scrapeMetricsPort(t, s.in)
	p := newParty(t, s.in, s.serverCA, good, "checkout")
	if _, err := p.client.CreateMultiCardPayment(t.Context(), validRequest("k-handshake")); err != nil {
		t.Fatalf("CreateMultiCardPayment() = %v", err)
	}
	after := scrapeMetricsPort(t, s.in)
	for _, m := range after["paymentsd_tls_handshakes_refused_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if was, _ := sample(before, "paymentsd_tls_handshakes_refused_total", labels); m.GetCounter().GetValue() != was {
			t.Errorf("paymentsd_tls_handshakes_refused_total%v moved from %v to %v for a good caller", labels, was, m.GetCounter().GetValue())
		}
	}
}
