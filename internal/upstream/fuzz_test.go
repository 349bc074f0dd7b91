package upstream_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"example.com/paymentsd/internal/upstream"
)

// FuzzDecodeReply checks that any reply body either decodes to a JSON
// object or is reported as malformed, and never panics.
func FuzzDecodeReply(f *testing.F) {
	for _, seed := range []string{
		`{}`,
		`{"id":"pay_1","status":"COMPLETED","amountMoney":{"currency":"USD","amount":1234}}`,
		`{"cards":[{"last4":"4242","captured":true},{"last4":"0005","captured":false}],"metadata":null}`,
		`{"amount":9007199254740993,"big":1e308,"small":-5e-324}`,
		`{"note":"Zahlung für Café ✓ 日本語 🚀","escaped":"\u00e9\ud83d\ude80\n"}`,
		`[{"id":"pay_1"}]`,
		`"COMPLETED"`,
		`null`,
		`42`,
		`{"id":"pay_1","cards":[{"last4":"4242"`,
		`{"id":"a"}{"id":"b"}`,
		`{"a":1,"a":2}`,
		`{"a":1e400}`,
		"{\"id\":\"\xff\"}",
		"<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>",
		``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := upstream.DecodeReply(b)
		if err != nil {
			if !errors.Is(err, upstream.ErrMalformedReply) {
				t.Fatalf("DecodeReply(%q) error %v, want ErrMalformedReply", b, err)
			}
			if s != nil {
				t.Fatalf("DecodeReply(%q) = %v with error %v, want nil", b, s, err)
			}
			return
		}
		if s == nil {
			t.Fatalf("DecodeReply(%q) = nil, nil", b)
		}
		if !json.Valid(b) {
			t.Fatalf("DecodeReply(%q) accepted invalid JSON", b)
		}
		out, err := protojson.Marshal(s)
		if err != nil {
			t.Fatalf("DecodeReply(%q) = %v, which does not marshal: %v", b, s, err)
		}
		var obj map[string]any
		if !bytes.HasPrefix(bytes.TrimSpace(out), []byte("{")) || json.Unmarshal(out, &obj) != nil {
			t.Fatalf("DecodeReply(%q) re-marshals to %s, not a JSON object", b, out)
		}
		// And it decodes back to the same thing.
		again, err := upstream.DecodeReply(out)
		if err != nil || !proto.Equal(s, again) {
			t.Fatalf("DecodeReply(%q) = %v; its JSON %s decodes to %v, %v", b, s, out, again, err)
		}
	})
}

// FuzzRetryAfter checks that no Retry-After value makes the client wait
// less than nothing or more than its cap.
func FuzzRetryAfter(f *testing.F) {
	for _, seed := range []string{
		"", "0", "1", "120", "3600", "01", "-1", "1.5", "+1", " 1", "99999999999999999999999",
		"Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994",
		"Fri, 31 Dec 9999 23:59:59 GMT",
	} {
		f.Add(seed, int64(10*time.Second))
	}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string, limit int64) {
		if limit <= 0 {
			return // Config never has a cap of zero or less
		}
		d := upstream.RetryAfter(v, now, time.Duration(limit))
		if d < 0 || d > time.Duration(limit) {
			t.Fatalf("retryAfter(%q, limit %v) = %v, want within [0, %v]", v, time.Duration(limit), d, time.Duration(limit))
		}
	})
}

// FuzzCheckReply checks that CheckReply refuses exactly the bodies
// DecodeReply refuses, with the same error: the client judges replies with
// CheckReply and builds the Struct only when asked.
func FuzzCheckReply(f *testing.F) {
	for _, seed := range []string{
		`{}`,
		" \r\n\t{} ",
		`{"id":"pay_1","status":"COMPLETED","amountMoney":{"currency":"USD","amount":1234}}`,
		`{"amount":9007199254740993,"big":1e308,"small":-5e-324,"under":1e-400,"neg":-0}`,
		`{"a":1e400}`,
		`{"a":[1,2,-1.7976931348623159e308]}`,
		`{"a":-1.7976931348623157e308,"b":1.7976931348623157E+308}`,
		`{"s":"1e400","t":"\"1e400","u":"\\","v":1e400}`,
		`{"s":"\\\"","n":[1e400]}`,
		`{"1e400":true}`,
		`{"note":"Zahlung für Café ✓","escaped":"\u00e9\ud83d\ude80\ud800\n"}`,
		`[{"id":"pay_1"}]`,
		`"COMPLETED"`,
		`null`,
		` null `,
		`42`,
		`true`,
		`{"id":"pay_1","cards":[{"last4":"4242"`,
		`{"id":"a"}{"id":"b"}`,
		`{"a":1,"a":2}`,
		"{\"id\":\"\xff\"}",
		``,
		strings.Repeat(`{"a":`, 10001) + `1` + strings.Repeat(`}`, 10001),
		strings.Repeat(`{"a":`, 9999) + `1` + strings.Repeat(`}`, 9999),
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, decodeErr := upstream.DecodeReply(b)
		checkErr := upstream.CheckReply(b)
		if (decodeErr == nil) != (checkErr == nil) || (decodeErr != nil && decodeErr.Error() != checkErr.Error()) {
			t.Fatalf("CheckReply(%q) = %v, DecodeReply's error = %v", b, checkErr, decodeErr)
		}
	})
}

// wireRequest is the provider's documented request body, as
// encoding/json's Marshal wrote it before EncodeRequest was written by
// hand.
type wireRequest struct {
	AmountMoney struct {
		Currency string `json:"currency"`
		Amount   int64  `json:"amount"`
	} `json:"amountMoney"`
	IdempotencyKey string `json:"idempotencyKey"`
}

// FuzzEncodeRequest: EncodeRequest writes exactly what encoding/json's
// Marshal writes of the same request, whatever its strings hold.
func FuzzEncodeRequest(f *testing.F) {
	for _, s := range []struct {
		currency, key string
		amount        int64
	}{
		{"USD", "order-1234", 1250},
		{"EUR", "", -5},
		{"", "k", math.MaxInt64},
		{"usd", "k", math.MinInt64},
		{"U\"S\\D", "<a href='x'>&amp;</a>", 0},
		{"\x00\x01\x1f\x7f\b\f\n\r\t", "\u2028\u2029\u2027\u202a", 1},
		{"\xff\xfe", "a\xc3", 2},
		{"Grüße", "支払い 😀", 3},
		{"\xed\xa0\x80", "\xf4\x90\x80\x80", 4},
	} {
		f.Add(s.currency, s.key, s.amount)
	}
	f.Fuzz(func(t *testing.T, currency, key string, amount int64) {
		got, err := upstream.EncodeRequest(upstream.Payment{Currency: currency, Amount: amount, IdempotencyKey: key})
		if err != nil {
			t.Fatal(err)
		}
		var w wireRequest
		w.AmountMoney.Currency, w.AmountMoney.Amount, w.IdempotencyKey = currency, amount, key
		want, err := json.Marshal(&w)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("EncodeRequest(%q, %d, %q) = %s, encoding/json %s", currency, amount, key, got, want)
		}
	})
}
