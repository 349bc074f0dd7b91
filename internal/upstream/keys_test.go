package upstream_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/upstream"
)

const (
	oldKey = "sk_test_old_0123456789abcdef"
	newKey = "sk_test_new_fedcba9876543210"
)

func TestFingerprint(t *testing.T) {
	t.Parallel()
	// printf %s sk_test_old_0123456789abcdef | sha256sum | cut -c1-8
	if got, want := upstream.Fingerprint(oldKey), "dac49d37"; got != want {
		t.Fatalf("Fingerprint(%q) = %q, want %q", oldKey, got, want)
	}
	got := upstream.Fingerprint(oldKey)
	if bytes.Contains([]byte(oldKey), []byte(got)) {
		t.Fatalf("Fingerprint(%q) = %q is part of the key", oldKey, got)
	}
}

func TestNewKeys(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		key    string
		keys   []string
		wantOK bool
	}{
		{"one key", "", []string{oldKey}, true},
		{"two keys", "", []string{oldKey, newKey}, true},
		{"three keys", "", []string{oldKey, newKey, "sk_third"}, false},
		{"the same key twice", "", []string{oldKey, oldKey}, false},
		{"an empty key", "", []string{oldKey, ""}, false},
		{"none", "", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(t, "http://127.0.0.1:1/v1")
			cfg.APIKey, cfg.APIKeys = tt.key, tt.keys
			_, err := upstream.New(cfg)
			if (err == nil) != tt.wantOK {
				t.Fatalf("New(%d keys) error = %v, want ok %v", len(tt.keys), err, tt.wantOK)
			}
			for _, k := range tt.keys {
				if err != nil && k != "" && bytes.Contains([]byte(err.Error()), []byte(k)) {
					t.Fatalf("New error %q quotes a key", err)
				}
			}
		})
	}
}

// TestKeyRotation: a request refused 401 or 403 with the key in use is
// sent once more with the other key, which stays in use if it gets
// through; the reply counts both attempts, the fake charges once, and a
// refused key never opens the breaker.
func TestKeyRotation(t *testing.T) {
	t.Parallel()
	for _, revoked := range []struct {
		name   string
		status int
		revoke func(*simulator.Server)
	}{
		{"403 revoked", http.StatusForbidden, func(s *simulator.Server) { s.ForbidKey(oldKey) }},
		{"401 unknown", http.StatusUnauthorized, func(*simulator.Server) {}},
	} {
		t.Run(revoked.name, func(t *testing.T) {
			t.Parallel()
			srv := simulator.NewServer()
			t.Cleanup(srv.Close)
			srv.AllowKey(newKey)
			revoked.revoke(srv)
			reg := prometheus.NewRegistry()
			var logs syncBuffer
			cfg := testConfig(t, srv.URL)
			cfg.APIKey, cfg.APIKeys = "", []string{oldKey, newKey}
			cfg.MaxRequests = 1 // the switch is not a retry of a failure that may pass
			cfg.BreakerFailures = 1
			cfg.Metrics = upstream.NewMetrics(reg)
			cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
			c := newClient(t, cfg)

			if got := metric(t, reg, "paymentsd_provider_api_key_in_use", "fingerprint", upstream.Fingerprint(oldKey)); got != 1 {
				t.Fatalf("key_in_use{old} = %v before any call, want 1", got)
			}
			r, err := c.CreateMultiCardPayment(t.Context(), payment("k-rot-1"))
			if err != nil {
				t.Fatalf("CreateMultiCardPayment with the old key %s: %v, want success with the new", revoked.name, err)
			}
			if r.Requests != 2 {
				t.Errorf("Reply.Requests = %d, want 2 (the refused one and the one with the new key)", r.Requests)
			}
			if ks := srv.KeyStats("k-rot-1"); ks.Charges != 1 || ks.Requests != 2 {
				t.Errorf("KeyStats = %+v, want 2 requests and 1 charge", ks)
			}
			if _, inUse := c.Keys(); inUse != upstream.Fingerprint(newKey) {
				t.Errorf("key in use %s, want the new key's %s", inUse, upstream.Fingerprint(newKey))
			}
			if got := metric(t, reg, "paymentsd_provider_api_key_in_use", "fingerprint", upstream.Fingerprint(newKey)); got != 1 {
				t.Errorf("key_in_use{new} = %v, want 1", got)
			}
			if got := metric(t, reg, "paymentsd_provider_api_key_in_use", "fingerprint", upstream.Fingerprint(oldKey)); got != 0 {
				t.Errorf("key_in_use{old} = %v, want 0", got)
			}
			// The next call goes straight to the new key, and the breaker
			// (open after one failure) was never opened by the refusal.
			r, err = c.CreateMultiCardPayment(t.Context(), payment("k-rot-2"))
			if err != nil || r.Requests != 1 {
				t.Fatalf("second CreateMultiCardPayment = %v, %v, want success in 1 attempt", r, err)
			}
			if !bytes.Contains([]byte(logs.String()), []byte(`"api_key_in_use":"`+upstream.Fingerprint(newKey)+`"`)) {
				t.Errorf("no log line names the new key's fingerprint as in use:\n%s", logs.String())
			}
			assertNoKeys(t, logs.String()+gatherText(t, reg), oldKey, newKey)
		})
	}
}

// TestKeyRotationBothRefused: with both keys refused the call fails with
// the second refusal after two attempts, says nothing was created, and
// tries no third time.
func TestKeyRotationBothRefused(t *testing.T) {
	t.Parallel()
	srv := simulator.NewServer()
	t.Cleanup(srv.Close)
	srv.ForbidKey(oldKey)
	srv.ForbidKey(newKey)
	cfg := testConfig(t, srv.URL)
	cfg.APIKey, cfg.APIKeys = "", []string{oldKey, newKey}
	cfg.BreakerFailures = 1
	c := newClient(t, cfg)
	for i := range 3 {
		_, err := c.CreateMultiCardPayment(t.Context(), payment(fmt.Sprintf("k-both-%d", i)))
		ue := callError(t, err)
		if se := statusError(t, err); se.Status != http.StatusForbidden || ue.Requests != 2 || ue.MaybeCreated || ue.AtProvider {
			t.Fatalf("call %d: status %d, %d attempts, maybe created %v, at provider %v; want 403, 2, false, false", i, se.Status, ue.Requests, ue.MaybeCreated, ue.AtProvider)
		}
	}
	if _, inUse := c.Keys(); inUse != upstream.Fingerprint(oldKey) {
		t.Errorf("key in use %s after both were refused, want the first still", inUse)
	}
}

// TestSetKeys: a new set keeps the key in use if it holds it, and makes
// the first key the key in use if not; refused sets change nothing.
func TestSetKeys(t *testing.T) {
	t.Parallel()
	srv := simulator.NewServer()
	t.Cleanup(srv.Close)
	srv.ForbidKey(oldKey)
	srv.AllowKey(newKey)
	reg := prometheus.NewRegistry()
	cfg := testConfig(t, srv.URL)
	cfg.APIKey = oldKey
	cfg.Metrics = upstream.NewMetrics(reg)
	c := newClient(t, cfg)
	if _, err := c.CreateMultiCardPayment(t.Context(), payment("k-set-1")); err == nil {
		t.Fatal("call with only the revoked key succeeded")
	}
	if err := c.SetKeys([]string{oldKey, newKey}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateMultiCardPayment(t.Context(), payment("k-set-2")); err != nil {
		t.Fatalf("call after SetKeys(old, new): %v", err)
	}
	// The new key is in use; a set with it second keeps it in use.
	third := "sk_test_third_00000000000000"
	if err := c.SetKeys([]string{third, newKey}); err != nil {
		t.Fatal(err)
	}
	loaded, inUse := c.Keys()
	if want := []string{upstream.Fingerprint(third), upstream.Fingerprint(newKey)}; !slices.Equal(loaded, want) || inUse != upstream.Fingerprint(newKey) {
		t.Errorf("Keys() = %v, %s; want %v, %s", loaded, inUse, want, upstream.Fingerprint(newKey))
	}
	if got := metric(t, reg, "paymentsd_provider_api_key_in_use", "fingerprint", upstream.Fingerprint(oldKey)); got != 0 {
		t.Errorf("the unloaded old key still has a series (%v)", got)
	}
	for _, bad := range [][]string{nil, {newKey, newKey}, {"a", "b", "c"}, {""}} {
		if err := c.SetKeys(bad); err == nil {
			t.Errorf("SetKeys(%d keys) succeeded, want an error", len(bad))
		}
	}
	if err := c.SetKeys([]string{third}); err != nil {
		t.Fatal(err)
	}
	if _, inUse := c.Keys(); inUse != upstream.Fingerprint(third) {
		t.Errorf("key in use %s after SetKeys(third), want third's", inUse)
	}
}

// TestKeyRotationConcurrent: callers racing through a revocation all get
// through, each key is charged once, and the switch is logged once.
func TestKeyRotationConcurrent(t *testing.T) {
	t.Parallel()
	srv := simulator.NewServer()
	t.Cleanup(srv.Close)
	srv.KeepRequests(false)
	srv.AllowKey(oldKey)
	srv.AllowKey(newKey)
	var logs syncBuffer
	cfg := testConfig(t, srv.URL)
	cfg.APIKey, cfg.APIKeys = "", []string{oldKey, newKey}
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	c := newClient(t, cfg)
	const callers, calls = 16, 40
	var wg sync.WaitGroup
	errs := make(chan error, callers*calls)
	for g := range callers {
		wg.Go(func() {
			for i := range calls {
				if g == 0 && i == calls/2 {
					srv.ForbidKey(oldKey)
				}
				if _, err := c.CreateMultiCardPayment(t.Context(), payment(fmt.Sprintf("k-conc-%d-%d", g, i))); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("call failed during the revocation: %v", err)
	}
	for k, ks := range srv.AllKeyStats() {
		if ks.Charges != 1 {
			t.Errorf("key %s charged %d times", k, ks.Charges)
		}
	}
	if n := bytes.Count([]byte(logs.String()), []byte("provider API key switched")); n != 1 {
		t.Errorf("%d switch lines logged, want 1", n)
	}
}

func gatherText(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for _, mf := range mfs {
		expfmt.MetricFamilyToText(&b, mf)
	}
	return b.String()
}

func assertNoKeys(t *testing.T, text string, keys ...string) {
	t.Helper()
	for _, k := range keys {
		for _, form := range []string{k, fmt.Sprintf("%x", k)} {
			if bytes.Contains([]byte(text), []byte(form)) {
				t.Errorf("output holds a key (%d bytes) in some form", len(k))
			}
		}
	}
}

// TestKeyRotationRedactsBothKeys: while two keys are loaded, neither is
// passed on from a provider reply, an error or the log, whichever key the
// request carried.
func TestKeyRotationRedactsBothKeys(t *testing.T) {
	t.Parallel()
	echo := `{"error":"keys ` + oldKey + ` and ` + newKey + ` seen"}`
	tests := []struct {
		name   string
		script simulator.Script
		wantOK bool
	}{
		{"both refused, echoing both", simulator.Always(reply(http.StatusForbidden, echo)), false},
		{"refused, then a reply echoing both", simulator.Sequence(reply(http.StatusForbidden, echo), reply(http.StatusOK, echo)), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, tt.script)
			var logs syncBuffer
			cfg := testConfig(t, srv.URL)
			cfg.APIKey, cfg.APIKeys = "", []string{oldKey, newKey}
			cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
			c := newClient(t, cfg)
			r, err := c.CreateMultiCardPayment(t.Context(), payment("k-redact-both"))
			if (err == nil) != tt.wantOK {
				t.Fatalf("CreateMultiCardPayment = %v, want ok %v", err, tt.wantOK)
			}
			var out string
			if err != nil {
				out = string(statusError(t, err).Body) + err.Error()
			} else {
				out = string(r.Body) + fmt.Sprint(r.Payment())
			}
			assertNoKeys(t, out+logs.String(), oldKey, newKey)
			if !bytes.Contains([]byte(out), []byte("[REDACTED]")) {
				t.Errorf("output %q has no [REDACTED] mark: the reply was not what the test meant", out)
			}
		})
	}
}
