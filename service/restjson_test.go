package service

import (
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
		var got, want any
		if err := json.Unmarshal(fast, &got); err != nil {
			t.Fatalf("fast path wrote invalid JSON %s: %v", fast, err)
		}
		json.Unmarshal(slow, &want)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("fast path differs from protojson (-want +got):\n%s", diff)
		}
	}
}
