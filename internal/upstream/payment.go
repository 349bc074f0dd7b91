package upstream

import (
	"strconv"
	"unicode/utf8"
)

// Payment is a create-payment request, in the provider's terms.
type Payment struct {
	Currency       string
	Amount         int64
	IdempotencyKey string
}

// EncodeRequest returns the provider's request body for p, its documented
// JSON shape:
//
//	{"amountMoney":{"currency":"USD","amount":1250},"idempotencyKey":"order-1234"}
//
// with Amount as an exact JSON integer. The same p always gives the same
// bytes: byte for byte what encoding/json's Marshal writes of that shape
// (FuzzEncodeRequest checks it), which is what paymentsd always sent, so
// that a key's recorded body and its hash are the same whichever version
// encoded it. It is written by hand rather than by Marshal's reflection,
// in one buffer of its size and a shallow stack: it runs on the caller's
// goroutine, which waits on for the provider with the stack it grew.
func EncodeRequest(p Payment) ([]byte, error) {
	const (
		open     = `{"amountMoney":{"currency":`
		amount   = `,"amount":`
		key      = `},"idempotencyKey":`
		maxInt64 = len("-9223372036854775808")
	)
	b := make([]byte, 0, len(open)+len(amount)+len(key)+maxInt64+len(p.Currency)+len(p.IdempotencyKey)+5)
	b = append(b, open...)
	b = appendMarshalString(b, p.Currency)
	b = append(b, amount...)
	b = strconv.AppendInt(b, p.Amount, 10)
	b = append(b, key...)
	b = appendMarshalString(b, p.IdempotencyKey)
	return append(b, '}'), nil
}

// appendMarshalString appends s as a JSON string as encoding/json's Marshal
// writes one: ", \ and the control characters escaped (\b, \f, \n, \r, \t
// by name, the rest as \u00XX), <, > and & as \u003c, \u003e and \u0026,
// U+2028 and U+2029 as \u2028 and \u2029, and each byte of invalid UTF-8 as
// \ufffd.
func appendMarshalString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
