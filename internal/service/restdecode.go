package service

import (
	"encoding/json"
	"io"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// The REST request bodies are decoded by the gateway's marshaler
// (restMarshaler.NewDecoder). CreateMultiCardPayment's, the one body on the
// payment path, has a decoder written for its one shape (decodeCreate):
// it reads the body as callers send it, in one pass and with no
// reflection, and leaves anything else to the gateway's own decoder
// (strictDecoder: encoding/json, then protojson), which accepts or refuses
// it, and words its refusal, exactly as before. So decodeCreate never
// refuses anything: it accepts only what protojson accepts, with the same
// result (FuzzDecodeCreate checks it against protojson), and passes on
// what it does not recognise.

// restBody is a REST request's body, read whole by limitBody before the
// gateway sees it. The gateway's decoder reads its bytes where they are
// rather than through an io.Reader.
type restBody struct {
	b   []byte
	off int
}

func (b *restBody) Read(p []byte) (int, error) {
	if b.off >= len(b.b) {
		return 0, io.EOF
	}
	n := copy(p, b.b[b.off:])
	b.off += n
	return n, nil
}

func (b *restBody) Close() error { return nil }

// restDecoder is restMarshaler's decoder of one request body.
type restDecoder struct {
	r io.Reader
	m restMarshaler
}

func (m restMarshaler) NewDecoder(r io.Reader) runtime.Decoder {
	return &restDecoder{r: r, m: m}
}

// Decode decodes the body into v: a CreateMultiCardPayment request in the
// shape callers send with decodeCreate, anything else with strictDecoder.
func (d *restDecoder) Decode(v any) error {
	if req, ok := v.(*paymentsv1.CreateMultiCardPaymentRequest); ok {
		if body, ok := d.r.(*restBody); ok && decodeCreate(body.b[body.off:], req) {
			body.off = len(body.b)
			if testHookDecodedCreate != nil {
				testHookDecodedCreate()
			}
			return nil
		}
	}
	return strictDecoder{runtime.DecoderWrapper{Decoder: json.NewDecoder(d.r), UnmarshalOptions: d.m.UnmarshalOptions}}.Decode(v)
}

// testHookDecodedCreate, if set, is called when decodeCreate decoded a
// create (tests: that the body reached it, as restBody).
var testHookDecodedCreate func()

// decodeCreate decodes b, a CreateMultiCardPaymentRequest as the REST API
// takes it, into req, which must be empty, and reports true, if b is
// exactly one JSON object of the request's fields (by their JSON or proto
// names, each at most once) and nothing but JSON whitespace around it;
// its strings hold no escape and are valid UTF-8, and its amount is an
// integer, plain or in a string, that fits an int64. For anything else it
// reports false and leaves req as it was: the gateway's protojson decoder
// decides then.
func decodeCreate(b []byte, req *paymentsv1.CreateMultiCardPaymentRequest) bool {
	s := jsonScan{b: b}
	var (
		money           *paymentsv1.Money
		key             string
		hasMoney, hasKy bool
	)
	ok := s.object(func(name []byte) bool {
		switch string(name) {
		case "amountMoney", "amount_money":
			if hasMoney {
				return false
			}
			hasMoney = true
			money = new(paymentsv1.Money)
			return s.money(money)
		case "idempotencyKey", "idempotency_key":
			if hasKy {
				return false
			}
			hasKy = true
			k, ok := s.str()
			key = string(k)
			return ok
		}
		return false
	})
	if !ok {
		return false
	}
	s.space()
	if s.i != len(s.b) {
		return false
	}
	req.AmountMoney, req.IdempotencyKey = money, key
	return true
}

// jsonScan reads the JSON that decodeCreate takes; every method reports
// false on anything else.
type jsonScan struct {
	b []byte
	i int
}

// space skips JSON whitespace.
func (s *jsonScan) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// next skips whitespace and reports whether c comes next, consuming it.
func (s *jsonScan) next(c byte) bool {
	s.space()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// object reads an object, calling member for each member's name with the
// scan at its value (past the colon), which member must read.
func (s *jsonScan) object(member func(name []byte) bool) bool {
	if !s.next('{') {
		return false
	}
	if s.next('}') {
		return true
	}
	for {
		s.space()
		name, ok := s.str()
		if !ok || !s.next(':') {
			return false
		}
		s.space()
		if !member(name) {
			return false
		}
		if s.next(',') {
			continue
		}
		return s.next('}')
	}
}

// money reads a Money object into m.
func (s *jsonScan) money(m *paymentsv1.Money) bool {
	var hasCurrency, hasAmount bool
	return s.object(func(name []byte) bool {
		switch string(name) {
		case "currency":
			if hasCurrency {
				return false
			}
			hasCurrency = true
			c, ok := s.str()
			m.Currency = string(c)
			return ok
		case "amount":
			if hasAmount {
				return false
			}
			hasAmount = true
			var ok bool
			m.Amount, ok = s.int64()
			return ok
		}
		return false
	})
}

// str reads a string with no escape, of valid UTF-8, and returns its
// content, which aliases the input.
func (s *jsonScan) str() ([]byte, bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false
	}
	start := s.i + 1
	ascii := true
	for i := start; i < len(s.b); i++ {
		switch c := s.b[i]; {
		case c == '"':
			v := s.b[start:i]
			if !ascii && !utf8.Valid(v) {
				return nil, false
			}
			s.i = i + 1
			return v, true
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, false
}

// int64 reads an integer that fits an int64, as a JSON number with
// neither fraction nor exponent, or as a string of the same digits.
func (s *jsonScan) int64() (int64, bool) {
	if s.i < len(s.b) && s.b[s.i] == '"' {
		digits, ok := s.str()
		if !ok {
			return 0, false
		}
		n, rest, ok := parseInt64(digits)
		return n, ok && len(rest) == 0
	}
	n, rest, ok := parseInt64(s.b[s.i:])
	s.i = len(s.b) - len(rest)
	return n, ok
}

// parseInt64 reads -?(0|[1-9][0-9]*) from the start of b, as an int64,
// and returns what follows it.
func parseInt64(b []byte) (int64, []byte, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || b[0] < '0' || b[0] > '9' {
		return 0, b, false
	}
	if b[0] == '0' {
		return 0, b[1:], true
	}
	// The magnitude, up to 2^63 for a negative number.
	limit := uint64(1) << 63
	if !neg {
		limit--
	}
	var u uint64
	i := 0
	for ; i < len(b) && '0' <= b[i] && b[i] <= '9'; i++ {
		d := uint64(b[i] - '0')
		if u > (limit-d)/10 {
			return 0, b[i:], false
		}
		u = u*10 + d
	}
	if neg {
		return -int64(u), b[i:], true
	}
	return int64(u), b[i:], true
}
