package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"example.com/paymentsd/internal/store"
)

// checkReplyBelongs refuses, INVALID_ARGUMENT with a BadRequest field
// violation, a resolution's reply (already known to be a JSON object) that
// names another payment than key's record: a top-level idempotencyKey,
// amountMoney.amount or amountMoney.currency that is not the record's.
// The provider's reply shape is not documented, so a reply that names none
// of them passes; one that names any must name it once, as the record has
// it. A record that can't be read is answered as Resolve would answer it.
func (s *Service) checkReplyBelongs(ctx context.Context, key string, reply []byte) error {
	rec, err := s.store.Get(ctx, key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return status.Errorf(codes.NotFound, "paymentsd has no record of idempotency key %s in the %s environment", quoteKey(key), envName(s.env))
	case err != nil:
		return s.lookupError(ctx, err)
	}
	if field, why := replyMismatch(reply, rec.Key, rec.Currency, rec.Amount); field != "" {
		return badRequest(field, why+": reply_json must be this payment's reply; nothing was changed")
	}
	return nil
}

// replyMismatch returns the first field of reply, a JSON object, that
// names another payment than key's for amount in currency, and why; ""
// if none does.
func replyMismatch(reply []byte, key, currency string, amount int64) (field, why string) {
	d := json.NewDecoder(bytes.NewReader(reply))
	d.UseNumber()
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return "reply_json", "must be a JSON object"
	}
	seen := map[string]bool{}
	for d.More() {
		name, err := objectKey(d)
		if err != nil {
			return "reply_json", "must be a JSON object"
		}
		switch name {
		case "idempotencyKey":
			const f = "reply_json.idempotencyKey"
			if seen[name] {
				return f, "named more than once"
			}
			seen[name] = true
			var v any
			if err := d.Decode(&v); err != nil {
				return f, "can't be read"
			}
			if got, ok := v.(string); !ok || got != key {
				return f, "is not this payment's idempotency key"
			}
		case "amountMoney":
			if seen[name] {
				return "reply_json.amountMoney", "named more than once"
			}
			seen[name] = true
			if field, why := moneyMismatch(d, currency, amount); field != "" {
				return field, why
			}
		default:
			var skip json.RawMessage
			if err := d.Decode(&skip); err != nil {
				return "reply_json", "must be a JSON object"
			}
		}
	}
	return "", ""
}

// moneyMismatch reads amountMoney's value from d and compares it with
// the record's.
func moneyMismatch(d *json.Decoder, currency string, amount int64) (field, why string) {
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return "reply_json.amountMoney", "must be an object holding this payment's amount and currency"
	}
	seen := map[string]bool{}
	for d.More() {
		name, err := objectKey(d)
		if err != nil {
			return "reply_json.amountMoney", "must be an object"
		}
		var v any
		if err := d.Decode(&v); err != nil {
			return "reply_json.amountMoney", "must be an object"
		}
		switch name {
		case "amount":
			const f = "reply_json.amountMoney.amount"
			if seen[name] {
				return f, "named more than once"
			}
			seen[name] = true
			n, ok := v.(json.Number)
			if !ok {
				return f, "must be a JSON number"
			}
			if !numberIs(string(n), amount) {
				return f, "is not this payment's amount (" + strconv.FormatInt(amount, 10) + ")"
			}
		case "currency":
			const f = "reply_json.amountMoney.currency"
			if seen[name] {
				return f, "named more than once"
			}
			seen[name] = true
			if got, ok := v.(string); !ok || got != currency {
				return f, "is not this payment's currency (" + currency + ")"
			}
		}
	}
	if _, err := d.Token(); err != nil && err != io.EOF {
		return "reply_json.amountMoney", "must be an object"
	}
	return "", ""
}

// objectKey reads an object's next member name from d.
func objectKey(d *json.Decoder) (string, error) {
	tok, err := d.Token()
	if err != nil {
		return "", err
	}
	name, ok := tok.(string)
	if !ok {
		return "", errors.New("not a member name")
	}
	return name, nil
}

// numberIs reports whether lit, a JSON number as written, equals want
// exactly: 1e3, 1000.0 and 10000e-1 are 1000; 1000.5 and 1e400 are not.
// It compares decimal digits, so no literal, however long, is rounded or
// expanded.
func numberIs(lit string, want int64) bool {
	neg := strings.HasPrefix(lit, "-")
	lit = strings.TrimPrefix(lit, "-")
	mant, expPart, _ := strings.Cut(strings.ToLower(lit), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return want == 0 // 0, -0, 0.0e99
	}
	exp := 0
	if expPart != "" {
		e, err := strconv.Atoi(expPart)
		if err != nil || e > 1<<20 || e < -(1<<20) {
			return false // no int64 is that far from 1
		}
		exp = e
	}
	exp -= len(frac)
	trimmed := strings.TrimRight(digits, "0")
	exp += len(digits) - len(trimmed)

	w := strconv.FormatInt(want, 10)
	wneg := strings.HasPrefix(w, "-")
	w = strings.TrimPrefix(w, "-")
	wt := strings.TrimRight(w, "0")
	wexp := len(w) - len(wt)
	return neg == wneg && trimmed == wt && exp == wexp
}
