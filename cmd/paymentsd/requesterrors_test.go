package main

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// internals are words of Go, protobuf and their libraries that no error
// message of paymentsd's may show a caller.
var internals = []string{"strconv", "proto:", "regex", "`", "parsing time", "2006", "validation error", "invalid syntax", "int64", "int32", "TYPE_", "unexpected EOF"}

// TestRequestErrorsSayWhatIsWrong: a request paymentsd refuses as invalid
// is told which field is wrong and how, in the names it used (REST's JSON
// names, gRPC's proto names), with none of Go's or protobuf's internals
// (strconv, regular expressions, proto: line positions), and a validation
// refusal names its fields in a google.rpc.BadRequest, the detail the API
// documents, rather than buf.validate.Violations.
func TestRequestErrorsSayWhatIsWrong(t *testing.T) {
	t.Parallel()
	in := start(t, nil, "--simulate")
	base := "http://" + in.httpAddr
	const create, list, resolve = "/v1/multi-card-payments", "/v1/multi-card-payments", "/v1/multi-card-payments:resolve"
	for _, tt := range []struct {
		name string
		call restCall
		// field is what the message must name; violation, if set, the
		// BadRequest field violation it must carry.
		field, violation string
	}{
		{"no currency", restCall{"POST", create, "application/json", `{"amountMoney":{"amount":1250},"idempotencyKey":"k-bad"}`, nil}, "amountMoney.currency", "amount_money.currency"},
		{"a lower-case currency", restCall{"POST", create, "application/json", `{"amountMoney":{"currency":"usd","amount":1250},"idempotencyKey":"k-bad"}`, nil}, "amountMoney.currency", "amount_money.currency"},
		{"no amount", restCall{"POST", create, "application/json", `{"idempotencyKey":"k-bad"}`, nil}, "amountMoney", "amount_money"},
		{"a control character in the key", restCall{"POST", create, "application/json", `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"a\u0001b"}`, nil}, "idempotencyKey", "idempotency_key"},
		{"an amount that is not a number", restCall{"POST", create, "application/json", `{"amountMoney":{"currency":"USD","amount":"x"},"idempotencyKey":"k-bad"}`, nil}, "amount", ""},
		{"an amount that is a boolean", restCall{"POST", create, "application/json", `{"amountMoney":{"currency":"USD","amount":true},"idempotencyKey":"k-bad"}`, nil}, "amount", ""},
		{"an unknown field", restCall{"POST", create, "application/json", `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k-bad","bogus":1}`, nil}, "bogus", ""},
		{"an array", restCall{"POST", create, "application/json", `[1]`, nil}, "", ""},
		{"JSON cut short", restCall{"POST", create, "application/json", `{"amountMoney":`, nil}, "", ""},
		{"a page size that is not a number", restCall{"GET", list + "?pageSize=abc", "", "", nil}, "pageSize", ""},
		{"a page size too large", restCall{"GET", list + "?pageSize=5000", "", "", nil}, "pageSize", "page_size"},
		{"a time that is not RFC 3339", restCall{"GET", list + "?createdAfter=yesterday", "", "", nil}, "createdAfter", ""},
		{"a boolean that is not one", restCall{"GET", list + "?settlementGaveUp=maybe", "", "", nil}, "settlementGaveUp", ""},
		{"an unknown state", restCall{"GET", list + "?state=BOGUS", "", "", nil}, "state", ""},
		{"an unknown outcome", restCall{"POST", resolve, "application/json", `{"idempotencyKey":"k","outcome":"NOPE","evidence":"x"}`, nil}, "outcome", ""},
		{"blank evidence", restCall{"POST", resolve, "application/json", `{"idempotencyKey":"k","outcome":"RESOLUTION_OUTCOME_SUCCEEDED","evidence":" "}`, nil}, "evidence", "evidence"},
		{"a negative sequence", restCall{"GET", "/v1/provider-events?afterSequence=-1", "", "", nil}, "afterSequence", "after_sequence"},
	} {
		code, body := tt.call.do(t, in.http, base)
		var st struct {
			Message string           `json:"message"`
			Details []map[string]any `json:"details"`
		}
		if err := json.Unmarshal(body, &st); err != nil || code != http.StatusBadRequest {
			t.Errorf("%s: %s %s = %d %s, want 400", tt.name, tt.call.method, tt.call.path, code, body)
			continue
		}
		fields, types := restViolations(st.Details)
		checkRefusal(t, tt.name+" (REST)", st.Message, tt.field, fields, types, tt.violation)
	}

	// gRPC names fields as the proto does.
	_, err := in.client.CreateMultiCardPayment(t.Context(), &paymentsv1.CreateMultiCardPaymentRequest{IdempotencyKey: "k-bad"})
	fields, types := grpcViolations(err)
	checkRefusal(t, "no amount (gRPC)", status.Convert(err).Message(), "amount_money", fields, types, "amount_money")
	_, err = in.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{PageSize: 5000})
	fields, types = grpcViolations(err)
	checkRefusal(t, "a page size too large (gRPC)", status.Convert(err).Message(), "page_size", fields, types, "page_size")
}

// restViolations are the BadRequest field violations of a REST error's
// details, and the type of every detail.
func restViolations(details []map[string]any) (fields, types []string) {
	for _, d := range details {
		typ, _ := d["@type"].(string)
		types = append(types, typ)
		vs, _ := d["fieldViolations"].([]any)
		for _, v := range vs {
			f, _ := v.(map[string]any)["field"].(string)
			fields = append(fields, f)
		}
	}
	return fields, types
}

func grpcViolations(err error) (fields, types []string) {
	for _, d := range status.Convert(err).Proto().GetDetails() {
		types = append(types, d.GetTypeUrl())
	}
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	return fields, types
}

func checkRefusal(t *testing.T, what, msg, field string, violations, types []string, violation string) {
	t.Helper()
	if !strings.Contains(msg, field) {
		t.Errorf("%s: message %q does not name %s", what, msg, field)
	}
	for _, w := range internals {
		if strings.Contains(msg, w) {
			t.Errorf("%s: message %q shows %q", what, msg, w)
		}
	}
	for _, typ := range types {
		if strings.Contains(typ, "buf.validate") {
			t.Errorf("%s: details carry %s, which the API does not document", what, typ)
		}
	}
	if violation != "" && !slices.Contains(violations, violation) {
		t.Errorf("%s: BadRequest field violations %q, want %s among them", what, violations, violation)
	}
}
