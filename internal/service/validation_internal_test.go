package service

import (
	"testing"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"buf.build/go/protovalidate"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// TestCreateRulesAreKnown pins the protovalidate rules of
// CreateMultiCardPaymentRequest that keepsCreateRules checks by hand: a
// rule added, changed or removed in payments.proto fails here, until
// keepsCreateRules (and this test) say the same.
func TestCreateRulesAreKnown(t *testing.T) {
	want := map[protoreflect.FullName]string{
		"payments.v1.CreateMultiCardPaymentRequest.amount_money":    `required:true`,
		"payments.v1.CreateMultiCardPaymentRequest.idempotency_key": `string:{min_len:1 pattern:"^[^\\x00-\\x1f\\x7f]*$"}`,
		"payments.v1.Money.currency":                                `string:{pattern:"^[A-Z]+$"}`,
		"payments.v1.Money.amount":                                  ``,
	}
	got := map[protoreflect.FullName]string{}
	for _, md := range []protoreflect.MessageDescriptor{
		(&paymentsv1.CreateMultiCardPaymentRequest{}).ProtoReflect().Descriptor(),
		(&paymentsv1.Money{}).ProtoReflect().Descriptor(),
	} {
		if rules := proto.GetExtension(md.Options(), validate.E_Message).(*validate.MessageRules); proto.Size(rules) > 0 {
			t.Errorf("%s has message rules %v, which keepsCreateRules does not check", md.FullName(), rules)
		}
		for i := range md.Oneofs().Len() {
			od := md.Oneofs().Get(i)
			if rules := proto.GetExtension(od.Options(), validate.E_Oneof).(*validate.OneofRules); proto.Size(rules) > 0 {
				t.Errorf("%s has oneof rules %v, which keepsCreateRules does not check", od.FullName(), rules)
			}
		}
		for i := range md.Fields().Len() {
			fd := md.Fields().Get(i)
			rules := proto.GetExtension(fd.Options(), validate.E_Field).(*validate.FieldRules)
			if rules == nil {
				rules = &validate.FieldRules{}
			}
			b, err := prototext.MarshalOptions{}.Marshal(rules)
			if err != nil {
				t.Fatal(err)
			}
			// prototext's spacing is not stable: compare the messages.
			var norm validate.FieldRules
			if err := prototext.Unmarshal([]byte(want[fd.FullName()]), &norm); err != nil {
				t.Fatalf("%s: %v", fd.FullName(), err)
			}
			if !proto.Equal(rules, &norm) {
				t.Errorf("%s's rules are %s, keepsCreateRules checks %s: update it", fd.FullName(), b, want[fd.FullName()])
			}
			got[fd.FullName()] = string(b)
		}
	}
	for name := range want {
		if _, ok := got[name]; !ok {
			t.Errorf("%s is gone: update keepsCreateRules", name)
		}
	}
}

// FuzzKeepsCreateRules: keepsCreateRules says a request keeps its rules
// exactly when protovalidate finds no violation.
func FuzzKeepsCreateRules(f *testing.F) {
	for _, s := range []struct {
		currency, key string
		money         bool
	}{
		{"USD", "order-1234", true},
		{"USD", "order-1234", false},
		{"", "k", true},
		{"usd", "k", true},
		{"US1", "k", true},
		{"USD", "", true},
		{"USD", "k\x00", true},
		{"USD", "k\x1f", true},
		{"USD", "\x7f", true},
		{"USD", "a\tb", true},
		{"USD", "\x80\xff", true},
		{"USD", "Grüße 支払い 😀", true},
		{"ÜSD", "k", true},
		{"USD", "\u0085\u2028", true},
	} {
		f.Add(s.currency, s.key, s.money, int64(1250))
	}
	validator, err := protovalidate.New()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, currency, key string, money bool, amount int64) {
		r := &paymentsv1.CreateMultiCardPaymentRequest{IdempotencyKey: key}
		if money {
			r.AmountMoney = &paymentsv1.Money{Currency: currency, Amount: amount}
		}
		verr := validator.Validate(r)
		if got := keepsCreateRules(r); got != (verr == nil) {
			t.Fatalf("keepsCreateRules(%v) = %v; protovalidate: %v", r, got, verr)
		}
	})
}
