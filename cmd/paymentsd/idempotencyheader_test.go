package main

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
)

// TestRESTIdempotencyKeyHeader follows draft-ietf-httpapi-idempotency-key-
// header over real HTTP: the key may come in an Idempotency-Key header, a
// body with a different key is refused before anything is sent, and a
// replay says so in Idempotent-Replayed.
func TestRESTIdempotencyKeyHeader(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	p.Idempotent(true)
	in := start(t, sandboxEnv(p))
	const noKey = `{"amountMoney":{"currency":"USD","amount":1250}}`
	header := func(values ...string) http.Header { return http.Header{"Idempotency-Key": values} }

	t.Run("header only", func(t *testing.T) {
		first := in.rest(t, noKey, header("header-key-1"))
		if first.status != http.StatusOK || first.body["replayed"] != false {
			t.Fatalf("POST with the key in the header only = %d %s, want 200, not replayed", first.status, first.raw)
		}
		if got := first.header.Get("Idempotent-Replayed"); got != "" {
			t.Errorf("first answer has Idempotent-Replayed: %q, want none", got)
		}
		if ks := p.KeyStats("header-key-1"); ks.Requests != 1 {
			t.Errorf("the provider got %d requests with the header's key, want 1", ks.Requests)
		}
		again := in.rest(t, noKey, header("header-key-1"))
		if again.status != http.StatusOK || again.body["replayed"] != true || again.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("POST again = %d, replayed %v, Idempotent-Replayed %q; want 200, true, \"true\"", again.status, again.body["replayed"], again.header.Get("Idempotent-Replayed"))
		}
		// The body's key and the header's agree: the same payment.
		both := in.rest(t, validBody("header-key-1"), header("header-key-1"))
		if both.status != http.StatusOK || both.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("POST with the same key in both = %d, Idempotent-Replayed %q; want 200, \"true\"", both.status, both.header.Get("Idempotent-Replayed"))
		}
		if ks := p.KeyStats("header-key-1"); ks.Requests != 1 || ks.Charges != 1 {
			t.Errorf("the provider got %d requests, %d charges with the key; want 1, 1", ks.Requests, ks.Charges)
		}
		resp, err := in.http.Get("http://" + in.httpAddr + "/v1/multi-card-payments/" + url.PathEscape("header-key-1"))
		if err != nil {
			t.Fatal(err)
		}
		var rec struct{ State string }
		json.NewDecoder(resp.Body).Decode(&rec)
		resp.Body.Close()
		if rec.State != "PAYMENT_STATE_SUCCEEDED" {
			t.Errorf("lookup of the header's key: state %q, want PAYMENT_STATE_SUCCEEDED", rec.State)
		}
	})

	t.Run("structured field string", func(t *testing.T) {
		r := in.rest(t, noKey, header(`"sf-key-\"1\""`))
		if r.status != http.StatusOK {
			t.Fatalf("POST with a quoted key = %d %s, want 200", r.status, r.raw)
		}
		if ks := p.KeyStats(`sf-key-"1"`); ks.Requests != 1 {
			t.Errorf("the provider got %d requests with the unquoted key, want 1", ks.Requests)
		}
	})

	refused := []struct {
		name   string
		body   string
		header http.Header
		fields []string // field violations named
	}{
		{"body differs", validBody("body-key"), header("other-key"), []string{"idempotency_key", "Idempotency-Key"}},
		{"empty header", validBody("body-key"), header(""), []string{"Idempotency-Key"}},
		{"empty header, no body key", noKey, header(""), []string{"Idempotency-Key"}},
		{"control character", noKey, header("tab\there"), []string{"Idempotency-Key"}},
		{"two headers", noKey, header("a", "b"), []string{"Idempotency-Key"}},
		{"bad quoting", noKey, header(`"a\b"`), []string{"Idempotency-Key"}},
		// Invalid UTF-8 would reach the provider as U+FFFD: "k-\xff" and
		// "k-\xfe" would be two payments here and one key there.
		{"invalid UTF-8", noKey, header("k-\xff"), []string{"Idempotency-Key"}},
		// With no key anywhere, the refusal names both places it may be.
		{"no key", noKey, nil, []string{"idempotency_key", "Idempotency-Key"}},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			r := in.rest(t, tt.body, tt.header)
			if r.status != http.StatusBadRequest {
				t.Fatalf("POST %s with %v = %d %s, want 400", tt.body, tt.header, r.status, r.raw)
			}
			// Refused before the gateway's call, and still traceable.
			if r.header.Get("X-Request-Id") == "" {
				t.Errorf("POST with %v: 400 without an X-Request-Id", tt.header)
			}
			var st struct {
				Code    codes.Code
				Details []struct {
					Type            string `json:"@type"`
					Reason          string
					FieldViolations []struct{ Field string }
				}
			}
			if err := json.Unmarshal(r.raw, &st); err != nil {
				t.Fatal(err)
			}
			var reasons, fields []string
			for _, d := range st.Details {
				if d.Reason != "" {
					reasons = append(reasons, d.Reason)
				}
				for _, v := range d.FieldViolations {
					fields = append(fields, v.Field)
				}
			}
			if st.Code != codes.InvalidArgument || !slices.Equal(reasons, []string{"REQUEST_NOT_SENT"}) {
				t.Errorf("POST with %v: code %v, reasons %q; want InvalidArgument, [REQUEST_NOT_SENT]", tt.header, st.Code, reasons)
			}
			slices.Sort(fields)
			want := slices.Sorted(slices.Values(tt.fields))
			if !slices.Equal(fields, want) {
				t.Errorf("POST with %v names fields %q, want %q", tt.header, fields, want)
			}
		})
	}

	// The OpenAPI document served documents both headers and the keys'
	// expiry.
	resp, err := in.http.Get("http://" + in.httpAddr + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]struct {
			Parameters []struct{ Name, In, Description string }
			Responses  map[string]struct {
				Headers map[string]struct{ Type string }
			}
		}
	}
	err = json.NewDecoder(resp.Body).Decode(&doc)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	post := doc.Paths["/v1/multi-card-payments"]["post"]
	documented := false
	for _, prm := range post.Parameters {
		if prm.Name == "Idempotency-Key" && prm.In == "header" {
			documented = true
			for _, v := range []string{"PAYMENTS_RECORD_RETENTION", "PAYMENTS_TOMBSTONE_RETENTION", "IDEMPOTENCY_KEY_EXPIRED"} {
				if !strings.Contains(prm.Description, v) {
					t.Errorf("OpenAPI Idempotency-Key header does not state the expiry policy: no %s", v)
				}
			}
		}
	}
	if !documented {
		t.Error("OpenAPI document has no Idempotency-Key header parameter on POST /v1/multi-card-payments")
	}
	if _, ok := post.Responses["200"].Headers["Idempotent-Replayed"]; !ok {
		t.Error("OpenAPI document has no Idempotent-Replayed header on POST /v1/multi-card-payments' 200")
	}

	for _, key := range []string{"body-key", "other-key", "a", "b", "k-\xff", "k-\ufffd"} {
		if ks := p.KeyStats(key); ks.Requests != 0 {
			t.Errorf("the provider got %d requests with refused key %q, want none", ks.Requests, key)
		}
	}
}
