package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/csv"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/cli"
	"example.com/paymentsd/internal/store/storetest"
)

// rendered is what kustomize renders for an overlay: the Deployment, the
// ConfigMaps, and paymentsd's Certificate (the fields cert-manager reads).
type renderedOverlay struct {
	deployment appsv1.Deployment
	configMaps map[string]corev1.ConfigMap
	cert       struct {
		Spec struct {
			SecretName string   `json:"secretName"`
			Duration   string   `json:"duration"`
			DNSNames   []string `json:"dnsNames"`
			Usages     []string `json:"usages"`
			PrivateKey struct {
				Encoding string `json:"encoding"`
			} `json:"privateKey"`
		} `json:"spec"`
	}
}

// renderOverlay renders deploy/overlays/env with the pinned kustomize.
func renderOverlay(t *testing.T, env string) *renderedOverlay {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "tool", "-modfile=../../tools.go.mod", "kustomize", "build", "../../deploy/overlays/"+env)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kustomize build overlays/%s: %v\n%s", env, err, stderr.Bytes())
	}
	r := &renderedOverlay{configMaps: map[string]corev1.ConfigMap{}}
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		switch doc["kind"] {
		case "Deployment":
			err = json.Unmarshal(b, &r.deployment)
		case "ConfigMap":
			var cm corev1.ConfigMap
			err = json.Unmarshal(b, &cm)
			r.configMaps[cm.Name] = cm
		case "Certificate":
			err = json.Unmarshal(b, &r.cert)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// trustBundle is the Bundle deploy/cluster renders: trust-manager writes
// it as the ConfigMap name, key key.
type trustBundle struct{ name, key string }

func renderTrustBundle(t *testing.T) trustBundle {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "tool", "-modfile=../../tools.go.mod", "kustomize", "build", "../../deploy/cluster")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kustomize build cluster: %v\n%s", err, stderr.Bytes())
	}
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var doc struct {
			Kind     string `yaml:"kind"`
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
			Spec struct {
				Target struct {
					ConfigMap struct {
						Key string `yaml:"key"`
					} `yaml:"configMap"`
				} `yaml:"target"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if doc.Kind == "Bundle" {
			return trustBundle{name: doc.Metadata.Name, key: doc.Spec.Target.ConfigMap.Key}
		}
	}
	t.Fatal("deploy/cluster renders no Bundle")
	return trustBundle{}
}

// container is the rendered paymentsd container.
func (r *renderedOverlay) container(t *testing.T) corev1.Container {
	t.Helper()
	for _, c := range r.deployment.Spec.Template.Spec.Containers {
		if c.Name == "paymentsd" {
			return c
		}
	}
	t.Fatal("the Deployment has no container paymentsd")
	return corev1.Container{}
}

// configValue is what an env var from a ConfigMap key holds.
func (r *renderedOverlay) configValue(t *testing.T, c corev1.Container, name string) string {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
			return r.configMaps[e.ValueFrom.ConfigMapKeyRef.Name].Data[e.ValueFrom.ConfigMapKeyRef.Key]
		}
	}
	t.Fatalf("%s is not read from a ConfigMap", name)
	return ""
}

// atomicWrite writes files into dir as the kubelet writes a Secret volume
// and csi-lib a CSI volume (their AtomicWriter): into a new timestamped
// directory, published by swapping the ..data symlink, each file a
// symlink through it. Calling it again is a renewal.
func atomicWrite(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ts, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(ts, name), b, 0o440); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	os.Remove(tmp)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			t.Fatal(err)
		}
	}
}

// issueLeaf signs tmpl with the CA, with a new P-256 key, and returns the
// certificate PEM (as status.certificate holds it) and the key as PKCS#8
// PEM (privateKey.encoding PKCS8, and what csi-driver-spiffe writes).
func (ca *testCA) issueLeaf(t *testing.T, tmpl *x509.Certificate) (certPEM, keyPEM []byte, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber, _ = rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ = x509.ParseCertificate(der)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), cert
}

// svid is an X.509 SVID for a workload, as csi-driver-spiffe requests it:
// its one URI SAN, client and server auth, an hour.
func (ca *testCA) svid(t *testing.T, id string) (certPEM, keyPEM []byte) {
	t.Helper()
	u, err := url.Parse(id)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, _ = ca.issueLeaf(t, &x509.Certificate{
		URIs:        []*url.URL{u},
		NotBefore:   time.Now().Add(-time.Minute),
		NotAfter:    time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	})
	return certPEM, keyPEM
}

// runbookSection is the part of docs/identity.md that the on-call engineer
// follows; TestShippedDeployment runs its commands as written.
const runbookSection = "## On call"

// runbook returns the on-call procedure's shell lines from docs/identity.md:
// the PAYMENTS_CLI_* exports, the port-forward, and each 'paymentsd
// payments' command, in order.
func runbook(t *testing.T) (exports map[string]string, portForward string, commands [][]string) {
	t.Helper()
	b, err := os.ReadFile("../../docs/identity.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "\n"+runbookSection+"\n")
	if i < 0 {
		t.Fatalf("docs/identity.md has no %q section", runbookSection)
	}
	doc = doc[i+1:]
	if j := strings.Index(doc[3:], "\n## "); j >= 0 {
		doc = doc[:j+3]
	}
	exports = map[string]string{}
	for line := range strings.Lines(doc) {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "export PAYMENTS_CLI_"):
			k, v, _ := strings.Cut(strings.TrimPrefix(line, "export "), "=")
			exports[k] = v
		case strings.HasPrefix(line, "kubectl ") && strings.Contains(line, " port-forward "):
			portForward = line
		case strings.HasPrefix(line, "paymentsd payments "):
			commands = append(commands, shellWords(t, strings.TrimPrefix(line, "paymentsd payments ")))
		}
	}
	if len(exports) == 0 || portForward == "" || len(commands) == 0 {
		t.Fatalf("docs/identity.md %q: exports %v, port-forward %q, %d commands; want all three", runbookSection, exports, portForward, len(commands))
	}
	return exports, portForward, commands
}

// shellWords splits a command line as a shell would one with only
// double-quoted strings.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	in, have := false, false
	for _, r := range line {
		switch {
		case r == '"':
			in, have = !in, true
		case r == ' ' && !in:
			if have {
				words = append(words, w.String())
			}
			w.Reset()
			have = false
		default:
			w.WriteRune(r)
			have = true
		}
	}
	if in {
		t.Fatalf("unbalanced quotes in %q", line)
	}
	if have {
		words = append(words, w.String())
	}
	return words
}

// TestShippedDeployment runs paymentsd as each overlay ships it: it renders
// the overlay with the pinned kustomize, and runs paymentsd (in-process,
// through run) with the container's arguments and environment exactly,
// its mounted files written where they would be (under a temporary
// directory standing in for /) as cert-manager and the kubelet write them:
// the serving certificate, key and CA for the rendered Certificate, and
// the Secrets deploy/README.md has made. Only two things differ, both
// forced by the test: listen addresses bind 127.0.0.1:0 (no fixed ports),
// and the database URL the Secret holds names a temporary SQLite file
// (sandbox) or the tests' PostgreSQL (live). The provider is never called:
// the payments are seeded in the record store.
//
// Then it probes the pod as the kubelet would, and walks the on-call
// runbook of docs/identity.md as written, through the CLI, with a
// certificate for the first person PAYMENTS_ADMIN_CALLERS names (as the
// policy payments-people issues it): the payments in doubt, one resolved
// with evidence, yesterday exported. The audit names that person; a caller
// without a certificate, a service's SVID, another person and the same
// person's certificate for the other environment are refused; the event
// reader reads events and nobody else does. Then the other runbook steps:
// the kubelet's probes answered while 100 connections hold the health
// port, a watch ending when its certificate expires, and the trust
// domain's CA replaced as docs/identity.md says, nobody refused before the
// old CA is dropped.
func TestShippedDeployment(t *testing.T) {
	t.Parallel()
	for _, env := range []string{"sandbox", "live"} {
		t.Run(env, func(t *testing.T) {
			t.Parallel()
			testShippedDeployment(t, env)
		})
	}
}

// shippedPod is paymentsd running as an overlay ships it (startShipped).
type shippedPod struct {
	overlay   *renderedOverlay
	container corev1.Container
	env       string // sandbox or live
	ns        string // its namespace
	db        string // the database URL its Secret holds
	// trustDomain is the CA of the trust domain: it signed the serving
	// certificate, and its certificate is the mounted ca.crt.
	trustDomain *testCA
	// tlsDir is where the Secret of the rendered Certificate is mounted
	// (under the stand-in for /), and tlsFiles what it holds.
	tlsDir   string
	tlsFiles map[string][]byte
	// bundleDir is where the trust bundle's ConfigMap is mounted, and
	// bundleFile its file there.
	bundleDir, bundleFile string
	port                  map[int32]string // container port -> the variable binding it
	addrOf                map[string]string
	logs                  *logBuffer
}

// startShipped renders deploy/overlays/env with the pinned kustomize and
// runs paymentsd (in-process, through run) with the container's arguments
// and environment exactly, its mounted files written where they would be
// (under a temporary directory standing in for /) as cert-manager and the
// kubelet write them: the serving certificate, key and CA for the
// rendered Certificate, and the Secrets deploy/README.md has made. Only
// two things differ, both forced by the test: listen addresses bind
// 127.0.0.1:0 (no fixed ports), and the database URL the Secret holds
// names a temporary SQLite file (sandbox) or the tests' PostgreSQL
// (live). It stops when the test ends.
func startShipped(t *testing.T, env string) *shippedPod {
	t.Helper()
	db := "sqlite:" + filepath.Join(t.TempDir(), "records.db")
	if env == "live" {
		db = storetest.PostgresURL(t)
	}
	r := renderOverlay(t, env)
	c := r.container(t)
	root := t.TempDir() // stands in for the container's /
	trustDomain := newTestCA(t, "trust domain CA")
	caPEM := trustDomain.pem
	pod := &shippedPod{overlay: r, container: c, env: env, ns: "payments-" + env, db: db, trustDomain: trustDomain}

	// The mounted volumes' files.
	volumes := map[string]corev1.Volume{}
	for _, v := range r.deployment.Spec.Template.Spec.Volumes {
		volumes[v.Name] = v
	}
	envValue := map[string]string{}
	for _, e := range c.Env {
		envValue[e.Name] = e.Value
	}
	fileVar := func(path string) string {
		for k, v := range envValue {
			if v == path {
				return k
			}
		}
		return ""
	}
	bundle := renderTrustBundle(t)
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if ok && m.SubPath == "" && v.ConfigMap != nil && v.ConfigMap.Name == bundle.name {
			// The ConfigMap trust-manager writes for the Bundle, whose one
			// source is the trust domain's CA.
			files := map[string][]byte{}
			for _, item := range v.ConfigMap.Items {
				if item.Key != bundle.key {
					t.Fatalf("volume %s projects key %s of the trust bundle, which trust-manager writes as %s", v.Name, item.Key, bundle.key)
				}
				files[item.Path] = caPEM
				pod.bundleFile = item.Path
			}
			pod.bundleDir = filepath.Join(root, m.MountPath)
			atomicWrite(t, pod.bundleDir, files)
			continue
		}
		if !ok || v.Secret == nil || m.SubPath != "" {
			t.Fatalf("volumeMount %s: want a whole Secret volume, or the trust bundle's ConfigMap, got %+v", m.Name, v)
		}
		files := map[string][]byte{}
		for _, item := range v.Secret.Items {
			switch variable := fileVar(filepath.Join(m.MountPath, item.Path)); {
			case v.Secret.SecretName == r.cert.Spec.SecretName:
				// cert-manager's CA issuer, for the rendered Certificate.
				if len(files) == 0 {
					d, err := time.ParseDuration(r.cert.Spec.Duration)
					if err != nil || !slices.Contains(r.cert.Spec.Usages, "server auth") || r.cert.Spec.PrivateKey.Encoding != "PKCS8" {
						t.Fatalf("Certificate %+v: want a duration, server auth and a PKCS8 key", r.cert.Spec)
					}
					certPEM, keyPEM, _ := trustDomain.issueLeaf(t, &x509.Certificate{
						Subject:     pkix.Name{},
						DNSNames:    r.cert.Spec.DNSNames,
						NotBefore:   time.Now().Add(-time.Minute),
						NotAfter:    time.Now().Add(d),
						ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
					})
					files["tls.crt"], files["tls.key"], files["ca.crt"] = certPEM, keyPEM, caPEM
					pod.tlsDir, pod.tlsFiles = filepath.Join(root, m.MountPath), files
				}
			case variable == "PAYMENTS_"+strings.ToUpper(env)+"_API_KEY_FILE":
				files[item.Path] = []byte("sk_" + env + "_SENTINEL_shipped_0123456789\n")
			case variable == "PAYMENTS_DATABASE_URL_FILE":
				files[item.Path] = []byte(db + "\n")
			case variable == "PAYMENTS_"+strings.ToUpper(env)+"_WEBHOOK_TOKEN_FILE":
				files[item.Path] = []byte(webhookToken + "\n")
			default:
				t.Fatalf("Secret %s item %s is read by no variable the test knows (%q)", v.Secret.SecretName, item.Key, variable)
			}
		}
		atomicWrite(t, filepath.Join(root, m.MountPath), files)
	}
	if pod.tlsDir == "" || pod.bundleDir == "" {
		t.Fatal("the pods mount no Secret of the rendered Certificate, or not the trust bundle")
	}

	// The environment, exactly, but for the mount paths (under root) and
	// the listen addresses.
	pod.port = map[int32]string{}
	var environ []string
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
			v = r.configValue(t, c, e.Name)
		case e.ValueFrom != nil:
			t.Fatalf("%s: valueFrom %+v is not one the test can give", e.Name, e.ValueFrom)
		case strings.HasSuffix(e.Name, "_ADDR") && regexp.MustCompile(`^:\d+$`).MatchString(v):
			var p int32
			fmt.Sscanf(v, ":%d", &p)
			pod.port[p] = e.Name
			v = "127.0.0.1:0"
		case strings.HasPrefix(v, "/"):
			v = filepath.Join(root, v)
		}
		environ = append(environ, e.Name+"="+v)
	}
	args := append([]string{"paymentsd"}, slices.Concat(c.Command, c.Args)...)
	pod.logs = newLogBuffer()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, environ, io.Discard, pod.logs) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run() = %v after the context ended", err)
		}
	})
	serving := pod.logs.waitFor(t, "serving", done)
	pod.addrOf = map[string]string{
		"PAYMENTS_GRPC_ADDR": serving["grpc_addr"].(string), "PAYMENTS_HTTP_ADDR": serving["http_addr"].(string),
		"PAYMENTS_WEBHOOK_ADDR": serving["webhook_addr"].(string), "PAYMENTS_METRICS_ADDR": serving["metrics_addr"].(string),
		"PAYMENTS_HEALTH_ADDR": serving["health_addr"].(string),
	}
	return pod
}

// addr is the address that stands in for the pod's container port p.
func (pod *shippedPod) addr(t *testing.T, p int32) string {
	t.Helper()
	a := pod.addrOf[pod.port[p]]
	if a == "" {
		t.Fatalf("no listener of paymentsd binds container port %d", p)
	}
	return a
}

// containerPort is the container port named name.
func (pod *shippedPod) containerPort(t *testing.T, name string) int32 {
	t.Helper()
	for _, p := range pod.container.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("the container has no port %s", name)
	return 0
}

// callers are the identities the overlay's ConfigMap names: the first
// of PAYMENTS_ALLOWED_CALLERS, PAYMENTS_ADMIN_CALLERS and
// PAYMENTS_EVENT_READERS.
func (pod *shippedPod) callers(t *testing.T) (caller, admin, reader string) {
	t.Helper()
	first := func(name string) string {
		return strings.Split(pod.overlay.configValue(t, pod.container, name), ",")[0]
	}
	return first("PAYMENTS_ALLOWED_CALLERS"), first("PAYMENTS_ADMIN_CALLERS"), first("PAYMENTS_EVENT_READERS")
}

func testShippedDeployment(t *testing.T, env string) {
	pod := startShipped(t, env)
	r, c, db, ns, trustDomain, logs := pod.overlay, pod.container, pod.db, pod.ns, pod.trustDomain, pod.logs
	caPEM := trustDomain.pem
	podAddr := func(p int32) string {
		t.Helper()
		return pod.addr(t, p)
	}
	if l := logs.lines("callers are not identified: PAYMENTS_TLS_CLIENT_CA_FILE is not set"); len(l) > 0 {
		t.Errorf("the shipped deployment does not identify its callers: %v", l)
	}

	// The kubelet's probes: the startup probe first, then readiness and
	// liveness, each as the manifest says.
	for _, pr := range []struct {
		name string
		p    *corev1.Probe
	}{{"startupProbe", c.StartupProbe}, {"readinessProbe", c.ReadinessProbe}, {"livenessProbe", c.LivenessProbe}} {
		switch {
		case pr.p == nil:
			t.Errorf("no %s", pr.name)
		case pr.p.GRPC != nil:
			got, err := grpcProbe(t, podAddr(pr.p.GRPC.Port), deref(pr.p.GRPC.Service))
			// The ports open once the store is up, so readiness is SERVING
			// as soon as the listeners are.
			if err != nil || got.String() != "SERVING" {
				t.Errorf("%s (gRPC, port %d, service %q) = %v, %v; want SERVING", pr.name, pr.p.GRPC.Port, deref(pr.p.GRPC.Service), got, err)
			}
		case pr.p.HTTPGet != nil:
			if code := httpProbe(t, "http://"+podAddr(pr.p.HTTPGet.Port.IntVal)+pr.p.HTTPGet.Path); code < 200 || code >= 400 {
				t.Errorf("%s (GET %s) = %d, want 2xx or 3xx", pr.name, pr.p.HTTPGet.Path, code)
			}
		default:
			t.Errorf("%s = %+v: the test knows gRPC and httpGet probes", pr.name, pr.p)
		}
	}

	// Identities: the first admin (a person), a service that may pay,
	// the event reader, and a person who is not on call.
	admins := strings.Split(r.configValue(t, c, "PAYMENTS_ADMIN_CALLERS"), ",")
	caller := strings.Split(r.configValue(t, c, "PAYMENTS_ALLOWED_CALLERS"), ",")[0]
	reader := strings.Split(r.configValue(t, c, "PAYMENTS_EVENT_READERS"), ",")[0]
	person := admins[0]
	stranger := strings.TrimSuffix(person, filepath.Base(person)) + "mallory"
	if slices.Contains(admins, stranger) {
		t.Fatalf("%s is an admin", stranger)
	}
	user := filepath.Base(person) // the person's Kubernetes user name

	// Payments: two in doubt, settlement given up, made by the caller;
	// and one made yesterday (UTC), to export.
	today := time.Now().UTC().Truncate(24 * time.Hour)
	yesterday := today.AddDate(0, 0, -1)
	// The two in doubt were made an hour ago, but today (UTC) even in the
	// day's first hour: yesterday's export must not hold them.
	doubtAt := time.Now().Add(-time.Hour)
	if doubtAt.Before(today) {
		doubtAt = today
	}
	seedRecords(t, db, []seedRecord{
		{key: "k-doubt-1", amount: 1250, created: doubtAt, inDoubt: true, caller: caller},
		{key: "k-doubt-2", amount: 990, created: doubtAt, inDoubt: true, caller: caller},
		{key: "k-yesterday", amount: 4200, created: yesterday.Add(9 * time.Hour), reply: `{"id":"pay_y"}`, caller: caller},
		{key: "k-yesterday-other", amount: 700, created: yesterday.Add(10 * time.Hour), reply: `{"id":"pay_o"}`, caller: "spiffe://corp.example/ns/elsewhere/sa/someone"},
	})
	// The first is still settling: its last re-send may be at the
	// provider for a few seconds more, so a resolution now is refused
	// (PAYMENT_IN_PROGRESS) until then, as on-call meets it.
	stillSettling(t, db, "k-doubt-1", time.Now().Add(3*time.Second))

	// The on-call person's files, as cmctl writes them in the working
	// directory: the key it made, and the certificate approver-policy
	// let the people issuer sign; and the CA, from the request's status.
	work := t.TempDir()
	u, err := url.Parse(person)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, _ := trustDomain.issueLeaf(t, &x509.Certificate{
		URIs: []*url.URL{u}, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(8 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	for name, b := range map[string][]byte{"oncall-" + user + ".crt": certPEM, "oncall-" + user + ".key": keyPEM, "oncall-ca.crt": caPEM} {
		if err := os.WriteFile(filepath.Join(work, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	exports, portForward, commands := runbook(t)
	// kubectl -n payments-live port-forward service/paymentsd 9090:9090:
	// localhost:9090 is the pod's gRPC port, which the test's address
	// stands in for.
	pf := regexp.MustCompile(`port-forward service/paymentsd (\d+):(\d+)`).FindStringSubmatch(portForward)
	if pf == nil || !strings.Contains(portForward, "-n payments-live") {
		t.Fatalf("runbook port-forward %q: want kubectl -n payments-live port-forward service/paymentsd LOCAL:REMOTE", portForward)
	}
	var remote int32
	fmt.Sscanf(pf[2], "%d", &remote)
	cliEnv := []string{}
	for k, v := range exports {
		v = strings.ReplaceAll(v, "$USER", user)
		v = strings.ReplaceAll(v, "payments-live", ns)
		switch {
		case k == "PAYMENTS_CLI_ADDR":
			if v != "localhost:"+pf[1] {
				t.Errorf("runbook %s=%s, want the port-forward's localhost:%s", k, v, pf[1])
			}
			v = podAddr(remote)
		case strings.HasSuffix(k, "_FILE"):
			v = filepath.Join(work, v)
		}
		cliEnv = append(cliEnv, k+"="+v)
	}
	runCLI := func(stdin string, args ...string) cliResult {
		t.Helper()
		var out, errb bytes.Buffer
		err := cli.Run(t.Context(), args, cliEnv, strings.NewReader(stdin), &out, &errb)
		res := cliResult{stdout: out.String(), stderr: errb.String()}
		if err != nil {
			res.code = cli.ExitCode(err)
			res.stderr += "paymentsd: " + err.Error() + "\n"
		}
		return res
	}

	// The runbook, as written: each command, in order, with KEY the first
	// payment listed in doubt, and yes to resolve's question.
	var key string
	saw := map[string]bool{}
	for _, cmd := range commands {
		args := slices.Clone(cmd)
		for i, a := range args {
			if a == "KEY" {
				args[i] = key
			}
			args[i] = strings.ReplaceAll(args[i], "yesterday.csv", filepath.Join(work, "yesterday.csv"))
		}
		res := runCLI("y\n", args...)
		if res.code != 0 {
			t.Fatalf("runbook: paymentsd payments %s:\n%v", strings.Join(cmd, " "), res)
		}
		saw[args[0]] = true
		if args[0] == "list" && key == "" {
			for _, k := range []string{"k-doubt-1", "k-doubt-2"} {
				if !strings.Contains(res.stdout, k) {
					t.Fatalf("runbook list:\n%v\nwant both payments in doubt", res)
				}
			}
			key = "k-doubt-1"
		}
	}
	for _, want := range []string{"list", "resolve", "export"} {
		if !saw[want] {
			t.Errorf("the runbook has no 'paymentsd payments %s'", want)
		}
	}

	// The audit names the person.
	res := runCLI("", "get", key, "-o", "json")
	got := jsonLines[paymentsv1.GetMultiCardPaymentResponse](t, res.stdout)
	if res.code != 0 || len(got) != 1 || got[0].GetState() != paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED ||
		len(got[0].GetAuditEntries()) != 1 || got[0].GetAuditEntries()[0].GetActor() != person {
		t.Errorf("get %s after the runbook:\n%v\nwant SUCCEEDED, one audit entry by %s", key, res, person)
	}
	// Yesterday's export holds yesterday's payment and nothing of today.
	if f, err := os.Open(filepath.Join(work, "yesterday.csv")); err != nil {
		t.Errorf("the runbook's export wrote no file: %v", err)
	} else {
		rows, err := csv.NewReader(f).ReadAll()
		f.Close()
		if !time.Now().UTC().Truncate(24 * time.Hour).Equal(today) {
			t.Skip("the day changed (UTC) while the test ran")
		}
		key := slices.Index(cli.ExportColumns, "idempotency_key")
		if err != nil || len(rows) != 3 || rows[1][key] != "k-yesterday" || rows[2][key] != "k-yesterday-other" {
			t.Errorf("yesterday.csv = %q, %v; want the header, k-yesterday and k-yesterday-other: every caller's", rows, err)
		}
	}

	// Refused: no certificate; a service's SVID (it may pay, it is no
	// admin); a person who is not on call.
	svcCert, svcKey := trustDomain.svid(t, caller)
	strangerCert, strangerKey, _ := trustDomain.issueLeaf(t, &x509.Certificate{
		URIs: []*url.URL{mustURL(t, stranger)}, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(8 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	// The same person, on call in the other environment: the policy
	// payments-people issues a certificate naming the request's namespace,
	// so theirs from there names another identity.
	other := map[string]string{"sandbox": "live", "live": "sandbox"}[env]
	elsewhere := strings.Replace(person, "/ns/"+ns+"/", "/ns/payments-"+other+"/", 1)
	if elsewhere == person {
		t.Errorf("the person's identity %s names no environment: the same certificate would be an admin in both", person)
	}
	elsewhereCert, elsewhereKey, _ := trustDomain.issueLeaf(t, &x509.Certificate{
		URIs: []*url.URL{mustURL(t, elsewhere)}, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(8 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	for name, b := range map[string][]byte{"svc.crt": svcCert, "svc.key": svcKey, "stranger.crt": strangerCert, "stranger.key": strangerKey,
		"elsewhere.crt": elsewhereCert, "elsewhere.key": elsewhereKey} {
		os.WriteFile(filepath.Join(work, name), b, 0o600)
	}
	as := func(cert, key string) []string {
		return []string{"--tls-cert", filepath.Join(work, cert), "--tls-key", filepath.Join(work, key)}
	}
	for _, tt := range []struct {
		who  string
		args []string
		want int
	}{
		{"no certificate", []string{"list", "--in-doubt", "--tls-cert", "", "--tls-key", ""}, cli.ExitDenied},
		{"a service's SVID, resolving", append([]string{"resolve", "k-doubt-2", "--outcome", "not-created", "--evidence", "x", "--yes"}, as("svc.crt", "svc.key")...), cli.ExitDenied},
		{"a service's SVID, listing another's", append([]string{"list", "--in-doubt", "--caller", reader}, as("svc.crt", "svc.key")...), cli.ExitDenied},
		{"a person not on call", append([]string{"list", "--in-doubt"}, as("stranger.crt", "stranger.key")...), cli.ExitDenied},
		{"the person, with the other environment's certificate", append([]string{"list", "--in-doubt"}, as("elsewhere.crt", "elsewhere.key")...), cli.ExitDenied},
	} {
		if res := runCLI("", tt.args...); res.code != tt.want || strings.Contains(res.stdout, "k-doubt") {
			t.Errorf("%s: paymentsd payments %s:\n%v\nwant exit %d and no payment shown", tt.who, strings.Join(tt.args, " "), res, tt.want)
		}
	}
	// A service exports its own payments, and nobody else's.
	if res := runCLI("", append([]string{"export", "--from", "yesterday", "--to", "yesterday", "--format", "jsonl"}, as("svc.crt", "svc.key")...)...); res.code != 0 ||
		!strings.Contains(res.stdout, `"k-yesterday"`) || strings.Contains(res.stdout, "k-yesterday-other") {
		t.Errorf("a service's SVID exporting yesterday:\n%v\nwant exit 0, its own k-yesterday, and not another caller's", res)
	}
	if res := runCLI("", "get", "k-doubt-2", "-o", "json"); !strings.Contains(res.stdout, "OUTCOME_UNKNOWN") {
		t.Errorf("k-doubt-2 after the refusals:\n%v\nwant it still in doubt", res)
	}

	// Provider events: the reader reads them; the paying service does not.
	roots := x509.NewCertPool()
	roots.AddCert(trustDomain.cert)
	for id, want := range map[string]codes.Code{reader: codes.OK, caller: codes.PermissionDenied} {
		cp, kp := trustDomain.svid(t, id)
		pair, err := tls.X509KeyPair(cp, kp)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(podAddr(remote), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs: roots, Certificates: []tls.Certificate{pair}, ServerName: "paymentsd." + ns + ".svc", MinVersion: tls.VersionTLS12,
		})))
		if err != nil {
			t.Fatal(err)
		}
		_, err = paymentsv1.NewProviderEventsServiceClient(conn).ListProviderEvents(t.Context(), &paymentsv1.ListProviderEventsRequest{})
		conn.Close()
		if status.Code(err) != want {
			t.Errorf("ListProviderEvents as %s = %v, want %v", id, err, want)
		}
	}

	// The runbooks' other steps: probes answered with the health port
	// held, a watch ending with its certificate, and the trust domain's CA
	// replaced (last: it changes the CA).
	pod.holdHealthPort(t)
	pod.expiringWatch(t)
	pod.walkCARotation(t)
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
