package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/cli"
)

// TestRESTAnswersAsDocumented: the REST API's answers are what the
// OpenAPI document it serves says, for the fields a contract validator
// trips on: no field is ever null (an unset message field is left out),
// every field the document requires is there, and a record's
// settlementWindowEndTime is the same in a lookup, a list and the
// export, whatever its state.
func TestRESTAnswersAsDocumented(t *testing.T) {
	t.Parallel()
	in := start(t, nil, "--simulate")
	base := "http://" + in.httpAddr
	var doc struct {
		Definitions map[string]struct{ Required []string }
	}
	getJSON(t, in, base+"/openapi.json", &doc)

	for _, key := range []string{"openapi-ok", "sim-decline-openapi"} {
		in.rest(t, validBody(key), nil)
		var get map[string]any
		getJSON(t, in, base+"/v1/multi-card-payments/"+key, &get)
		checkAnswer(t, "GET "+key, get, doc.Definitions["v1GetMultiCardPaymentResponse"].Required)
	}
	var list struct {
		Payments []map[string]any
	}
	getJSON(t, in, base+"/v1/multi-card-payments", &list)
	if len(list.Payments) != 2 {
		t.Fatalf("list: %d payments, want 2", len(list.Payments))
	}
	var export bytes.Buffer
	if _, err := cli.ExportPayments(t.Context(), in.client, &paymentsv1.ListMultiCardPaymentsRequest{}, "csv", &export, cli.ExportOptions{Timeout: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&export).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	col := slices.Index(rows[0], "settlement_window_end_time")
	for i, p := range list.Payments {
		checkAnswer(t, "list", p, doc.Definitions["v1MultiCardPaymentSummary"].Required)
		var get map[string]any
		getJSON(t, in, base+"/v1/multi-card-payments/"+p["idempotencyKey"].(string), &get)
		// protojson and export write the same instant alike: RFC 3339 in
		// UTC with as many fractional digits as needed.
		if get["settlementWindowEndTime"] == nil || get["settlementWindowEndTime"] != p["settlementWindowEndTime"] || rows[i+1][col] != p["settlementWindowEndTime"] {
			t.Errorf("%s: settlementWindowEndTime GET %v, list %v, export %q; want one time, the same in all three", p["idempotencyKey"], get["settlementWindowEndTime"], p["settlementWindowEndTime"], rows[i+1][col])
		}
	}
}

func getJSON(t *testing.T, in *instance, url string, v any) {
	t.Helper()
	resp, err := in.http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d %s", url, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// checkAnswer fails for a null anywhere in v, and for a required field
// missing at its top.
func checkAnswer(t *testing.T, what string, v map[string]any, required []string) {
	t.Helper()
	if len(required) == 0 {
		t.Fatalf("%s: the OpenAPI document requires no field", what)
	}
	for _, f := range required {
		if _, ok := v[f]; !ok {
			t.Errorf("%s: required field %s is missing: %v", what, f, v)
		}
	}
	var walk func(path string, x any)
	walk = func(path string, x any) {
		switch x := x.(type) {
		case nil:
			t.Errorf("%s: %s is null", what, path)
		case map[string]any:
			for k, e := range x {
				walk(path+"."+k, e)
			}
		case []any:
			for _, e := range x {
				walk(path+"[]", e)
			}
		}
	}
	walk("", v)
}

// TestRESTRetryAfter: a REST answer carries a Retry-After header exactly
// when its status carries a RetryInfo, with the RetryInfo's delay rounded
// up to whole seconds, and an X-Request-Id always.
func TestRESTRetryAfter(t *testing.T) {
	t.Parallel()
	in := start(t, nil, "--simulate")
	for _, tt := range []struct {
		what, key string
		status    int
	}{
		{"a provider's 503", "sim-status-503-retry-after", http.StatusServiceUnavailable},
		{"the same key in its quiet period", "sim-status-503-retry-after", http.StatusConflict},
		{"a decline", "sim-decline-retry-after", http.StatusBadRequest},
		{"a payment", "retry-after-ok", http.StatusOK},
	} {
		r := in.rest(t, validBody(tt.key), nil)
		if r.status != tt.status {
			t.Fatalf("%s: POST = %d %s, want %d", tt.what, r.status, r.raw, tt.status)
		}
		var st struct {
			Details []struct {
				Type       string `json:"@type"`
				RetryDelay string `json:"retryDelay"`
			}
		}
		json.Unmarshal(r.raw, &st)
		want := ""
		for _, d := range st.Details {
			if d.Type == "type.googleapis.com/google.rpc.RetryInfo" {
				delay, err := time.ParseDuration(d.RetryDelay)
				if err != nil {
					t.Fatal(err)
				}
				want = strconv.Itoa(int((delay + time.Second - 1) / time.Second))
			}
		}
		if got := r.header.Get("Retry-After"); got != want {
			t.Errorf("%s: Retry-After %q, want %q (the RetryInfo's delay in whole seconds, rounded up)", tt.what, got, want)
		}
		if tt.status != http.StatusOK && want == "" && tt.status != http.StatusBadRequest {
			t.Errorf("%s: no RetryInfo", tt.what)
		}
		if r.header.Get("X-Request-Id") == "" {
			t.Errorf("%s: no X-Request-Id", tt.what)
		}
	}
}

// TestRESTRetryAfterDocumented: every status CreateMultiCardPayment
// answers, for each status the provider may answer, is in the OpenAPI
// document, and declares a Retry-After header whenever the answer sends
// one, so that a client generated from the document reads it.
func TestRESTRetryAfterDocumented(t *testing.T) {
	t.Parallel()
	in := start(t, map[string]string{
		// Every answer is the provider's own, never the breaker's.
		"PAYMENTS_UPSTREAM_BREAKER_FAILURES": "1000",
		"PAYMENTS_UPSTREAM_MAX_ATTEMPTS":     "1",
	}, "--simulate")
	var doc struct {
		Paths map[string]map[string]struct {
			Responses map[string]struct {
				Headers map[string]any
			}
		}
	}
	getJSON(t, in, "http://"+in.httpAddr+"/openapi.json", &doc)
	responses := doc.Paths["/v1/multi-card-payments"]["post"].Responses
	for provider := 400; provider < 600; provider++ {
		r := in.rest(t, validBody("sim-status-"+strconv.Itoa(provider)+"-documented"), nil)
		declared, ok := responses[strconv.Itoa(r.status)]
		switch {
		case !ok:
			t.Errorf("the provider's %d: POST answers %d, which the OpenAPI document does not declare", provider, r.status)
		case r.header.Get("Retry-After") != "" && declared.Headers["Retry-After"] == nil:
			t.Errorf("the provider's %d: POST answers %d with Retry-After %s, which the OpenAPI document does not declare for %d", provider, r.status, r.header.Get("Retry-After"), r.status)
		}
	}
}
