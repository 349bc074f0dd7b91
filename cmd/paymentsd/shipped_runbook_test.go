package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/service"
)

// rotationSteps are the steps of docs/identity.md "Replacing the trust
// domain's CA", in order, as walkCARotation takes them.
var rotationSteps = []string{
	"Bundle the new CA with the old.",
	"Wait until every replica trusts both.",
	"Issue from the new CA.",
	"Reissue paymentsd's certificate.",
	"Wait out the old CA's certificates.",
	"Drop the old CA.",
}

// documentedRotationSteps are the bold titles of the numbered steps of
// docs/identity.md "Replacing the trust domain's CA".
func documentedRotationSteps(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../docs/identity.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "\n### Replacing the trust domain's CA\n")
	if i < 0 {
		t.Fatal(`docs/identity.md has no "Replacing the trust domain's CA" section`)
	}
	doc = doc[i+1:]
	if j := strings.Index(doc[4:], "\n#"); j >= 0 {
		doc = doc[:j+4]
	}
	var steps []string
	for _, m := range regexp.MustCompile(`(?m)^\d+\. \*\*([^*]+)\*\*`).FindAllStringSubmatch(doc, -1) {
		steps = append(steps, m[1])
	}
	return steps
}

// metrics scrapes the pod's metrics port, as Prometheus does.
func (pod *shippedPod) metrics(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := scrapeOnce(t, pod.addr(t, pod.containerPort(t, "metrics")))
	if code != http.StatusOK {
		t.Fatalf("GET /metrics on the metrics port = %d", code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return families
}

// waitMetric waits until the pod's series reads want, as on-call watches
// a step land on the dashboard.
func (pod *shippedPod) waitMetric(t *testing.T, family string, labels map[string]string, want float64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, _ := sample(pod.metrics(t), family, labels)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %v, want %v", family, labels, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// certRefusals is the pod's handshakes refused for a certificate, on any
// port.
func (pod *shippedPod) certRefusals(t *testing.T) float64 {
	t.Helper()
	n := 0.0
	for _, m := range pod.metrics(t)["paymentsd_tls_handshakes_refused_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "reason" && slices.Contains([]string{"no_certificate", "unknown_authority", "expired", "bad_certificate", "client_refused"}, l.GetValue()) {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// caller is a workload of the cluster calling the pod over gRPC, with its
// SVID, verifying paymentsd by the trust bundle in its volume (roots).
type caller struct {
	conn   *grpc.ClientConn
	client paymentsv1.PaymentsServiceClient
}

func (pod *shippedPod) dial(t *testing.T, cert tls.Certificate, roots *x509.CertPool) *caller {
	t.Helper()
	conn, err := grpc.NewClient(pod.addr(t, pod.containerPort(t, "grpc")), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: roots, Certificates: []tls.Certificate{cert}, ServerName: "paymentsd." + pod.ns + ".svc", MinVersion: tls.VersionTLS12,
	})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &caller{conn: conn, client: paymentsv1.NewPaymentsServiceClient(conn)}
}

// watch opens a WatchProviderEvents stream on c's connection, from after
// the sequence after; what it receives goes to the channel, as openWatch's.
func (c *caller) watch(t *testing.T, after int64) (items <-chan watchItem, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := paymentsv1.NewProviderEventsServiceClient(c.conn).WatchProviderEvents(ctx, &paymentsv1.WatchProviderEventsRequest{AfterSequence: after})
	if err == nil {
		_, err = stream.Header()
	}
	if err != nil {
		cancel()
		t.Fatalf("WatchProviderEvents() = %v", err)
	}
	ch := make(chan watchItem, 100)
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				ch <- watchItem{err: err}
				return
			}
			ch <- watchItem{seq: resp.GetEvent().GetSequence()}
		}
	}()
	t.Cleanup(cancel)
	return ch, cancel
}

// deliver has the provider deliver an event to the pod's webhook port,
// verifying it by roots.
func (pod *shippedPod) deliver(t *testing.T, roots *x509.CertPool, n int) {
	t.Helper()
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "paymentsd-webhooks." + pod.ns + ".svc", MinVersion: tls.VersionTLS12}}
	defer transport.CloseIdleConnections()
	url := "https://" + pod.addr(t, pod.containerPort(t, "webhooks")) + "/webhooks/" + webhookToken
	if code, reply := deliver(t, &http.Client{Transport: transport}, url, "application/json", fmt.Appendf(nil, `{"n":%d}`, n)); code != http.StatusOK {
		t.Fatalf("webhook delivery = %d %s, want 200", code, reply)
	}
}

// pool is a trust bundle of cas, as a caller's ca.crt holds it.
func pool(cas ...*testCA) *x509.CertPool {
	p := x509.NewCertPool()
	for _, ca := range cas {
		p.AddCert(ca.cert)
	}
	return p
}

// walkCARotation replaces the trust domain's CA on the pod by following
// docs/identity.md "Replacing the trust domain's CA" step by step, as
// trust-manager, cert-manager, csi-driver-spiffe and the kubelet would
// carry each out: a caller paying and a reader watching events throughout,
// each renewing its SVID from the new CA once the issuers move to it.
// Callers on the new CA are accepted before the old CA is dropped, and no
// handshake is refused until then; once it is dropped, a certificate of
// the old CA is refused at the handshake, and a watch left open with one
// ends.
func (pod *shippedPod) walkCARotation(t *testing.T) {
	t.Helper()
	if got := documentedRotationSteps(t); !slices.Equal(got, rotationSteps) {
		t.Fatalf("docs/identity.md's CA rotation steps = %q, want the steps the test walks, %q", got, rotationSteps)
	}
	payer, _, reader := pod.callers(t)
	old, nextCA := pod.trustDomain, newTestCA(t, "next trust domain CA")
	refusedBefore := pod.certRefusals(t)
	// The payer lists its payments (the provider is never called here):
	// a call its certificate must be accepted for.
	pay := func(who string, c *caller) {
		t.Helper()
		if _, err := c.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{}); err != nil {
			t.Errorf("%s: ListMultiCardPayments = %v; want it answered", who, err)
		}
	}
	events := 0
	deliverAll := func(roots *x509.CertPool, watches map[string]<-chan watchItem) {
		t.Helper()
		events++
		pod.deliver(t, roots, events)
		for who, w := range watches {
			if it := next(t, w, who); it.err != nil {
				t.Errorf("%s: the watch ended: %v; want the event", who, it.err)
			}
		}
	}

	// Before: everything is of the old CA.
	oldPayer := pod.dial(t, svidFor(t, old, payer), pool(old))
	oldReader := pod.dial(t, svidFor(t, old, reader), pool(old))
	oldWatch, _ := oldReader.watch(t, 0)
	pay("the payer, old CA", oldPayer)
	deliverAll(pool(old), map[string]<-chan watchItem{"the old reader's watch": oldWatch})

	// 1. The bundle holds both; so do the callers' ca.crt.
	atomicWrite(t, pod.bundleDir, map[string][]byte{pod.bundleFile: append(slices.Clone(old.pem), nextCA.pem...)})
	// 2. Every replica trusts both.
	pod.waitMetric(t, "paymentsd_tls_client_ca_certificates", nil, 2)
	pay("the payer, old CA, after the bundle", oldPayer)

	// 3. The issuers sign with the new CA: the callers' SVIDs are renewed
	// from it, and accepted while those of the old still are.
	newPayer := pod.dial(t, svidFor(t, nextCA, payer), pool(old, nextCA))
	newReader := pod.dial(t, svidFor(t, nextCA, reader), pool(old, nextCA))
	newWatch, _ := newReader.watch(t, int64(events))
	pay("the payer, new CA", newPayer)
	pay("the payer, old CA, after the issuers moved", pod.dial(t, svidFor(t, old, payer), pool(old, nextCA)))
	deliverAll(pool(old), map[string]<-chan watchItem{"the old reader's watch": oldWatch, "the new reader's watch": newWatch})

	// 4. paymentsd's certificate, reissued from the new CA.
	serving := map[string][]byte{}
	for k, v := range pod.tlsFiles {
		serving[k] = v
	}
	certPEM, keyPEM, cert := nextCA.issueLeaf(t, &x509.Certificate{DNSNames: pod.overlay.cert.Spec.DNSNames,
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(720 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	serving["tls.crt"], serving["tls.key"], serving["ca.crt"] = certPEM, keyPEM, nextCA.pem
	atomicWrite(t, pod.tlsDir, serving)
	pod.waitMetric(t, "paymentsd_tls_certificate_expiry_timestamp_seconds", nil, float64(cert.NotAfter.Unix()))
	renewedPayer := pod.dial(t, svidFor(t, nextCA, payer), pool(old, nextCA))
	pay("the payer, new CA, verifying paymentsd's new certificate by the bundle", renewedPayer)
	deliverAll(pool(old, nextCA), map[string]<-chan watchItem{"the old reader's watch": oldWatch, "the new reader's watch": newWatch})

	// 5. The old certificates are renewed: nobody was refused.
	if n := pod.certRefusals(t) - refusedBefore; n != 0 {
		t.Errorf("%v handshakes refused for a certificate before the old CA was dropped, want none", n)
	}

	// 6. The old CA leaves the bundle. The new CA's callers go on; a
	// certificate of the old CA is refused, and a watch left open with
	// one ends.
	atomicWrite(t, pod.bundleDir, map[string][]byte{pod.bundleFile: nextCA.pem})
	pod.waitMetric(t, "paymentsd_tls_client_ca_certificates", nil, 1)
	pay("the payer, new CA, after the old CA was dropped", renewedPayer)
	if it := next(t, oldWatch, "the watch left open with the old CA's certificate"); it.err == nil {
		t.Errorf("the watch of the old CA's certificate delivered event %d after its CA was dropped", it.seq)
	} else {
		checkCode(t, "the watch of the old CA's certificate, its CA dropped", it.err, codes.PermissionDenied, service.ReasonCallerNotAllowed)
	}
	deliverAll(pool(nextCA), map[string]<-chan watchItem{"the new reader's watch": newWatch})
	_, err := pod.dial(t, svidFor(t, old, payer), pool(nextCA)).client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("a call with the old CA's certificate after it was dropped = %v, want it refused at the handshake", err)
	}
	if n := pod.certRefusals(t) - refusedBefore; n == 0 {
		t.Errorf("the old CA's certificate was refused, and paymentsd_tls_handshakes_refused_total did not count it")
	}
}

// holdHealthPort holds 100 connections open on the pod's health port, the
// way a stranger reaching it through node-local traffic or kubectl
// port-forward could, and probes it as the kubelet would: every probe is
// answered.
func (pod *shippedPod) holdHealthPort(t *testing.T) {
	t.Helper()
	addr := pod.addr(t, pod.containerPort(t, "health"))
	for i := range 100 {
		heldConn(t, addr, heldKinds[i%len(heldKinds)])
	}
	c := pod.container
	for _, pr := range []struct {
		name string
		p    *corev1.Probe
	}{{"startupProbe", c.StartupProbe}, {"readinessProbe", c.ReadinessProbe}, {"livenessProbe", c.LivenessProbe}} {
		if pr.p == nil || pr.p.GRPC == nil {
			t.Fatalf("%s = %+v: the test knows gRPC probes", pr.name, pr.p)
		}
		if got, err := grpcProbe(t, pod.addr(t, pr.p.GRPC.Port), deref(pr.p.GRPC.Service)); err != nil || got.String() != "SERVING" {
			t.Errorf("%s with 100 connections held on the health port = %v, %v; want SERVING", pr.name, got, err)
		}
	}
}

// expiringWatch watches the provider's events as the event reader with a
// certificate that expires within seconds, on the pod's own clock: the
// watch ends when it does (PERMISSION_DENIED, CALLER_NOT_ALLOWED).
func (pod *shippedPod) expiringWatch(t *testing.T) {
	t.Helper()
	_, _, reader := pod.callers(t)
	certPEM, keyPEM, _ := pod.trustDomain.issueLeaf(t, &x509.Certificate{
		URIs: []*url.URL{mustURL(t, reader)}, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(3 * time.Second),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := pod.dial(t, pair, pool(pod.trustDomain)).watch(t, 0)
	for {
		// Events stored before are replayed first.
		if it := next(t, w, "the watch whose certificate expires"); it.err != nil {
			checkCode(t, "the watch whose certificate expired", it.err, codes.PermissionDenied, service.ReasonCallerNotAllowed)
			return
		}
	}
}

// stillSettling makes the record of key one whose last request may still
// be at the provider until until (its quiet period), as a settlement
// re-send leaves it.
func stillSettling(t *testing.T, dbURL, key string, until time.Time) {
	t.Helper()
	driver, dsn, update, at := "pgx", dbURL, `UPDATE records SET quiet_until = $1 WHERE key = $2`, any(until)
	if path, ok := strings.CutPrefix(dbURL, "sqlite:"); ok {
		driver, dsn, update, at = "sqlite", "file:"+path+"?_pragma=busy_timeout(10000)", `UPDATE records SET quiet_until = ?1 WHERE key = ?2`, until.UnixMicro()
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if r, err := db.Exec(update, at, key); err != nil {
		t.Fatal(err)
	} else if n, _ := r.RowsAffected(); n != 1 {
		t.Fatalf("no record of %s to make settling", key)
	}
}
