package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/cli"
)

// TestExportPartialFiles: an export to --output that is cut off (here
// its context ends, as SIGINT, SIGTERM or SIGHUP end it) leaves no
// partial file; one left by an export killed outright (SIGKILL) is
// removed, and reported, by the next export to the same file.
func TestExportPartialFiles(t *testing.T) {
	t.Parallel()
	in := start(t, nil, "--simulate")
	if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-export-partial")); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	output := filepath.Join(dir, "payments[1].csv") // a glob character too
	args := []string{"export", "--insecure", "--addr", in.grpcAddr, "--from", "yesterday", "--to", "today", "--output", output}

	cut, cancel := context.WithCancel(t.Context())
	cancel()
	if err := cli.Run(cut, args, nil, strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
		t.Fatal("export with its context ended = nil, want an error")
	}
	if names := dirNames(t, dir); len(names) != 0 {
		t.Errorf("an export cut off left %q, want nothing", names)
	}

	killed := filepath.Join(dir, ".payments[1].csv.partial-123456")
	other := filepath.Join(dir, ".other.csv.partial-123456")
	for _, f := range []string{killed, other} {
		if err := os.WriteFile(f, []byte("idempotency_key,"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var stderr bytes.Buffer
	if err := cli.Run(t.Context(), args, nil, strings.NewReader(""), &bytes.Buffer{}, &stderr); err != nil {
		t.Fatalf("export = %v\n%s", err, stderr.String())
	}
	if got, want := dirNames(t, dir), []string{".other.csv.partial-123456", "payments[1].csv"}; !slices.Equal(got, want) {
		t.Errorf("after an export: %q, want %q: its own stale partial file removed, another file's kept", got, want)
	}
	if !strings.Contains(stderr.String(), killed) {
		t.Errorf("export's stderr %q does not report removing %s", stderr.String(), killed)
	}
}

// TestExportNeutralisesText: a CSV text cell a spreadsheet would take for
// a formula, or holding a character that reorders or hides text, is
// written as a JSON string literal, which decodes to the exact value;
// JSON lines escape the same characters and stay exact.
func TestExportNeutralisesText(t *testing.T) {
	t.Parallel()
	in := start(t, nil, "--simulate")
	keys := []string{
		"=HYPERLINK(\"http://x\")", "+1+1", "-2+3+cmd|' /C calc'!A0", "@SUM(A1)", "\"quoted", // formulas, and the quote that marks a literal
		"key-\u202eevil", "key\u2066iso", "key\u200bzw", "key\u2028ls", "key\u2029ps", "key\u0085nel", "key\u061calm", // bidi, format, separators, C1
		"order-1234", "日本語-キー", "a b", // left as they are
	}
	for _, k := range keys {
		if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest(k)); err != nil {
			t.Fatalf("CreateMultiCardPayment(%q) = %v", k, err)
		}
	}
	req := func() *paymentsv1.ListMultiCardPaymentsRequest { return &paymentsv1.ListMultiCardPaymentsRequest{} }
	var csvOut, jsonOut bytes.Buffer
	if _, err := cli.ExportPayments(t.Context(), in.client, req(), "csv", &csvOut, cli.ExportOptions{Timeout: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.ExportPayments(t.Context(), in.client, req(), "jsonl", &jsonOut, cli.ExportOptions{Timeout: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&csvOut).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, row := range rows[1:] {
		cell := row[0]
		if hiddenOrFormula(cell) {
			t.Errorf("CSV key cell %q can be taken for a formula or hides characters", cell)
		}
		if strings.HasPrefix(cell, `"`) {
			var exact string
			if err := json.Unmarshal([]byte(cell), &exact); err != nil {
				t.Errorf("CSV key cell %q starts with a quote but is no JSON string: %v", cell, err)
			}
			cell = exact
		}
		got = append(got, cell)
		// The payment's reply echoes the key: it is neutralised too.
		if hiddenOrFormula(row[len(row)-1]) {
			t.Errorf("CSV payment_json cell %q hides characters", row[len(row)-1])
		}
	}
	if !slices.Equal(got, keys) {
		t.Errorf("CSV keys, decoded: %q, want %q", got, keys)
	}
	got = nil
	for _, line := range strings.Split(strings.TrimSuffix(jsonOut.String(), "\n"), "\n") {
		if hiddenOrFormula(line) && !strings.HasPrefix(line, "{") {
			t.Errorf("JSON line %q", line)
		}
		for _, r := range line {
			if r >= utf8.RuneSelf && unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp) {
				t.Errorf("JSON line %q holds %U unescaped", line, r)
			}
		}
		var rec cli.ExportRecord
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		got = append(got, rec.IdempotencyKey)
	}
	if !slices.Equal(got, keys) {
		t.Errorf("JSON lines keys: %q, want %q", got, keys)
	}
}

// hiddenOrFormula reports whether a cell starts like a formula or holds a
// character that reorders or hides text.
func hiddenOrFormula(s string) bool {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return true
	}
	return strings.ContainsFunc(s, func(r rune) bool {
		return unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp) || (r >= 0x80 && unicode.Is(unicode.Cc, r))
	})
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
