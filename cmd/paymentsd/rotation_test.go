package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/upstream"
)

// nextSandboxKey is the key a rotation moves to.
const nextSandboxKey = "sk_sandbox_SENTINEL_next_5e8d21"

// secretVolume is a directory laid out as the kubelet lays out a mounted
// Secret: name -> ..data/name, ..data -> a timestamped directory. update
// swaps ..data atomically to a new directory, so the file's path never
// changes, and neither does the inode of the symlink paymentsd opens.
type secretVolume struct {
	dir, name string
	n         int
}

func newSecretVolume(t *testing.T, name, contents string) *secretVolume {
	t.Helper()
	v := &secretVolume{dir: t.TempDir(), name: name}
	v.update(t, contents)
	if err := os.Symlink(filepath.Join("..data", name), filepath.Join(v.dir, name)); err != nil {
		t.Fatal(err)
	}
	return v
}

func (v *secretVolume) path() string { return filepath.Join(v.dir, v.name) }

func (v *secretVolume) update(t *testing.T, contents string) {
	t.Helper()
	v.n++
	ts := fmt.Sprintf("..2026_11_24_00_00_%02d.%d", v.n, v.n)
	if err := os.Mkdir(filepath.Join(v.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(v.dir, ts, v.name), []byte(contents), 0o400); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// waitLines waits until at least n lines with msg have been logged, and
// returns them.
func (l *logBuffer) waitLines(t *testing.T, msg string, n int) []map[string]any {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		l.mu.Lock()
		changed := l.changed
		l.mu.Unlock()
		if lines := l.lines(msg); len(lines) >= n {
			return lines
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("paymentsd did not log %d %q lines in time; logs:\n%s", n, msg, l.String())
		}
	}
}

// progress counts events and lets a test wait for a number of them.
type progress struct {
	mu      sync.Mutex
	n       int
	changed chan struct{}
}

func newProgress() *progress { return &progress{changed: make(chan struct{})} }

func (p *progress) add() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *progress) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// waitFor waits until the count reaches n.
func (p *progress) waitFor(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		p.mu.Lock()
		got, changed := p.n, p.changed
		p.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("only %d calls made in time, want %d", got, n)
		}
	}
}

// keyInUse returns the value of paymentsd_provider_api_key_in_use for
// each fingerprint it shows.
func keyInUse(t *testing.T, in *instance) map[string]float64 {
	t.Helper()
	families, _ := scrape(t, in)
	out := map[string]float64{}
	for _, m := range families["paymentsd_provider_api_key_in_use"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "fingerprint" {
				out[l.GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

func checkKeyInUse(t *testing.T, in *instance, step string, want map[string]float64) {
	t.Helper()
	got := keyInUse(t, in)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s: paymentsd_provider_api_key_in_use = %v, want %v", step, got, want)
	}
}

// checkNoSecrets fails if the logs or /metrics hold any of secrets in any
// form holdsKey reads.
func checkNoSecrets(t *testing.T, in *instance, secrets ...string) {
	t.Helper()
	_, metrics := scrape(t, in)
	for _, s := range secrets {
		for name, out := range map[string]string{"logs": in.logs.String(), "/metrics": metrics} {
			if holdsKey(out, s) {
				t.Errorf("%s hold a secret (%d bytes)", name, len(s))
			}
		}
	}
}

// TestKeyRotationUnderLoad is docs/operations.md's rotation procedure, step by
// step, with callers paying all the while: the next key is added to the
// key file as line 2, the old key is revoked at the provider, and the old
// line is removed. No call fails, no payment is made twice, and the
// fingerprint metric follows the key in use.
func TestKeyRotationUnderLoad(t *testing.T) {
	t.Parallel()
	p := simulator.NewServer()
	t.Cleanup(p.Close)
	p.KeepRequests(false)
	p.AllowKey(sandboxKey)
	p.AllowKey(nextSandboxKey) // issued in the dashboard, not yet in use
	vol := newSecretVolume(t, "api-key", sandboxKey+"\n")
	in := start(t, map[string]string{
		"PAYMENTS_SANDBOX_BASE_URL":       p.URL,
		"PAYMENTS_SANDBOX_API_KEY_FILE":   vol.path(),
		"PAYMENTS_SECRET_RELOAD_INTERVAL": "20ms",
		"PAYMENTS_LOG_LEVEL":              "warn",
		// One failure would open the breaker: the revoked key's 403s
		// must not count as one.
		"PAYMENTS_UPSTREAM_BREAKER_FAILURES": "1",
	})
	oldFP, newFP := upstream.Fingerprint(sandboxKey), upstream.Fingerprint(nextSandboxKey)
	if cfg, _ := in.logs.lines("starting")[0]["config"].(map[string]any); cfg["api_key_in_use"] != oldFP || fmt.Sprint(cfg["api_keys"]) != fmt.Sprint([]any{oldFP}) {
		t.Fatalf("starting line config = %v, want api_key_in_use %s and api_keys [%s]", cfg, oldFP, oldFP)
	}
	checkKeyInUse(t, in, "at start", map[string]float64{oldFP: 1})

	const callers = 8
	calls := newProgress()
	var failures atomic.Int64
	var firstFailure atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest(fmt.Sprintf("k-rot-%d-%d", g, i))); err != nil {
					failures.Add(1)
					firstFailure.CompareAndSwap(nil, err.Error())
				}
				calls.add()
			}
		})
	}
	stopCallers := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopCallers)

	// Step 1: the next key joins the file as line 2.
	calls.waitFor(t, 50)
	vol.update(t, sandboxKey+"\n"+nextSandboxKey+"\n")
	reload := in.logs.waitLines(t, "secret file reloaded", 1)[0]
	if reload["api_key_in_use"] != oldFP || fmt.Sprint(reload["api_keys"]) != fmt.Sprint([]any{oldFP, newFP}) {
		t.Errorf("reload line = %v, want keys [%s %s] with %s in use", reload, oldFP, newFP, oldFP)
	}
	checkKeyInUse(t, in, "after adding the next key", map[string]float64{oldFP: 1, newFP: 0})

	// Step 2: the new key is made current in the dashboard and the old
	// one revoked: the next call refused with it switches.
	atRevoke := calls.count()
	p.ForbidKey(sandboxKey)
	switched := in.logs.waitLines(t, "provider API key switched: the provider refused the key in use (401 or 403) and accepted the other", 1)
	if switched[0]["api_key_in_use"] != newFP || switched[0]["api_key_refused"] != oldFP {
		t.Errorf("switch line = %v, want %s in use and %s refused", switched[0], newFP, oldFP)
	}
	checkKeyInUse(t, in, "after revoking the old key", map[string]float64{oldFP: 0, newFP: 1})
	calls.waitFor(t, atRevoke+100)

	// Step 3: the old line is removed.
	vol.update(t, nextSandboxKey+"\n")
	in.logs.waitLines(t, "secret file reloaded", 2)
	checkKeyInUse(t, in, "after removing the old key", map[string]float64{newFP: 1})
	atEnd := calls.count()
	calls.waitFor(t, atEnd+50)
	stopCallers()

	total := calls.count()
	if n := failures.Load(); n != 0 {
		t.Errorf("%d of %d calls failed during the rotation; first: %v", n, total, firstFailure.Load())
	}
	charged, resent := 0, 0
	for k, ks := range p.AllKeyStats() {
		if ks.Charges != 1 {
			t.Errorf("idempotency key %s charged %d times, want 1", k, ks.Charges)
		}
		charged++
		if ks.Requests == 1 {
			continue
		}
		// Refused with the old key, re-sent with the new: the record
		// counts both requests and keeps the second's answer.
		resent++
		rec, err := in.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: k})
		if err != nil || rec.GetAttempts() != int32(ks.Requests) || rec.GetProviderHttpStatus() != http.StatusOK {
			t.Errorf("GetMultiCardPayment(%s) = attempts %d, provider status %d, %v; want %d attempts, 200", k, rec.GetAttempts(), rec.GetProviderHttpStatus(), err, ks.Requests)
		}
	}
	if charged != total {
		t.Errorf("%d keys charged, want one per call (%d)", charged, total)
	}
	families, _ := scrape(t, in)
	refused, _ := sample(families, "paymentsd_provider_requests_total", map[string]string{"outcome": "403"})
	if refused < 1 || resent != int(refused) {
		t.Errorf("%v requests refused with the revoked key, %d idempotency keys sent twice; want at least one, and the same number", refused, resent)
	}
	if v, _ := sample(families, "paymentsd_provider_requests_total", map[string]string{"outcome": "circuit_open"}); v != 0 {
		t.Errorf("%v calls refused by an open circuit breaker, want 0", v)
	}
	if n := len(in.logs.lines("provider API key switched: the provider refused the key in use (401 or 403) and accepted the other")); n != 1 {
		t.Errorf("%d switch lines, want 1", n)
	}
	t.Logf("%d callers, %d calls: %d before the revocation, %d between it and the old key's removal, %d after; %d refused with the old key and re-sent with the new; %d failures; every idempotency key charged once",
		callers, total, atRevoke, atEnd-atRevoke, total-atEnd, int(refused), failures.Load())
	checkNoSecrets(t, in, sandboxKey, nextSandboxKey)
}

// TestKeyFileBroken: a key file that becomes unreadable, empty or
// malformed keeps the last good key in use, says so once per problem in
// the log (naming the variable, never the contents) and in
// paymentsd_secret_file_ok; restoring it recovers.
func TestKeyFileBroken(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	path := filepath.Join(t.TempDir(), "api-key")
	if err := os.WriteFile(path, []byte(sandboxKey), 0o600); err != nil {
		t.Fatal(err)
	}
	in := start(t, map[string]string{
		"PAYMENTS_SANDBOX_BASE_URL":       p.URL,
		"PAYMENTS_SANDBOX_API_KEY_FILE":   path,
		"PAYMENTS_SECRET_RELOAD_INTERVAL": "20ms",
	})
	fileOK := func() float64 {
		families, _ := scrape(t, in)
		v, ok := sample(families, "paymentsd_secret_file_ok", map[string]string{"secret": "provider_api_key"})
		if !ok {
			t.Fatal("no paymentsd_secret_file_ok{secret=provider_api_key}")
		}
		return v
	}
	reloads := func(result string) float64 {
		families, _ := scrape(t, in)
		v, _ := sample(families, "paymentsd_secret_reloads_total", map[string]string{"secret": "provider_api_key", "result": result})
		return v
	}
	pay := func(step, key string) {
		t.Helper()
		if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest(key)); err != nil {
			t.Errorf("%s: CreateMultiCardPayment = %v, want OK with the last good key", step, err)
		}
	}
	if fileOK() != 1 {
		t.Fatalf("paymentsd_secret_file_ok = 0 at start")
	}

	const warning = "secret file not reloaded: the last good secrets stay in use until it is fixed"
	// Each step changes the file at once (a rename, a removal, a mkdir),
	// so that the poller never sees a state between two steps.
	writeAtomic := func(b string) {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name   string
		breaks func()
		result string
	}{
		{"empty", func() { writeAtomic("\uFEFF \n\n") }, "invalid"},
		// Garbage holding the key: the warning must not quote it.
		{"three lines", func() { writeAtomic(sandboxKey + "\nx\ny\n") }, "invalid"},
		{"a key with a space", func() { writeAtomic("sk " + sandboxKey + "\n") }, "invalid"},
		{"deleted", func() { os.Remove(path) }, "unreadable"},
		{"replaced by a directory", func() { os.Mkdir(path, 0o755) }, "unreadable"},
	}
	counts := map[string]float64{}
	for i, step := range steps {
		step.breaks()
		line := in.logs.waitLines(t, warning, i+1)[i]
		counts[step.result]++
		if line["variable"] != "PAYMENTS_SANDBOX_API_KEY_FILE" || line["result"] != step.result || line["level"] != "WARN" {
			t.Errorf("%s: warning = %v, want variable PAYMENTS_SANDBOX_API_KEY_FILE, result %s, level WARN", step.name, line, step.result)
		}
		if got := fileOK(); got != 0 {
			t.Errorf("%s: paymentsd_secret_file_ok = %v, want 0", step.name, got)
		}
		if got := reloads(step.result); got != counts[step.result] {
			t.Errorf("%s: reloads{%s} = %v, want %v", step.name, step.result, got, counts[step.result])
		}
		pay(step.name, fmt.Sprintf("k-broken-%d", i))
	}
	// A problem is reported once, not at every poll that sees it.
	if n := len(in.logs.lines(warning)); n != len(steps) {
		t.Errorf("%d warnings, want one per problem (%d)", n, len(steps))
	}

	// Restored: good again, with the same key.
	os.Remove(path)
	writeAtomic(sandboxKey + "\n")
	in.logs.waitLines(t, "secret file good again, unchanged", 1)
	if got := fileOK(); got != 1 {
		t.Errorf("after restoring: paymentsd_secret_file_ok = %v, want 1", got)
	}
	pay("restored", "k-restored")
	checkNoSecrets(t, in, sandboxKey)
}

// TestWebhookTokenRotation: the token file is re-read without a restart:
// a token added as line 2 is accepted once reloaded, and the old one is
// refused once removed.
func TestWebhookTokenRotation(t *testing.T) {
	t.Parallel()
	vol := newSecretVolume(t, "webhook-token", webhookToken+"\n")
	in := start(t, with(sandboxEnv(fakeProvider(t, "sandbox")),
		"PAYMENTS_WEBHOOK_ADDR", "127.0.0.1:0",
		"PAYMENTS_SANDBOX_WEBHOOK_TOKEN_FILE", vol.path(),
		"PAYMENTS_SECRET_RELOAD_INTERVAL", "20ms",
	))
	url := func(tok string) string { return "http://" + in.webhookAddr + "/webhooks/" + tok }
	check := func(step, tok, which string, want int) {
		t.Helper()
		if status, _ := deliver(t, in.http, url(tok), "application/json", []byte(`{"step":"`+step+`"}`)); status != want {
			t.Errorf("%s: delivery with the %s token = %d, want %d", step, which, status, want)
		}
	}
	check("start", webhookToken, "old", http.StatusOK)
	check("start", otherToken, "new", http.StatusNotFound)

	vol.update(t, webhookToken+"\n"+otherToken+"\n")
	line := in.logs.waitLines(t, "secret file reloaded", 1)[0]
	if want := fmt.Sprint([]any{upstream.Fingerprint(webhookToken), upstream.Fingerprint(otherToken)}); line["secret"] != "webhook_tokens" || fmt.Sprint(line["webhook_tokens"]) != want {
		t.Errorf("reload line = %v, want webhook_tokens %s", line, want)
	}
	check("both", webhookToken, "old", http.StatusOK)
	check("both", otherToken, "new", http.StatusOK)

	vol.update(t, otherToken+"\n")
	in.logs.waitLines(t, "secret file reloaded", 2)
	check("new only", webhookToken, "old", http.StatusNotFound)
	check("new only", otherToken, "new", http.StatusOK)

	families, _ := scrape(t, in)
	if v, _ := sample(families, "paymentsd_secret_reloads_total", map[string]string{"secret": "webhook_tokens", "result": "ok"}); v != 2 {
		t.Errorf("reloads{webhook_tokens, ok} = %v, want 2", v)
	}
	if v, _ := sample(families, "paymentsd_webhook_deliveries_total", map[string]string{"outcome": "stored", "token": "first"}); v < 3 {
		t.Errorf("stored deliveries with the first token = %v, want at least 3", v)
	}
	checkNoSecrets(t, in, webhookToken, otherToken)
	if strings.Contains(in.logs.String(), otherToken) {
		t.Errorf("logs hold the new token")
	}
}
