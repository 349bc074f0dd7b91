package service

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// REST idempotency conventions (draft-ietf-httpapi-idempotency-key-header):
// POST /v1/multi-card-payments takes the key in an Idempotency-Key header
// as well as in the body, and a replayed answer says so in a header.
const (
	// IdempotencyKeyHeader carries a REST call's idempotency key.
	IdempotencyKeyHeader = "Idempotency-Key"
	// IdempotentReplayedHeader is "true" on an answer replayed from the
	// key's record.
	IdempotentReplayedHeader = "Idempotent-Replayed"
)

// headerKey returns the idempotency key in a request's Idempotency-Key
// header values, and whether there was one. The draft makes the value a
// Structured Field string ("…", with \" and \\ escapes); a value not in
// double quotes is taken as it is, as most clients send it. Either way the
// key must pass the body key's rules: valid UTF-8, not empty, no ASCII
// control characters.
func headerKey(values []string) (key string, present bool, err error) {
	switch len(values) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", true, fmt.Errorf("the request has %d %s headers; send one", len(values), IdempotencyKeyHeader)
	}
	v := values[0]
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		if v, err = unquoteSFString(v[1 : len(v)-1]); err != nil {
			return "", true, err
		}
	}
	if v == "" {
		return "", true, fmt.Errorf("the %s header is empty; send the payment's idempotency key in it", IdempotencyKeyHeader)
	}
	if !utf8.ValidString(v) {
		// A key travels to the provider in JSON, where invalid UTF-8
		// becomes U+FFFD: two keys paymentsd tells apart would be one
		// key at the provider. A body's key is always valid UTF-8.
		return "", true, fmt.Errorf("the %s header is not valid UTF-8; send the key as UTF-8, or as a quoted ASCII string", IdempotencyKeyHeader)
	}
	if strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return "", true, fmt.Errorf("the %s header holds an ASCII control character, which an idempotency key may not", IdempotencyKeyHeader)
	}
	return v, true, nil
}

// unquoteSFString reads the inside of a Structured Field string (RFC 8941
// section 3.3.3): printable ASCII, with \" and \\ escapes.
func unquoteSFString(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			i++
			if i == len(s) || (s[i] != '"' && s[i] != '\\') {
				return "", fmt.Errorf("the %s header is a quoted string with a backslash not followed by \" or \\", IdempotencyKeyHeader)
			}
			b.WriteByte(s[i])
		case c == '"':
			return "", fmt.Errorf("the %s header is a quoted string with an unescaped \" inside", IdempotencyKeyHeader)
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("the %s header is a quoted string with a character outside printable ASCII", IdempotencyKeyHeader)
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// applyHeaderKey reconciles a REST CreateMultiCardPayment request with
// its Idempotency-Key header, if any: with no key in the body the
// header's is used; a different key in the body is refused
// (INVALID_ARGUMENT, REQUEST_NOT_SENT, a field violation naming both
// places), as is a header that can't hold a key. req is the gateway's own
// copy of the body.
func applyHeaderKey(ctx context.Context, env paymentsv1.Environment, req *paymentsv1.CreateMultiCardPaymentRequest) error {
	c := restCallOf(ctx)
	if c == nil {
		return nil
	}
	key, present, err := headerKey(c.idempotencyKeys)
	switch {
	case !present:
		return nil
	case err != nil:
		return headerKeyRefusal(env, err.Error(), &errdetails.BadRequest_FieldViolation{
			Field:       IdempotencyKeyHeader,
			Description: err.Error(),
		})
	case req.GetIdempotencyKey() == "":
		req.IdempotencyKey = key
		return nil
	case req.GetIdempotencyKey() != key:
		msg := fmt.Sprintf("the body's idempotencyKey %s differs from the %s header's %s; send one key, in either place or the same in both", quoteKey(req.GetIdempotencyKey()), IdempotencyKeyHeader, quoteKey(key))
		return headerKeyRefusal(env, msg,
			&errdetails.BadRequest_FieldViolation{Field: "idempotency_key", Description: "differs from the " + IdempotencyKeyHeader + " header"},
			&errdetails.BadRequest_FieldViolation{Field: IdempotencyKeyHeader, Description: "differs from the body's idempotencyKey"},
		)
	}
	return nil
}

// noKeyError is validation's refusal of a REST CreateMultiCardPayment
// call with no key in the body or a header, saying that the key may come
// in either: validation alone names only the body's field.
func noKeyError(err error) error {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.InvalidArgument {
		return err
	}
	// One BadRequest: validation's, but for its idempotency_key, which
	// now says where else the key may come.
	br := &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
		{Field: "idempotency_key", Description: "missing: give it here or in the " + IdempotencyKeyHeader + " header"},
		{Field: IdempotencyKeyHeader, Description: "missing: give it here or in the body's idempotencyKey"},
	}}
	with := status.New(codes.InvalidArgument, "the request has no idempotency key: send the payment's key in the body's idempotencyKey or in an "+IdempotencyKeyHeader+" header; "+st.Message())
	var details []protoadapt.MessageV1
	for _, d := range st.Details() {
		if v, ok := d.(*errdetails.BadRequest); ok {
			for _, fv := range v.GetFieldViolations() {
				if fv.GetField() != "idempotency_key" {
					br.FieldViolations = append(br.FieldViolations, fv)
				}
			}
			continue
		}
		if m, ok := d.(protoadapt.MessageV1); ok {
			details = append(details, m)
		}
	}
	return withDetails(with, append(details, br)...)
}

func headerKeyRefusal(env paymentsv1.Environment, msg string, violations ...*errdetails.BadRequest_FieldViolation) error {
	st := status.New(codes.InvalidArgument, msg+"; nothing was sent")
	return withDetails(st, notSentInfo(env), &errdetails.BadRequest{FieldViolations: violations})
}

// markReplayed sets Idempotent-Replayed: true on a REST answer replayed
// from the key's record (the gateway's forward-response option).
func markReplayed(_ context.Context, w http.ResponseWriter, m proto.Message) error {
	if r, ok := m.(*paymentsv1.CreateMultiCardPaymentResponse); ok && r.GetReplayed() {
		w.Header().Set(IdempotentReplayedHeader, "true")
	}
	return nil
}
