package service

import (
	"encoding/json"
	"maps"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// restMarshaler is the gateway's JSON marshaler with a fast path for the
// success reply, which is mostly the provider's own JSON object: writing it
// directly is several times cheaper than protojson's reflection, and gives
// the same JSON values. Everything else, errors included, goes to JSONPb.
type restMarshaler struct {
	*runtime.JSONPb
}

// Over REST, payment is the provider's JSON object exactly as received
// (payment_json, validated as a JSON object when it was received), so every
// number keeps every digit; payment_json itself is left out.
func (m restMarshaler) Marshal(v any) ([]byte, error) {
	switch resp := v.(type) {
	case *paymentsv1.CreateMultiCardPaymentResponse:
		b := make([]byte, 0, 256+len(resp.GetPaymentJson()))
		b = append(b, `{"payment":`...)
		b = appendPayment(b, resp.GetPaymentJson(), resp.GetPayment())
		b = append(b, `,"providerHttpStatus":`...)
		b = strconv.AppendInt(b, int64(resp.GetProviderHttpStatus()), 10)
		b = append(b, `,"environment":"`...)
		b = append(b, resp.GetEnvironment().String()...)
		b = append(b, `","replayed":`...)
		b = strconv.AppendBool(b, resp.GetReplayed())
		b = append(b, `,"resolved":`...)
		b = strconv.AppendBool(b, resp.GetResolved())
		b = append(b, '}')
		return b, nil
	case *paymentsv1.ResolveMultiCardPaymentResponse:
		// The record as a lookup shows it over REST, exactly.
		payment, err := m.Marshal(resp.GetPayment())
		if err != nil {
			return nil, err
		}
		entry, err := m.JSONPb.Marshal(resp.GetAuditEntry())
		if err != nil {
			return nil, err
		}
		b := make([]byte, 0, len(payment)+len(entry)+32)
		b = append(b, `{"payment":`...)
		b = append(b, payment...)
		b = append(b, `,"auditEntry":`...)
		b = append(b, entry...)
		return append(b, '}'), nil
	case *paymentsv1.GetMultiCardPaymentResponse:
		rest := proto.CloneOf(resp)
		rest.Payment, rest.PaymentJson = nil, nil
		b, err := m.JSONPb.Marshal(rest)
		if err != nil {
			return nil, err
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(b, &fields); err != nil {
			return nil, err
		}
		delete(fields, "paymentJson")
		// payment is left out unless the payment succeeded.
		if resp.GetState() == paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED {
			fields["payment"] = appendPayment(nil, resp.GetPaymentJson(), resp.GetPayment())
		}
		// Written by hand, in the keys' order: encoding/json would
		// compact the provider's bytes (and escape <, > and & in them).
		// The keys are the message's JSON names, which need no escaping.
		keys := slices.Sorted(maps.Keys(fields))
		out := make([]byte, 0, len(b)+len(resp.GetPaymentJson())+16)
		out = append(out, '{')
		for i, k := range keys {
			if i > 0 {
				out = append(out, ',')
			}
			out = append(out, '"')
			out = append(out, k...)
			out = append(out, '"', ':')
			out = append(out, fields[k]...)
		}
		return append(out, '}'), nil
	case *paymentsv1.ListProviderEventsResponse:
		return m.marshalEventPage(resp)
	}
	return m.JSONPb.Marshal(v)
}

// marshalEventPage writes a page of events as JSONPb would, an event at a
// time, into one buffer sized for the page. JSONPb would marshal the page
// into a buffer that grows as it goes and then copy it: several times the
// page in memory at once, for pages of up to MaxEventPageBytes.
func (m restMarshaler) marshalEventPage(resp *paymentsv1.ListProviderEventsResponse) ([]byte, error) {
	n := 64
	for _, e := range resp.GetEvents() {
		// Bytes are base64 in JSON: 4 characters for every 3.
		n += proto.Size(e)*4/3 + 512
	}
	b := make([]byte, 0, n)
	b = append(b, `{"events":[`...)
	for i, e := range resp.GetEvents() {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = m.JSONPb.MarshalOptions.MarshalAppend(b, e); err != nil {
			return nil, err
		}
	}
	b = append(b, `],"nextAfterSequence":"`...)
	b = strconv.AppendInt(b, resp.GetNextAfterSequence(), 10)
	b = append(b, `"}`...)
	return b, nil
}

// appendPayment writes the provider's exact reply when there is one, else
// the Struct.
func appendPayment(b, exact []byte, s *structpb.Struct) []byte {
	switch {
	case len(exact) > 0:
		return append(b, exact...)
	case s != nil:
		return appendStruct(b, s)
	}
	return append(b, "null"...)
}

func appendStruct(b []byte, s *structpb.Struct) []byte {
	b = append(b, '{')
	first := true
	for k, v := range s.GetFields() {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendString(b, k)
		b = append(b, ':')
		b = appendValue(b, v)
	}
	return append(b, '}')
}

func appendValue(b []byte, v *structpb.Value) []byte {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return appendString(b, k.StringValue)
	case *structpb.Value_NumberValue:
		return appendNumber(b, k.NumberValue)
	case *structpb.Value_BoolValue:
		return strconv.AppendBool(b, k.BoolValue)
	case *structpb.Value_StructValue:
		return appendStruct(b, k.StructValue)
	case *structpb.Value_ListValue:
		b = append(b, '[')
		for i, e := range k.ListValue.GetValues() {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendValue(b, e)
		}
		return append(b, ']')
	}
	return append(b, "null"...)
}

// appendNumber writes f as encoding/json does. NaN and infinities can't
// come from a JSON reply; if one appears it is written as null rather than
// as invalid JSON.
func appendNumber(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(b, "null"...)
	}
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	return strconv.AppendFloat(b, f, format, -1, 64)
}

const hexDigits = "0123456789abcdef"

// appendString writes s as a JSON string, escaping what JSON requires and
// replacing invalid UTF-8 (which a Struct can't hold anyway) with U+FFFD.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, "\ufffd"...)
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
