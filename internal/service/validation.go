package service

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"buf.build/go/protovalidate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// validationError is nil if req keeps its protovalidate rules, and
// otherwise INVALID_ARGUMENT saying which fields are wrong and how, in the
// names the caller used (JSON names over REST, proto names over gRPC),
// with a google.rpc.BadRequest naming each field by its proto path, as
// google.rpc.BadRequest does.
func validationError(ctx context.Context, validator protovalidate.Validator, req any) error {
	msg, ok := req.(proto.Message)
	if !ok {
		return status.Error(codes.Internal, "paymentsd could not check the request")
	}
	err := validator.Validate(msg)
	if err == nil {
		return nil
	}
	var valErr *protovalidate.ValidationError
	if !errors.As(err, &valErr) {
		// A rule's CEL expression doesn't compile or type-check: the
		// fault is paymentsd's.
		return status.Error(codes.Internal, "paymentsd could not check the request: "+err.Error())
	}
	jsonNames := overREST(ctx)
	var problems []string
	br := &errdetails.BadRequest{}
	for _, v := range valErr.Violations {
		what := describeViolation(v, leafField(msg.ProtoReflect().Descriptor(), v.Proto.GetField()))
		name := protovalidate.FieldPathString(v.Proto.GetField())
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: name, Description: what})
		if jsonNames {
			name = jsonPath(msg.ProtoReflect().Descriptor(), v.Proto.GetField())
		}
		problems = append(problems, name+" "+what)
	}
	st := status.New(codes.InvalidArgument, "the request is invalid: "+strings.Join(problems, "; "))
	return withDetails(st, br)
}

// keepsCreateRules reports whether r keeps CreateMultiCardPaymentRequest's
// protovalidate rules (payments.proto): an amount_money, whose currency is
// one or more of A-Z, and an idempotency_key that is not empty and holds
// no ASCII control character (U+0000 to U+001F, U+007F). It answers as
// protovalidate would (FuzzKeepsCreateRules), without its interpreter and
// regular expressions, whose frames were the deepest a payment's handler
// goroutine went, and so set the size of its stack for as long as the
// provider takes; for a request that does not keep them, the chain asks
// protovalidate, which words the refusal. TestCreateRulesAreKnown fails if
// the proto's rules change.
func keepsCreateRules(r *paymentsv1.CreateMultiCardPaymentRequest) bool {
	money := r.GetAmountMoney()
	currency, key := money.GetCurrency(), r.GetIdempotencyKey()
	if money == nil || currency == "" || key == "" {
		return false
	}
	for i := 0; i < len(currency); i++ {
		if c := currency[i]; c < 'A' || c > 'Z' {
			return false
		}
	}
	// Byte by byte: no byte of a multi-byte UTF-8 sequence, nor of invalid
	// UTF-8 (which the pattern reads as U+FFFD), is under 0x80.
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

// describeViolation says what is wrong with field fd, for a person: what
// protovalidate says, but without its regular expressions and enum
// numbers.
func describeViolation(v *protovalidate.Violation, fd protoreflect.FieldDescriptor) string {
	switch v.Proto.GetRuleId() {
	case "required":
		return "is required"
	case "string.min_len":
		if v.RuleValue.IsValid() && v.RuleValue.Uint() == 1 {
			return "must not be empty"
		}
	case "string.pattern":
		if fd == nil {
			break
		}
		switch fd.Name() {
		case "currency":
			return "must be one or more capital letters A to Z, such as USD"
		case "evidence":
			return "must not hold control characters other than tab and newline"
		default:
			return "must not hold control characters"
		}
	case "enum.defined_only", "enum.not_in":
		if fd != nil && fd.Enum() != nil {
			var names []string
			values := fd.Enum().Values()
			for i := range values.Len() {
				if values.Get(i).Number() != 0 {
					names = append(names, string(values.Get(i).Name()))
				}
			}
			return "must be one of " + strings.Join(names, ", ")
		}
	}
	msg := v.Proto.GetMessage()
	if fd != nil {
		// A rule of the proto's own names its field: don't name it twice.
		msg = strings.TrimPrefix(msg, string(fd.Name())+" ")
	}
	return msg
}

// leafField is the field path leads to (protovalidate gives none for a
// list's items), or nil.
func leafField(md protoreflect.MessageDescriptor, path *validate.FieldPath) protoreflect.FieldDescriptor {
	var fd protoreflect.FieldDescriptor
	for _, el := range path.GetElements() {
		if md == nil {
			return nil
		}
		fd = md.Fields().ByNumber(protoreflect.FieldNumber(el.GetFieldNumber()))
		if fd == nil {
			return nil
		}
		md = fd.Message()
	}
	return fd
}

// jsonPath is path in JSON names (amountMoney.currency), as REST callers
// send the fields.
func jsonPath(md protoreflect.MessageDescriptor, path *validate.FieldPath) string {
	var b strings.Builder
	for i, el := range path.GetElements() {
		if i > 0 {
			b.WriteByte('.')
		}
		name := el.GetFieldName()
		var fd protoreflect.FieldDescriptor
		if md != nil {
			fd = md.Fields().ByNumber(protoreflect.FieldNumber(el.GetFieldNumber()))
		}
		md = nil
		if fd != nil {
			name = fd.JSONName()
			md = fd.Message()
		}
		b.WriteString(name)
		if el.WhichSubscript() == validate.FieldPathElement_Index_case {
			fmt.Fprintf(&b, "[%d]", el.GetIndex())
		}
	}
	return b.String()
}

// validateStream checks each message a stream receives, as the unary
// chain checks a call's request.
func validateStream(validator protovalidate.Validator) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, validatingStream{ServerStream: ss, validator: validator})
	}
}

type validatingStream struct {
	grpc.ServerStream
	validator protovalidate.Validator
}

func (s validatingStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return validationError(s.Context(), s.validator, m)
}

// The gateway's words for a REST request it could not read, which are
// Go's and protobuf's (strconv, time layouts, protojson's line positions).
var (
	queryError     = regexp.MustCompile(`^parsing (?:field|list) "([^"]+)": (.*)$`)
	numberError    = regexp.MustCompile(`^strconv\.Parse(Int|Uint|Float|Bool): parsing "(.*)": (invalid syntax|value out of range)$`)
	timeError      = regexp.MustCompile(`^parsing time "(.*?)" as "`)
	enumValueError = regexp.MustCompile(`^"(.*)" is not a valid value$`)
	bodyError      = regexp.MustCompile(`^proto:[ \x{00a0}](?:syntax error )?\(line (\d+):(\d+)\): (.*)$`)
	fieldValue     = regexp.MustCompile(`^invalid value for (\w+) (?:field|type) ([\w.]+): (.*)$`)
)

// decodeErrorMessage is what the gateway said of a REST request it could
// not read (its body, or a query parameter), in the caller's terms.
func decodeErrorMessage(msg string) string {
	if m := queryError.FindStringSubmatch(msg); m != nil {
		param, what := jsonName(m[1]), m[2]
		switch n := numberError.FindStringSubmatch(what); {
		case n != nil && n[3] == "value out of range":
			what = quoteValue(n[2]) + " is out of range"
		case n != nil && n[1] == "Bool":
			what = quoteValue(n[2]) + " is not true or false"
		case n != nil && n[1] == "Float":
			what = quoteValue(n[2]) + " is not a number"
		case n != nil:
			what = quoteValue(n[2]) + " is not a whole number"
		}
		if t := timeError.FindStringSubmatch(what); t != nil {
			what = quoteValue(t[1]) + " is not an RFC 3339 time, such as 2026-11-23T09:00:00Z"
		}
		if e := enumValueError.FindStringSubmatch(what); e != nil {
			what = quoteValue(e[1]) + " is not one of its values"
		}
		return "query parameter " + param + ": " + what
	}
	if m := bodyError.FindStringSubmatch(msg); m != nil {
		what := m[3]
		if f := fieldValue.FindStringSubmatch(what); f != nil {
			what = f[2] + ": " + cut(f[3]) + " is not " + kindText(f[1])
		}
		return fmt.Sprintf("the request body could not be read: %s (line %s, column %s)", what, m[1], m[2])
	}
	switch {
	case msg == "unexpected EOF", msg == "EOF":
		return "the request body is not complete JSON: it ends before its value does"
	case strings.HasPrefix(msg, "invalid character "), strings.HasPrefix(msg, "json: "):
		return "the request body is not valid JSON: " + strings.TrimPrefix(msg, "json: ")
	}
	return msg
}

// maxValueInMessage bounds how much of a caller's value a message
// repeats.
const maxValueInMessage = 64

// quoteValue quotes a caller's value for a message, cut to a bounded
// prefix.
func quoteValue(v string) string {
	if len(v) > maxValueInMessage {
		return strconv.Quote(strings.ToValidUTF8(v[:maxValueInMessage], "")) + "…"
	}
	return strconv.Quote(v)
}

// cut is a value as protojson wrote it (quoted or not), cut to a bounded
// prefix.
func cut(v string) string {
	if len(v) > maxValueInMessage {
		return strings.ToValidUTF8(v[:maxValueInMessage], "") + "…"
	}
	return v
}

// kindText says what a JSON value of a protobuf kind must be.
func kindText(kind string) string {
	switch {
	case strings.Contains(kind, "int") || strings.Contains(kind, "fixed"):
		return "a whole number (a JSON number, or a string of digits)"
	case kind == "float" || kind == "double":
		return "a number"
	case kind == "bool":
		return "true or false"
	case kind == "string":
		return "a string"
	case kind == "bytes":
		return "base64"
	case kind == "enum":
		return "one of its values' names"
	case strings.HasPrefix(kind, "google.protobuf.Timestamp"):
		return "an RFC 3339 time, such as 2026-11-23T09:00:00Z"
	}
	return "a valid value"
}

// jsonName is a proto field name as JSON writes it: created_after is
// createdAfter.
func jsonName(name string) string {
	var b strings.Builder
	upper := false
	for _, r := range name {
		switch {
		case r == '_':
			upper = true
		case upper && r >= 'a' && r <= 'z':
			b.WriteRune(r - 'a' + 'A')
			upper = false
		default:
			b.WriteRune(r)
			upper = false
		}
	}
	return b.String()
}
