package service

import (
	"context"

	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers protoCodecName
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/upstream"
)

// serverCodec is the gRPC server's codec: grpc-go's proto codec, except
// for two kinds of response.
//
//   - A payment's response whose payment is paymentFromReply: the payment
//     is written on the wire straight from payment_json
//     (appendStructWire), never built as a Struct.
//   - The inbox's responses, which it marshals into buffers of their own
//     size. grpc-go takes a large message's buffer from a pool whose
//     sizes step up to 1 MiB: an event of 513 KiB took 1 MiB, and the
//     pool kept the buffers a watch let go until the next collections,
//     twice over for each watch whose caller doesn't read.
type serverCodec struct{ encoding.CodecV2 }

func newServerCodec() serverCodec { return serverCodec{encoding.GetCodecV2(protoCodecName)} }

// protoCodecName is grpc-go's proto codec's name.
const protoCodecName = "proto"

func (c serverCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *paymentsv1.CreateMultiCardPaymentResponse:
		if m.Payment == paymentFromReply {
			return marshalWithPayment(m, createPaymentField, &m.Payment, m.PaymentJson)
		}
	case *paymentsv1.GetMultiCardPaymentResponse:
		if m.Payment == paymentFromReply {
			return marshalWithPayment(m, getPaymentField, &m.Payment, m.PaymentJson)
		}
	case *paymentsv1.WatchProviderEventsResponse, *paymentsv1.ListProviderEventsResponse:
		msg := m.(proto.Message)
		b, err := proto.MarshalOptions{}.MarshalAppend(make([]byte, 0, proto.Size(msg)), msg)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// paymentFromReply marks a response's payment (field 1 of
// CreateMultiCardPaymentResponse and GetMultiCardPaymentResponse, a
// google.protobuf.Struct) as the Struct of its payment_json, a reply that
// upstream.CheckReply accepts: serverCodec writes it from payment_json,
// and REST answers with payment_json itself. Anything else that needs the
// Struct calls withPayment.
var paymentFromReply = &structpb.Struct{}

// paymentFor is the payment of a success's response to the call in ctx:
// paymentFromReply over gRPC, none over REST (restMarshaler writes
// payment_json).
func paymentFor(ctx context.Context) *structpb.Struct {
	if overREST(ctx) {
		return nil
	}
	return paymentFromReply
}

// withPayment builds the Struct a GetMultiCardPaymentResponse's payment
// marks (paymentFromReply), for a response that goes out inside another.
func withPayment(resp *paymentsv1.GetMultiCardPaymentResponse) *paymentsv1.GetMultiCardPaymentResponse {
	if resp.Payment == paymentFromReply {
		resp.Payment, _ = upstream.DecodeReply(resp.PaymentJson)
	}
	return resp
}

// The payment fields' numbers.
var (
	createPaymentField = paymentField(&paymentsv1.CreateMultiCardPaymentResponse{})
	getPaymentField    = paymentField(&paymentsv1.GetMultiCardPaymentResponse{})
)

func paymentField(m proto.Message) protowire.Number {
	return m.ProtoReflect().Descriptor().Fields().ByName("payment").Number()
}

// marshalWithPayment marshals m, whose payment (*payment, field number
// field) is paymentFromReply, with the payment written from reply: the
// payment first, from the JSON, then the rest of m.
func marshalWithPayment(m proto.Message, field protowire.Number, payment **structpb.Struct, reply []byte) (mem.BufferSlice, error) {
	*payment = nil
	defer func() { *payment = paymentFromReply }()
	b := make([]byte, 0, proto.Size(m)+len(reply)+len(reply)/2+16)
	w := structWriter{b: b}
	start := w.open(field)
	w.b = appendStructWire(w.b, reply)
	w.close(start)
	b, err := proto.MarshalOptions{}.MarshalAppend(w.b, m)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}
