package service

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/upstream"
)

// FuzzStructWire checks that what appendStructWire writes for a reply
// decodes to the Struct that upstream.DecodeReply makes of it, for every
// reply upstream.CheckReply accepts: the gRPC caller gets the payment it
// got when the Struct was built and marshalled.
func FuzzStructWire(f *testing.F) {
	for _, seed := range []string{
		`{}`,
		benchReply,
		` { "a" : [ 1 , -0 , 2.5e-3 , true , false , null , "x" , { } , [ ] ] } `,
		`{"cards":[{"last4":"4242","captured":true},{"last4":"0005","captured":false}],"metadata":null}`,
		`{"amount":9007199254740993,"big":1e308,"small":-5e-324,"neg":-0}`,
		`{"note":"Zahlung für Café ✓ 日本語 🚀","escaped":"\u00e9\ud83d\ude80\n\"\\\/\b\f\r\t"}`,
		`{"lone":"\ud83d","low":"\ude80x","pair\ud83d\ude80key":1,"bad pair":"\ud83d\u0041"}`,
		`{"a":1,"a":2,"b":{"c":1,"c":{"d":[]}}}`,
		`{"long":"` + strings.Repeat("x", 200) + `","longer":"` + strings.Repeat("y", 20000) + `"}`,
		`{"deep":[[[[{"a":[{"b":[[[1]]]}]}]]]]}`,
		`{"id":"a"}{"id":"b"}`,
		`[1]`,
		`{"a":1e400}`,
		"{\"id\":\"\xff\"}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, reply []byte) {
		if upstream.CheckReply(reply) != nil {
			appendStructWire(nil, reply) // must not panic
			return
		}
		want, err := upstream.DecodeReply(reply)
		if err != nil {
			t.Fatalf("CheckReply(%q) accepted what DecodeReply refuses: %v", reply, err)
		}
		var got structpb.Struct
		if err := proto.Unmarshal(appendStructWire(nil, reply), &got); err != nil {
			t.Fatalf("appendStructWire(%q) wrote what doesn't unmarshal: %v", reply, err)
		}
		if !proto.Equal(want, &got) {
			t.Fatalf("appendStructWire(%q) = %v, want %v", reply, &got, want)
		}
		// After bytes already in the buffer, the same.
		prefix := []byte("prefix")
		out := appendStructWire(prefix, reply)
		got.Reset()
		if string(out[:len(prefix)]) != "prefix" || proto.Unmarshal(out[len(prefix):], &got) != nil || !proto.Equal(want, &got) {
			t.Fatalf("appendStructWire(prefix, %q) changed the prefix or wrote %v, want %v", reply, &got, want)
		}
	})
}

// TestServerCodecWritesPayment: a payment's response marked
// paymentFromReply reaches a gRPC caller as it did when the handler built
// the Struct: the same message, payment included, and the response is
// left as it was.
func TestServerCodecWritesPayment(t *testing.T) {
	t.Parallel()
	reply := []byte(benchReply)
	payment, err := upstream.DecodeReply(reply)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		marked     proto.Message
		want, into proto.Message
	}{
		{"create",
			&paymentsv1.CreateMultiCardPaymentResponse{Payment: paymentFromReply, PaymentJson: reply, ProviderHttpStatus: 201,
				Environment: paymentsv1.Environment_ENVIRONMENT_SANDBOX, Replayed: true},
			&paymentsv1.CreateMultiCardPaymentResponse{Payment: payment, PaymentJson: reply, ProviderHttpStatus: 201,
				Environment: paymentsv1.Environment_ENVIRONMENT_SANDBOX, Replayed: true},
			&paymentsv1.CreateMultiCardPaymentResponse{}},
		{"get",
			&paymentsv1.GetMultiCardPaymentResponse{Payment: paymentFromReply, PaymentJson: reply, IdempotencyKey: "k",
				State: paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED, Attempts: 1},
			&paymentsv1.GetMultiCardPaymentResponse{Payment: payment, PaymentJson: reply, IdempotencyKey: "k",
				State: paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED, Attempts: 1},
			&paymentsv1.GetMultiCardPaymentResponse{}},
		{"create, empty payment",
			&paymentsv1.CreateMultiCardPaymentResponse{Payment: paymentFromReply, PaymentJson: []byte("{}"), Resolved: true},
			&paymentsv1.CreateMultiCardPaymentResponse{Payment: &structpb.Struct{}, PaymentJson: []byte("{}"), Resolved: true},
			&paymentsv1.CreateMultiCardPaymentResponse{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := proto.Clone(tc.marked)
			out, err := newServerCodec().Marshal(tc.marked)
			if err != nil {
				t.Fatalf("Marshal(%v) error = %v", tc.marked, err)
			}
			if err := proto.Unmarshal(out.Materialize(), tc.into); err != nil {
				t.Fatalf("Marshal(%v) wrote what doesn't unmarshal: %v", tc.marked, err)
			}
			if diff := cmp.Diff(tc.want, tc.into, protocmp.Transform()); diff != "" {
				t.Errorf("what the caller gets (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, tc.marked, protocmp.Transform()); diff != "" || !isMarked(tc.marked) {
				t.Errorf("Marshal changed the response (-before +after):\n%s", diff)
			}
		})
	}
}

func isMarked(m proto.Message) bool {
	switch m := m.(type) {
	case *paymentsv1.CreateMultiCardPaymentResponse:
		return m.Payment == paymentFromReply
	case *paymentsv1.GetMultiCardPaymentResponse:
		return m.Payment == paymentFromReply
	}
	return false
}
