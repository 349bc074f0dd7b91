package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestPaymentsCLIJSONIsREST: -o json prints what the REST API writes for
// the same payment, field for field: false, zero and empty fields
// included, the provider's reply as payment, and nothing the REST API
// leaves out. A script moves between the two without a change.
func TestPaymentsCLIJSONIsREST(t *testing.T) {
	t.Parallel()
	in := start(t, map[string]string{
		"PAYMENTS_SETTLEMENT_WINDOW":     "1500ms",
		"PAYMENTS_UPSTREAM_TIMEOUT":      "500ms",
		"PAYMENTS_PROVIDER_QUIET_PERIOD": "1s",
	}, "--simulate")
	conn := []string{"--addr", in.grpcAddr, "--insecure"}
	keys := []string{"k-json-paid", "sim-decline-json", "sim-in-doubt-json"}
	for _, key := range keys {
		in.rest(t, validBody(key), nil)
	}
	waitGaveUp(t, in, 1)

	restJSON := func(path string) map[string]any {
		t.Helper()
		resp, err := in.http.Get("http://" + in.httpAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s = %d, %v", path, resp.StatusCode, err)
		}
		return v
	}
	cliJSON := func(command string, args ...string) []map[string]any {
		t.Helper()
		r := runCLI(t, "", command, conn, append(args, "-o", "json")...)
		if r.code != 0 {
			t.Fatalf("%s %q -o json:\n%v", command, args, r)
		}
		var vs []map[string]any
		for line := range strings.Lines(r.stdout) {
			var v map[string]any
			if err := json.Unmarshal([]byte(line), &v); err != nil {
				t.Fatalf("%s -o json line %q: %v", command, line, err)
			}
			vs = append(vs, v)
		}
		return vs
	}

	var want []any
	for _, p := range restJSON("/v1/multi-card-payments")["payments"].([]any) {
		want = append(want, p)
	}
	var got []any
	for _, p := range cliJSON("list") {
		got = append(got, p)
	}
	if diff := cmp.Diff(want, got); diff != "" || len(got) != len(keys) {
		t.Errorf("list -o json differs from GET /v1/multi-card-payments's payments (-REST +CLI):\n%s", diff)
	}
	for _, key := range keys {
		want := restJSON("/v1/multi-card-payments/" + key)
		if got := cliJSON("get", key); len(got) != 1 || !cmp.Equal(want, got[0]) {
			t.Errorf("get %s -o json differs from GET /v1/multi-card-payments/%s (-REST +CLI):\n%s", key, key, cmp.Diff([]map[string]any{want}, got))
		}
	}

	// The resolution's answer: the record as a lookup shows it now, and
	// its audit entry.
	resolved := cliJSON("resolve", "sim-in-doubt-json", "--outcome", "not-created", "--evidence", "simulator", "--yes", "--wait", "30s")
	after := restJSON("/v1/multi-card-payments/sim-in-doubt-json")
	entries := after["auditEntries"].([]any)
	want2 := map[string]any{"payment": after, "auditEntry": entries[len(entries)-1]}
	if len(resolved) != 1 || !cmp.Equal(want2, resolved[0]) {
		t.Errorf("resolve -o json differs from the lookup that follows it (-REST +CLI):\n%s", cmp.Diff([]map[string]any{want2}, resolved))
	}
}
