package service

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// TestRESTMarshalerMatchesProtojson checks that the fast path writes the
// same JSON values as protojson would.
func TestRESTMarshalerMatchesProtojson(t *testing.T) {
	payment, err := structpb.NewStruct(map[string]any{
		"id":       "pay_1",
		"quote":    "say \"hi\"\\ \n\r\t\x00\x1f\u2028 <&> Grüße 支払い ✓ 😀",
		"numbers":  []any{0.0, math.Copysign(0, -1), 1250.0, -3.5, 1e21, 1e20, 1e-7, 1e-6, 9007199254740993.0, math.MaxFloat64, math.SmallestNonzeroFloat64},
		"nested":   map[string]any{"a": map[string]any{"b": []any{true, false, nil, map[string]any{}}}},
		"empty":    map[string]any{},
		"emptyArr": []any{},
		"none":     nil,
		"":         "empty key",
	})
	if err != nil {
		t.Fatal(err)
	}
	m := restMarshaler{&runtime.JSONPb{MarshalOptions: protojson.MarshalOptions{EmitUnpopulated: true}}}
	for _, resp := range []*paymentsv1.CreateMultiCardPaymentResponse{
		{Payment: payment, ProviderHttpStatus: 201, Environment: paymentsv1.Environment_ENVIRONMENT_LIVE},
		{Payment: &structpb.Struct{}, ProviderHttpStatus: 200, Environment: paymentsv1.Environment_ENVIRONMENT_SANDBOX},
		{},
	} {
		fast, err := m.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		slow, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		var got, want map[string]any
		if err := json.Unmarshal(fast, &got); err != nil {
			t.Fatalf("fast path wrote invalid JSON %s: %v", fast, err)
		}
		json.Unmarshal(slow, &want)
		// REST leaves paymentJson out: payment itself is exact there.
		delete(want, "paymentJson")
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("fast path differs from protojson (-want +got):\n%s", diff)
		}
	}
}

// TestRESTPaymentIsExact: when the provider's bytes are known, REST writes
// them as payment, every digit intact, whatever the Struct holds.
func TestRESTPaymentIsExact(t *testing.T) {
	// Whitespace as the provider sent it, kept too.
	exact := []byte("{ \"id\": \"p\",\n\t\"big\":9007199254740993, \"huge\":12345678901234567891,\"html\":\"<&>\" }")
	m := restMarshaler{&runtime.JSONPb{MarshalOptions: protojson.MarshalOptions{EmitUnpopulated: true}}}
	for _, v := range []any{
		&paymentsv1.CreateMultiCardPaymentResponse{Payment: &structpb.Struct{}, PaymentJson: exact},
		&paymentsv1.GetMultiCardPaymentResponse{State: paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED, Payment: &structpb.Struct{}, PaymentJson: exact},
	} {
		b, err := m.Marshal(v)
		if err != nil {
			t.Fatalf("Marshal(%T) = %v", v, err)
		}
		if !bytes.Contains(b, append([]byte(`"payment":`), exact...)) {
			t.Errorf("Marshal(%T) = %s, want payment to be %s exactly", v, b, exact)
		}
		if bytes.Contains(b, []byte("paymentJson")) {
			t.Errorf("Marshal(%T) = %s, has paymentJson", v, b)
		}
	}
}
