package daemon

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestRefusalLogLinesStaySmall: the caller writes its certificate, and so
// most of a refusal's error; a line about it holds a few of its names,
// each clipped, however many and however long they are.
func TestRefusalLogLinesStaySmall(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	h := newHandshakeRefusals(prometheus.NewRegistry(), slog.New(slog.NewJSONHandler(&logs, nil)), time.Now)
	long := strings.Repeat("a", 10_000)
	var uris []*url.URL
	for i := range 50 {
		uris = append(uris, &url.URL{Scheme: "spiffe", Host: "corp.example", Path: fmt.Sprintf("/%d/%s", i, long)})
	}
	cert := &x509.Certificate{URIs: uris, DNSNames: []string{long, long, long, long, long, long}}
	h.refuse("grpc", nil, &tls.CertificateVerificationError{UnverifiedCertificates: []*x509.Certificate{cert}, Err: fmt.Errorf("x509: %s", long)})
	if n := strings.Count(logs.String(), `"msg":"TLS handshake refused"`); n != 1 {
		t.Fatalf("log lines = %q, want one refusal", logs.String())
	}
	if n := logs.Len(); n > 4096 {
		t.Errorf("the refusal's log line is %d bytes, want it clipped", n)
	}
}
