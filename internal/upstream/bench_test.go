package upstream

import "testing"

// benchReply is a realistic provider reply of about 300 bytes: a payment
// with nested money, two cards and a few strings.
var benchReply = []byte(`{"payment":{"id":"pay_8f2b61c4d0e9","status":"COMPLETED",` +
	`"amountMoney":{"amount":1250,"currency":"USD"},` +
	`"cards":[{"brand":"VISA","last4":"4242","amountMoney":{"amount":750,"currency":"USD"}},` +
	`{"brand":"MASTERCARD","last4":"4444","amountMoney":{"amount":500,"currency":"USD"}}],` +
	`"idempotencyKey":"order-1234-attempt-1"}}`)

func BenchmarkEncodeRequest(b *testing.B) {
	p := Payment{Currency: "USD", Amount: 1250, IdempotencyKey: "order-1234-attempt-1"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := EncodeRequest(p); err != nil {
			b.Fatalf("EncodeRequest(%+v): %v", p, err)
		}
	}
}

func BenchmarkDecodeReply(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(benchReply)))
	for b.Loop() {
		if _, err := DecodeReply(benchReply); err != nil {
			b.Fatalf("DecodeReply(%d bytes): %v", len(benchReply), err)
		}
	}
}

// BenchmarkRedactReply is the redaction every 2xx reply goes through: the
// usual reply, with nothing to redact, and one with escapes but no key.
func BenchmarkRedactReply(b *testing.B) {
	r := newRedactor("sk_live_0123456789abcdef0123")
	escaped := []byte(`{"payment":{"id":"pay_8f2b61c4d0e9","note":"caf\u00e9 \/ 50%25","idempotencyKey":"order-1234-attempt-1"}}`)
	for _, bc := range []struct {
		name string
		body []byte
	}{{"clean", benchReply}, {"escaped", escaped}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.body)))
			for b.Loop() {
				r.redact(bc.body)
			}
		})
	}
}
