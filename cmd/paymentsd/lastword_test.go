package main

import (
	"encoding/csv"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/cli"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/store/storetest"
)

// TestGiveUpKeepsTheProvidersLastWord: a key the provider answers 409 on
// every attempt (which proves nothing, so its outcome stays unknown) is
// re-sent by settlement until its window closes, and given up. The
// record, as the API, the CLI and the export show it, keeps what the
// provider last said (its 409 and its error), and every attempt it lists
// is one that reached the provider: a claim that sent nothing (one made
// too near the window's end to send) is no attempt, and may not overwrite
// the provider's last word. Before issue 31 the last claim often was one
// such, leaving provider status 0 and "nothing was sent" on the record.
func TestGiveUpKeepsTheProvidersLastWord(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	p.SetScript(simulator.Always(simulator.Reply{Status: 409, Body: []byte(`{"error":"a request with this key is in progress"}`)}))
	db := storetest.SQLiteURL(t)
	d := newCLIDeployment(t, with(sandboxEnv(p), "PAYMENTS_DATABASE_URL", db,
		"PAYMENTS_UPSTREAM_MAX_ATTEMPTS", "1",
		"PAYMENTS_UPSTREAM_BREAKER_FAILURES", "1000",
		"PAYMENTS_SETTLEMENT_WINDOW", "6s",
		"PAYMENTS_UPSTREAM_TIMEOUT", "500ms",
		"PAYMENTS_PROVIDER_QUIET_PERIOD", "1s",
	))
	in := start(t, d.env)
	const key = "k-last-word"
	_, err := d.checkoutClient(t, in).CreateMultiCardPayment(t.Context(), validRequest(key))
	checkReason(t, status.Convert(err), "PAYMENT_OUTCOME_UNKNOWN")
	waitGaveUp(t, in, 1)

	r := runCLI(t, "", "get", d.admin(in), key, "-o", "json")
	got := jsonLines[paymentsv1.GetMultiCardPaymentResponse](t, r.stdout)
	if r.code != 0 || len(got) != 1 {
		t.Fatalf("get %s -o json:\n%v", key, r)
	}
	rec := got[0]
	if !rec.GetSettlementGaveUp() || rec.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN {
		t.Fatalf("record = %v, gave up %v; want OUTCOME_UNKNOWN, given up", rec.GetState(), rec.GetSettlementGaveUp())
	}
	h := rec.GetAttemptHistory()
	if len(h) < 2 {
		t.Fatalf("attempt history = %v, want the call's attempt and settlement's", h)
	}
	requests := 0
	for _, a := range h {
		if a.GetHttpRequests() == 0 || a.GetProviderHttpStatus() != 409 {
			t.Errorf("attempt %d sent %d requests and got %d, want every listed attempt to have reached the provider and got its 409", a.GetNumber(), a.GetHttpRequests(), a.GetProviderHttpStatus())
		}
		requests += int(a.GetHttpRequests())
	}
	last := h[len(h)-1]
	if rec.GetProviderHttpStatus() != 409 || rec.GetLastError() != last.GetError() || rec.GetLastError() == "" {
		t.Errorf("record's provider status %d and last error %q; want the last attempt's: 409 and %q", rec.GetProviderHttpStatus(), rec.GetLastError(), last.GetError())
	}
	if int(rec.GetAttempts()) != requests || requests != len(p.Requests()) {
		t.Errorf("record counts %d attempts, its history %d requests, the provider saw %d; want them equal", rec.GetAttempts(), requests, len(p.Requests()))
	}

	out := filepath.Join(t.TempDir(), "today.csv")
	if r := runCLI(t, "", "export", d.admin(in), "--from", "today", "--to", "today", "--format", "csv", "--output", out); r.code != 0 {
		t.Fatalf("export:\n%v", r)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil || len(rows) != 2 {
		t.Fatalf("export = %q, %v; want the header and the one payment", rows, err)
	}
	col := func(name string) string { return rows[1][slices.Index(cli.ExportColumns, name)] }
	if col("provider_http_status") != "409" || col("last_error") != rec.GetLastError() || col("attempts") != strconv.Itoa(requests) {
		t.Errorf("export: provider_http_status %q, last_error %q, attempts %q; want 409, %q, %d", col("provider_http_status"), col("last_error"), col("attempts"), rec.GetLastError(), requests)
	}
}
