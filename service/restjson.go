package service

import (
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
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

func (m restMarshaler) Marshal(v any) ([]byte, error) {
	resp, ok := v.(*paymentsv1.CreateMultiCardPaymentResponse)
	if !ok {
		return m.JSONPb.Marshal(v)
	}
	b := make([]byte, 0, 512)
	b = append(b, `{"payment":`...)
	if resp.GetPayment() == nil {
		b = append(b, "null"...)
	} else {
		b = appendStruct(b, resp.GetPayment())
	}
	b = append(b, `,"providerHttpStatus":`...)
	b = strconv.AppendInt(b, int64(resp.GetProviderHttpStatus()), 10)
	b = append(b, `,"environment":"`...)
	b = append(b, resp.GetEnvironment().String()...)
	b = append(b, `"}`...)
	return b, nil
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
