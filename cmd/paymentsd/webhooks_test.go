package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// webhookToken and otherToken are webhook URL tokens; the SENTINEL makes
// any leak easy to find.
const (
	webhookToken = "whk_SENTINEL_4f1d0c9a7e3b2d6f8a0c1e5b7d9f"
	otherToken   = "whk_SENTINEL_rotated_0a9b8c7d6e5f4a3b2c1d0e"
)

// webhookEnv is a sandbox deployment with the intake on a loopback port.
func webhookEnv(t *testing.T) map[string]string {
	return with(sandboxEnv(fakeProvider(t, "sandbox")),
		"PAYMENTS_WEBHOOK_ADDR", "127.0.0.1:0",
		"PAYMENTS_SANDBOX_WEBHOOK_TOKEN", webhookToken,
	)
}

// deliver posts body to url and returns the status and reply body.
func deliver(t *testing.T, client *http.Client, url, contentType string, body []byte) (int, []byte) {
	t.Helper()
	resp, err := client.Post(url, contentType, bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST webhook: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func get(t *testing.T, client *http.Client, url string) (int, []byte) {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestWebhookInboxEndToEnd delivers through the whole program and reads the
// event back over gRPC and REST; checks that the two kinds of port serve
// nothing of each other's; and that the token is in no output.
func TestWebhookInboxEndToEnd(t *testing.T) {
	t.Parallel()
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	// --simulate, where every caller may read events: who may, in a real
	// deployment, is TestEventsOnlyForReaders'.
	in := startWith(t, webhookEnv(t), tp, "--simulate")
	if in.webhookAddr == "" {
		t.Fatal("serving line has no webhook_addr")
	}
	hookURL := "http://" + in.webhookAddr + "/webhooks/" + webhookToken
	body := []byte("\x00\x01binary\xff\xfe{not json")
	const contentType = "application/vnd.provider+octets; x=1"
	if status, reply := deliver(t, in.http, hookURL, contentType, body); status != http.StatusOK {
		t.Fatalf("delivery = %d %s, want 200", status, reply)
	}

	events := paymentsv1.NewProviderEventsServiceClient(in.conn)
	list, err := events.ListProviderEvents(t.Context(), &paymentsv1.ListProviderEventsRequest{})
	if err != nil {
		t.Fatalf("ListProviderEvents() = %v", err)
	}
	if len(list.GetEvents()) != 1 {
		t.Fatalf("ListProviderEvents() = %d events, want 1", len(list.GetEvents()))
	}
	e := list.GetEvents()[0]
	if !bytes.Equal(e.GetBody(), body) || e.GetContentType() != contentType || e.GetVerified() ||
		e.GetEnvironment() != paymentsv1.Environment_ENVIRONMENT_SANDBOX || e.GetSequence() != 1 {
		t.Errorf("ListProviderEvents() event = %v, want the delivery as sent, unverified, sandbox, sequence 1", e)
	}

	status, raw := get(t, in.http, "http://"+in.httpAddr+"/v1/provider-events?pageSize=5")
	var rest struct {
		Events []struct {
			Body        string `json:"body"`
			ContentType string `json:"contentType"`
		} `json:"events"`
	}
	if status != http.StatusOK || json.Unmarshal(raw, &rest) != nil || len(rest.Events) != 1 {
		t.Fatalf("GET /v1/provider-events = %d %s, want 200 with 1 event", status, raw)
	}
	if got, _ := base64.StdEncoding.DecodeString(rest.Events[0].Body); !bytes.Equal(got, body) || rest.Events[0].ContentType != contentType {
		t.Errorf("REST event body, content type = %q, %q; want %q, %q", got, rest.Events[0].ContentType, body, contentType)
	}
	// As the docs write it: empty values mean the defaults.
	if status, raw := get(t, in.http, "http://"+in.httpAddr+"/v1/provider-events?afterSequence=&pageSize="); status != http.StatusOK || !bytes.Contains(raw, []byte(`"events"`)) {
		t.Errorf("GET /v1/provider-events?afterSequence=&pageSize= = %d %s, want 200 as with no parameters", status, raw)
	}

	t.Run("PortSeparation", func(t *testing.T) {
		for _, path := range []string{"/healthz", "/readyz", "/metrics", "/openapi.json", "/v1/provider-events", "/v1/multi-card-payments"} {
			if status, _ := get(t, in.http, "http://"+in.webhookAddr+path); status != http.StatusNotFound {
				t.Errorf("webhook port GET %s = %d, want 404", path, status)
			}
		}
		if status, _ := deliver(t, in.http, "http://"+in.webhookAddr+"/v1/multi-card-payments", "application/json", []byte(validBody("k-hook-port"))); status != http.StatusNotFound {
			t.Errorf("webhook port POST /v1/multi-card-payments = %d, want 404", status)
		}
		if status, _ := deliver(t, in.http, "http://"+in.httpAddr+"/webhooks/"+webhookToken, "text/plain", []byte("x")); status != http.StatusNotFound {
			t.Errorf("internal HTTP port POST /webhooks/{token} = %d, want 404", status)
		}
		if n := len(mustList(t, events)); n != 1 {
			t.Errorf("%d events stored after the wrong-port requests, want 1", n)
		}
	})

	t.Run("Refusals", func(t *testing.T) {
		wrong := "http://" + in.webhookAddr + "/webhooks/" + otherToken
		if status, reply := deliver(t, in.http, wrong, "text/plain", []byte("x")); status != http.StatusNotFound || bytes.Contains(reply, []byte("SENTINEL")) {
			t.Errorf("wrong token = %d %q, want 404 naming no token", status, reply)
		}
		if status, reply := get(t, in.http, hookURL); status != http.StatusMethodNotAllowed || bytes.Contains(reply, []byte("SENTINEL")) {
			t.Errorf("GET with the token = %d %q, want 405 naming no token", status, reply)
		}
		big := bytes.Repeat([]byte("x"), 256<<10+1)
		if status, _ := deliver(t, in.http, hookURL, "text/plain", big); status != http.StatusRequestEntityTooLarge {
			t.Errorf("256 KiB + 1 = %d, want 413", status)
		}
		if n := len(mustList(t, events)); n != 1 {
			t.Errorf("%d events stored after refusals, want 1", n)
		}
	})

	t.Run("NoTokenInOutput", func(t *testing.T) {
		families, text := scrape(t, in)
		if v, _ := sample(families, "paymentsd_webhook_deliveries_total", map[string]string{"outcome": "stored", "environment": "sandbox"}); v != 1 {
			t.Errorf("paymentsd_webhook_deliveries_total{outcome=stored} = %v, want 1", v)
		}
		for _, s := range []string{webhookToken, otherToken, "SENTINEL"} {
			if strings.Contains(text, s) {
				t.Errorf("/metrics contains %q", s)
			}
			if strings.Contains(in.logs.String(), s) {
				t.Errorf("logs contain %q", s)
			}
		}
		if !strings.Contains(in.logs.String(), `"path":"/webhooks/[REDACTED]"`) {
			t.Errorf("no webhook access line with the redacted path:\n%s", in.logs.String())
		}
		spans := exporter.GetSpans()
		if len(spans) == 0 {
			t.Error("no spans recorded")
		}
		for _, s := range spans {
			b, _ := json.Marshal(s.Attributes)
			if strings.Contains(s.Name+string(b)+s.Status.Description, "SENTINEL") {
				t.Errorf("span %q carries a token: %s", s.Name, b)
			}
		}
	})
}

func mustList(t *testing.T, c paymentsv1.ProviderEventsServiceClient) []*paymentsv1.ProviderEvent {
	t.Helper()
	resp, err := c.ListProviderEvents(t.Context(), &paymentsv1.ListProviderEventsRequest{PageSize: 1000})
	if err != nil {
		t.Fatalf("ListProviderEvents() = %v", err)
	}
	return resp.GetEvents()
}

// TestWebhookWatchAndShutdown opens a watch, delivers, receives the event,
// then stops paymentsd with the watch still open: it must stop promptly
// and end the watch with UNAVAILABLE.
func TestWebhookWatchAndShutdown(t *testing.T) {
	t.Parallel()
	// --simulate: every caller reads events (see TestEventsOnlyForReaders).
	in := start(t, with(webhookEnv(t), "PAYMENTS_SHUTDOWN_TIMEOUT", "60s"), "--simulate")
	events := paymentsv1.NewProviderEventsServiceClient(in.conn)
	stream, err := events.WatchProviderEvents(t.Context(), &paymentsv1.WatchProviderEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// The stream is open once its headers arrive (the request ID).
	if _, err := stream.Header(); err != nil {
		t.Fatalf("WatchProviderEvents Header() = %v", err)
	}
	if status, _ := deliver(t, in.http, "http://"+in.webhookAddr+"/webhooks/"+webhookToken, "text/plain", []byte("hello")); status != http.StatusOK {
		t.Fatalf("delivery = %d, want 200", status)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("Recv() = %v", err)
	}
	if string(resp.GetEvent().GetBody()) != "hello" {
		t.Errorf("watched event body = %q, want hello", resp.GetEvent().GetBody())
	}

	start := time.Now()
	if err := in.stop(); err != nil {
		t.Errorf("run() = %v, want nil", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("stopping with a watch open took %v; the shutdown timeout (60s) should not be what ends it", d)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("Recv() after shutdown = %v, want Unavailable", err)
	}
}

func TestWebhookConfigRefused(t *testing.T) {
	t.Parallel()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(webhookToken+"\n"+otherToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	short := "short_SENTINEL_abc"
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"address without token", map[string]string{"PAYMENTS_WEBHOOK_ADDR": ":0"}, "PAYMENTS_SANDBOX_WEBHOOK_TOKEN"},
		{"other environment's token only", map[string]string{"PAYMENTS_WEBHOOK_ADDR": ":0", "PAYMENTS_LIVE_WEBHOOK_TOKEN": webhookToken}, "PAYMENTS_SANDBOX_WEBHOOK_TOKEN"},
		{"short token", map[string]string{"PAYMENTS_WEBHOOK_ADDR": ":0", "PAYMENTS_SANDBOX_WEBHOOK_TOKEN": short}, "PAYMENTS_SANDBOX_WEBHOOK_TOKEN"},
		{"short second token", map[string]string{"PAYMENTS_WEBHOOK_ADDR": ":0", "PAYMENTS_SANDBOX_WEBHOOK_TOKEN": webhookToken + "," + short}, "PAYMENTS_SANDBOX_WEBHOOK_TOKEN"},
		{"three tokens", map[string]string{"PAYMENTS_WEBHOOK_ADDR": ":0", "PAYMENTS_SANDBOX_WEBHOOK_TOKEN": webhookToken + "," + otherToken + "," + webhookToken + "x"}, "PAYMENTS_SANDBOX_WEBHOOK_TOKEN"},
		{"token with a slash", map[string]string{"PAYMENTS_WEBHOOK_ADDR": ":0", "PAYMENTS_SANDBOX_WEBHOOK_TOKEN": webhookToken + "/x"}, "PAYMENTS_SANDBOX_WEBHOOK_TOKEN"},
		{"token and file", map[string]string{"PAYMENTS_WEBHOOK_ADDR": ":0", "PAYMENTS_SANDBOX_WEBHOOK_TOKEN": webhookToken, "PAYMENTS_SANDBOX_WEBHOOK_TOKEN_FILE": tokenFile}, "PAYMENTS_SANDBOX_WEBHOOK_TOKEN_FILE"},
		{"missing file", map[string]string{"PAYMENTS_WEBHOOK_ADDR": ":0", "PAYMENTS_SANDBOX_WEBHOOK_TOKEN_FILE": tokenFile + ".missing"}, "PAYMENTS_SANDBOX_WEBHOOK_TOKEN_FILE"},
		{"max bytes", map[string]string{"PAYMENTS_WEBHOOK_MAX_BYTES": "12"}, "PAYMENTS_WEBHOOK_MAX_BYTES"},
		// Every event must fit a page, and two each for 64 watches the
		// memory budget.
		{"max bytes over the cap", map[string]string{"PAYMENTS_WEBHOOK_MAX_BYTES": "16777216"}, "PAYMENTS_WEBHOOK_MAX_BYTES"},
		{"quota", map[string]string{"PAYMENTS_WEBHOOK_MAX_STORED_BYTES": "1GiB"}, "PAYMENTS_WEBHOOK_MAX_STORED_BYTES"},
		{"connections per address", map[string]string{"PAYMENTS_WEBHOOK_MAX_CONNECTIONS_PER_IP": "-1"}, "PAYMENTS_WEBHOOK_MAX_CONNECTIONS_PER_IP"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := with(map[string]string{
				"PAYMENTS_SANDBOX_BASE_URL": "http://127.0.0.1:1/v1",
				"PAYMENTS_SANDBOX_API_KEY":  sandboxKey,
			})
			for k, v := range tt.env {
				env[k] = v
			}
			var stderr bytes.Buffer
			err := run(t.Context(), []string{"paymentsd"}, envList(env), io.Discard, &stderr)
			if err == nil {
				t.Fatalf("run() = nil, want a refusal naming %s", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run() = %v, want it to name %s", err, tt.want)
			}
			if out := err.Error() + stderr.String(); strings.Contains(out, "SENTINEL") {
				t.Errorf("refusal contains a token: %s", out)
			}
		})
	}

	// The file may hold two tokens for rotation; both are accepted.
	in := start(t, with(sandboxEnv(fakeProvider(t, "sandbox")),
		"PAYMENTS_WEBHOOK_ADDR", "127.0.0.1:0",
		"PAYMENTS_SANDBOX_WEBHOOK_TOKEN_FILE", tokenFile))
	for _, tok := range []string{webhookToken, otherToken} {
		if status, _ := deliver(t, in.http, "http://"+in.webhookAddr+"/webhooks/"+tok, "text/plain", []byte("r")); status != http.StatusOK {
			t.Errorf("delivery with a token from the file = %d, want 200", status)
		}
	}
	if strings.Contains(in.logs.String(), "SENTINEL") {
		t.Errorf("logs contain a token")
	}
}

// TestWebhookSurvivesSIGKILL acknowledges a delivery, is killed with
// SIGKILL at once, and finds the delivery after a restart on the same
// database: a 2xx means committed.
func TestWebhookSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and kills the binary")
	}
	env := with(webhookEnv(t), "PAYMENTS_DATABASE_URL", "sqlite:"+filepath.Join(t.TempDir(), "inbox.db"))
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)

	// --simulate: every caller reads events (see TestEventsOnlyForReaders).
	first := startProcessArgs(t, env, "--simulate")
	body := []byte("durable \x00 delivery")
	if status, _ := deliver(t, client, "http://"+first.webhookAddr+"/webhooks/"+webhookToken, "application/octet-stream", body); status != http.StatusOK {
		t.Fatalf("delivery = %d, want 200", status)
	}
	first.cmd.Process.Kill()
	first.cmd.Wait()

	second := startProcessArgs(t, env, "--simulate")
	conn, err := grpc.NewClient(second.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got := mustList(t, paymentsv1.NewProviderEventsServiceClient(conn))
	if len(got) != 1 || !bytes.Equal(got[0].GetBody(), body) {
		t.Fatalf("after SIGKILL and restart, events = %v, want the acknowledged delivery", got)
	}
}

// TestWebhookTLSNeedsNoClientCertificate: with mTLS required on the
// internal ports, the webhook port serves TLS with the same certificate
// and takes deliveries from a sender without one, as the provider is.
func TestWebhookTLSNeedsNoClientCertificate(t *testing.T) {
	t.Parallel()
	serverCA, clientCA := newTestCA(t, "server CA"), newTestCA(t, "client CA")
	certFile, keyFile := writePEMFiles(t, serverCA.issue(t, x509.ExtKeyUsageServerAuth))
	clientCAFile := filepath.Join(t.TempDir(), "client-ca.pem")
	if err := os.WriteFile(clientCAFile, clientCA.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	in := start(t, with(webhookEnv(t),
		"PAYMENTS_TLS_CERT_FILE", certFile,
		"PAYMENTS_TLS_KEY_FILE", keyFile,
		"PAYMENTS_TLS_CLIENT_CA_FILE", clientCAFile))
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: serverCA.pool, MinVersion: tls.VersionTLS12}}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}
	if status, reply := deliver(t, client, "https://"+in.webhookAddr+"/webhooks/"+webhookToken, "text/plain", []byte("tls")); status != http.StatusOK {
		t.Errorf("delivery over TLS without a client certificate = %d %s, want 200", status, reply)
	}
	// The internal HTTP port still wants one.
	if resp, err := client.Get("https://" + in.httpAddr + "/healthz"); err == nil {
		resp.Body.Close()
		t.Errorf("internal HTTP port without a client certificate = %d, want a TLS failure", resp.StatusCode)
	}
}
