package service

import "testing"

func TestNumberIs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		lit  string
		want int64
		is   bool
	}{
		{"100", 100, true},
		{"100.0", 100, true},
		{"1e2", 100, true},
		{"1E+2", 100, true},
		{"10000e-2", 100, true},
		{"0.1e3", 100, true},
		{"100.5", 100, false},
		{"1e1", 100, false},
		{"-100", -100, true},
		{"-100", 100, false},
		{"0", 0, true},
		{"-0.0e5", 0, true},
		{"0e99999999999999999999", 0, true},
		{"1e99999999999999999999", 100, false},
		{"1e-99999999999999999999", 0, false},
		{"9223372036854775807", 9223372036854775807, true},
		{"9223372036854775808", 9223372036854775807, false},
		{"-9223372036854775808", -9223372036854775808, true},
		{"92233720368547758070e-1", 9223372036854775807, true},
		{"0000000000000000000000000000100", 100, true},
		{"100.00000000000000000000000000001", 100, false},
	} {
		if got := numberIs(tc.lit, tc.want); got != tc.is {
			t.Errorf("numberIs(%s, %d) = %v, want %v", tc.lit, tc.want, got, tc.is)
		}
	}
}

func TestReplyMismatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		reply, field string
	}{
		{`{}`, ""},
		{`{"id":"p1","status":"COMPLETED"}`, ""},
		{`{"idempotencyKey":"k","amountMoney":{"amount":1250,"currency":"USD"}}`, ""},
		{`{"amountMoney":{"amount":1.25e3}}`, ""},
		{`{"nested":{"idempotencyKey":"other"}}`, ""},
		{`{"idempotencyKey":"other"}`, "reply_json.idempotencyKey"},
		{`{"idempotencyKey":"K"}`, "reply_json.idempotencyKey"},
		{`{"idempotencyKey":null}`, "reply_json.idempotencyKey"},
		{`{"idempotencyKey":"k","idempotencyKey":"k"}`, "reply_json.idempotencyKey"},
		{`{"idempotency\u004bey":"other"}`, "reply_json.idempotencyKey"},
		{`{"amountMoney":{"amount":"1250"}}`, "reply_json.amountMoney.amount"},
		{`{"amountMoney":{"amount":1250.5}}`, "reply_json.amountMoney.amount"},
		{`{"amountMoney":{"amount":1250,"amount":99}}`, "reply_json.amountMoney.amount"},
		{`{"amountMoney":{"amount":99999999999999999999999999}}`, "reply_json.amountMoney.amount"},
		{`{"amountMoney":{"currency":"usd"}}`, "reply_json.amountMoney.currency"},
		{`{"amountMoney":{"currency":1}}`, "reply_json.amountMoney.currency"},
		{`{"amountMoney":"USD 12.50"}`, "reply_json.amountMoney"},
		{`{"amountMoney":null}`, "reply_json.amountMoney"},
		{`{"amountMoney":{},"amountMoney":{"amount":1}}`, "reply_json.amountMoney"},
		{`{"amountMoney":{"amount":1250},"idempotencyKey":"other"}`, "reply_json.idempotencyKey"},
	} {
		if got, _ := replyMismatch([]byte(tc.reply), "k", "USD", 1250); got != tc.field {
			t.Errorf("replyMismatch(%s) = %q, want %q", tc.reply, got, tc.field)
		}
	}
}
