package service

import (
	"bytes"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// createBodies are CreateMultiCardPayment bodies: as callers send them,
// and ones decodeCreate must leave to protojson, which refuses some of
// them and reads others.
var createBodies = []string{
	`{"amountMoney":{"currency":"USD","amount":1250},"idempotencyKey":"order-1234"}`,
	`{"idempotencyKey":"order-1234","amountMoney":{"amount":1250,"currency":"USD"}}`,
	`{"amount_money":{"currency":"EUR","amount":-5},"idempotency_key":"k"}`,
	"{\n  \"amountMoney\": {\n    \"currency\": \"USD\",\n    \"amount\": \"1250\"\n  },\n  \"idempotencyKey\": \"order-1234\"\n}\n",
	" \t\r\n{ } \t\r\n",
	`{"amountMoney":{}}`,
	`{"idempotencyKey":""}`,
	`{"amountMoney":{"currency":"USD","amount":"9223372036854775807"},"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":-9223372036854775808},"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":9223372036854775808},"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":-9223372036854775809},"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":"-0"},"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":-0},"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":0},"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":01},"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":"01"},"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":" 1"},"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":1e3},"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":"1e3"},"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":1.0},"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":1.5},"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":-},"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":true},"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":null},"idempotencyKey":"k"}`,
	`{"amountMoney":null,"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":null}`,
	`{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k","extra":1}`,
	`{"amountMoney":{"currency":"USD","amount":1,"cents":5},"idempotencyKey":"k"}`,
	`{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k","amountMony":1}`,
	`{"amountMoney":{"currency":"USD","amount":1},"amount_money":{"currency":"USD","amount":1}}`,
	`{"idempotencyKey":"a","idempotency_key":"b"}`,
	`{"idempotencyKey":"a","idempotencyKey":"a"}`,
	`{"amountMoney":{"currency":"USD","currency":"EUR"}}`,
	`{"amountMoney":{"amount":1,"amount":1}}`,
	`{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k",}`,
	`{,"idempotencyKey":"k"}`,
	`{"idempotencyKey":"k"}{"idempotencyKey":"k"}`,
	`{"idempotencyKey":"k"} x`,
	`{"idempotencyKey":"k"}}`,
	`{"idempotencyKey" "k"}`,
	`{"idempotencyKey":"k"`,
	`{"idempotencyKey":"k\u0000"}`,
	`{"idempotencyKey":"k\"q"}`,
	`{"idempotencyKey":"\u00e9"}`,
	"{\"idempotencyKey\":\"k\r\n\"}",
	"{\"idempotencyKey\":\"a\tb\"}",
	"{\"idempotencyKey\":\"\x7f\"}",
	`{"idempotencyKey":"Grüße 支払い 😀"}`,
	"{\"idempotencyKey\":\"\xff\xfe\"}",
	"{\"idempotencyKey\":\"\xed\xa0\x80\"}",
	`{"amount\u004doney":{"currency":"USD","amount":1}}`,
	`{"AmountMoney":{"currency":"USD","amount":1}}`,
	"\xef\xbb\xbf{}",
	"{}\x00",
	"{}\f",
	`[]`, `null`, ``, ` `, `{`, `"x"`, `1`,
}

// TestDecodeCreateTakesWhatCallersSend: the bodies callers send (the
// API's examples, either field spelling, the amount as a number or a
// string, any order, pretty-printed) are decoded by decodeCreate, not
// left to protojson.
func TestDecodeCreateTakesWhatCallersSend(t *testing.T) {
	for _, body := range createBodies[:9] {
		var req paymentsv1.CreateMultiCardPaymentRequest
		if !decodeCreate([]byte(body), &req) {
			t.Errorf("decodeCreate(%q) left it to protojson", body)
		}
	}
}

// TestDecodeCreateMatchesProtojson: what decodeCreate takes, the gateway's
// decoder takes too, with the same result; what it leaves, it leaves
// untouched, and the gateway's decoder reads it (as REST always has).
func TestDecodeCreateMatchesProtojson(t *testing.T) {
	for _, body := range createBodies {
		checkDecodeCreate(t, []byte(body))
	}
}

// FuzzDecodeCreate is TestDecodeCreateMatchesProtojson for any body.
func FuzzDecodeCreate(f *testing.F) {
	for _, body := range createBodies {
		f.Add([]byte(body))
	}
	f.Fuzz(checkDecodeCreate)
}

func checkDecodeCreate(t *testing.T, body []byte) {
	var fast paymentsv1.CreateMultiCardPaymentRequest
	took := decodeCreate(body, &fast)
	if !took {
		if !proto.Equal(&fast, &paymentsv1.CreateMultiCardPaymentRequest{}) {
			t.Fatalf("decodeCreate(%q) = false, but set the request to %v", body, &fast)
		}
		return
	}
	// The gateway's decoder, as restJSON used it before decodeCreate: the
	// body through an io.Reader that is not a restBody.
	var slow paymentsv1.CreateMultiCardPaymentRequest
	if err := restJSON.NewDecoder(bytes.NewReader(body)).Decode(&slow); err != nil {
		t.Fatalf("decodeCreate(%q) took a body the gateway's decoder refuses: %v", body, err)
	}
	if !proto.Equal(&fast, &slow) {
		t.Fatalf("decodeCreate(%q) = %v, the gateway's decoder %v", body, &fast, &slow)
	}
	// And protojson alone, as the gateway's marshaler is configured.
	var pj paymentsv1.CreateMultiCardPaymentRequest
	if err := restJSON.UnmarshalOptions.Unmarshal(bytes.TrimSpace(body), &pj); err != nil {
		t.Fatalf("decodeCreate(%q) took a body protojson refuses: %v", body, err)
	}
	if !proto.Equal(&fast, &pj) {
		t.Fatalf("decodeCreate(%q) = %v, protojson %v", body, &fast, &pj)
	}
	// Through restDecoder, the bytes of a restBody.
	var viaBody paymentsv1.CreateMultiCardPaymentRequest
	rb := &restBody{b: body}
	if err := restJSON.NewDecoder(rb).Decode(&viaBody); err != nil || !proto.Equal(&fast, &viaBody) {
		t.Fatalf("restDecoder(%q) = %v, %v; decodeCreate %v", body, &viaBody, err, &fast)
	}
	if n, _ := rb.Read(make([]byte, 1)); n != 0 {
		t.Fatalf("restDecoder(%q) left bytes of the body unread", body)
	}
}

// TestRestDecoderRefusesAsBefore: a body decodeCreate leaves is refused
// by the gateway's decoder with the same error through a restBody as
// through any reader.
func TestRestDecoderRefusesAsBefore(t *testing.T) {
	for _, body := range createBodies {
		var a, b paymentsv1.CreateMultiCardPaymentRequest
		errA := restJSON.NewDecoder(&restBody{b: []byte(body)}).Decode(&a)
		errB := restJSON.NewDecoder(strings.NewReader(body)).Decode(&b)
		if (errA == nil) != (errB == nil) || (errA != nil && errA.Error() != errB.Error()) || !proto.Equal(&a, &b) {
			t.Errorf("body %q: through a restBody %v, %v; through a reader %v, %v", body, &a, errA, &b, errB)
		}
	}
}
