package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
)

// TestResolveRefusesAnotherPaymentsReply is the finding 3: a
// payment of USD 12.50 in doubt, resolved SUCCEEDED with a reply that
// names another key, amount and currency, is refused (INVALID_ARGUMENT,
// naming the field), over gRPC and REST, and nothing is written; its own
// reply is accepted, and the caller's retry replays that one. The audit
// entry's request ID is paymentsd's own; the X-Request-Id the admin sent
// is kept beside it, as the caller's.
func TestResolveRefusesAnotherPaymentsReply(t *testing.T) {
	t.Parallel()
	p := idempotentProvider(t)
	p.SetScript(simulator.Always(simulator.Reply{Fault: simulator.Reset}))
	in, ps := mtlsDeployment(t, with(sandboxEnv(p),
		"PAYMENTS_UPSTREAM_MAX_ATTEMPTS", "1",
		"PAYMENTS_UPSTREAM_BREAKER_FAILURES", "1000",
		"PAYMENTS_SETTLEMENT_WINDOW", "1500ms",
		"PAYMENTS_UPSTREAM_TIMEOUT", "500ms",
		"PAYMENTS_PROVIDER_QUIET_PERIOD", "1s",
	))
	co, admin := ps["checkout"], ps["oncall"]
	const key = "k-foreign-reply"
	_, err := co.client.CreateMultiCardPayment(t.Context(), validRequest(key))
	checkReason(t, status.Convert(err), "PAYMENT_OUTCOME_UNKNOWN")
	in.logs.waitFor(t, "settlement window closed with the payment's outcome unknown; check the provider's dashboard", nil)
	before, err := admin.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
	if err != nil {
		t.Fatal(err)
	}

	foreign := `{"id":"pay_other","idempotencyKey":"someone-else","amountMoney":{"amount":999999,"currency":"EUR"}}`
	_, err = admin.client.ResolveMultiCardPayment(t.Context(), &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: key,
		Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED, Evidence: "dashboard", ReplyJson: foreign})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || badRequestField(st) != "reply_json.idempotencyKey" {
		t.Errorf("resolve with another payment's reply = %v (field %q), want INVALID_ARGUMENT naming reply_json.idempotencyKey", err, badRequestField(st))
	}
	for _, tc := range []struct{ reply, field string }{
		{`{"id":"pay_other","idempotencyKey":"k-foreign-reply","amountMoney":{"amount":999999,"currency":"USD"}}`, "reply_json.amountMoney.amount"},
		{`{"id":"pay_other","amountMoney":{"amount":1250,"currency":"EUR"}}`, "reply_json.amountMoney.currency"},
	} {
		body := `{"idempotencyKey":"` + key + `","outcome":"RESOLUTION_OUTCOME_SUCCEEDED","evidence":"dashboard","replyJson":` + jsonString(tc.reply) + `}`
		r := admin.do(t, http.MethodPost, "/v1/multi-card-payments:resolve", body)
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.raw), `"field":"`+tc.field+`"`) {
			t.Errorf("REST resolve with %s = %d %s, want 400 naming %s", tc.reply, r.status, r.raw, tc.field)
		}
	}
	after, err := admin.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
	if err != nil || after.GetState() != before.GetState() || !after.GetUpdateTime().AsTime().Equal(before.GetUpdateTime().AsTime()) || len(after.GetAuditEntries()) != 0 {
		t.Errorf("record after refused resolutions = %v, %v; want it unchanged", after, err)
	}

	own := `{"id":"pay_123","idempotencyKey":"k-foreign-reply","amountMoney":{"amount":1250,"currency":"USD"}}`
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-request-id", "oncall-ticket-42")
	got, err := admin.client.ResolveMultiCardPayment(ctx, &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: key,
		Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED, Evidence: "dashboard: pay_123", ReplyJson: own})
	if err != nil {
		t.Fatalf("resolve with the payment's own reply = %v", err)
	}
	if e := got.GetAuditEntry(); e.GetCallerRequestId() != "oncall-ticket-42" || e.GetRequestId() == "oncall-ticket-42" || len(e.GetRequestId()) != 32 {
		t.Errorf("audit entry request IDs = %q (paymentsd's) and %q (the caller's); want paymentsd's own, and oncall-ticket-42 as the caller's", e.GetRequestId(), e.GetCallerRequestId())
	}
	var line map[string]any
	for _, l := range in.logs.lines("call") {
		if l["method"] == "/payments.v1.PaymentsService/ResolveMultiCardPayment" && l["caller_request_id"] == "oncall-ticket-42" {
			line = l
		}
	}
	if line == nil || line["request_id"] != got.GetAuditEntry().GetRequestId() {
		t.Errorf("call line of the resolution = %v; want request_id %s beside caller_request_id oncall-ticket-42", line, got.GetAuditEntry().GetRequestId())
	}
	resp, err := co.client.CreateMultiCardPayment(t.Context(), validRequest(key))
	if err != nil || string(resp.GetPaymentJson()) != own || !resp.GetResolved() {
		t.Errorf("caller's retry = %v, %v; want the resolution's reply replayed", resp, err)
	}
}

func badRequestField(st *status.Status) string {
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}

// jsonString is s as a JSON string literal.
func jsonString(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}
