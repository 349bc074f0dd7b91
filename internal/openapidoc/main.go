// Command openapidoc finishes the OpenAPI document protoc-gen-openapiv2
// makes from the proto, so that it says what the REST API really does;
// .ci/gen runs it after buf generate, on gen/openapi/payments.swagger.json.
// What it adds can't be said in the proto or openapiv2's options without
// being wrong somewhere else:
//
//   - Request bodies get schemas of their own. Over REST amountMoney.amount
//     is sent and accepted as a JSON integer, but every response writes
//     it as a string (proto3 JSON's int64); one Money schema can't say
//     both. Their required fields are what validation refuses without.
//   - Response schemas list as required every field the REST marshaler
//     always writes: every scalar, enum and list (it emits default
//     values), and the message fields that are always set. Message
//     fields that may be unset are left out of the JSON, never null.
//   - Every operation declares the error statuses it can answer, each a
//     google.rpc.Status with its details, and the headers of each answer:
//     X-Request-Id always, Retry-After where a RetryInfo may come.
//   - info.version is devel: GET /openapi.json serves the build's version.
//
// It reads and writes the file in place, and is idempotent.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
)

// errorStatuses are the error statuses each operation (by operationId)
// can answer, as proto/payments/v1/payments.proto's comments give them
// and internal/service/rest.go and internal/service/server.go add (REST's own refusals: 408,
// 413, 415), with why.
var errorStatuses = map[string][]int{
	"PaymentsService_CreateMultiCardPayment":   {400, 401, 403, 404, 408, 409, 413, 415, 422, 429, 499, 500, 501, 503, 504},
	"PaymentsService_GetMultiCardPayment":      {400, 403, 404, 429, 499, 500, 503, 504},
	"PaymentsService_ListMultiCardPayments":    {400, 403, 429, 499, 500, 503, 504},
	"PaymentsService_ResolveMultiCardPayment":  {400, 403, 404, 408, 409, 413, 415, 422, 429, 499, 500, 503, 504},
	"ProviderEventsService_ListProviderEvents": {400, 403, 429, 499, 500, 503, 504},
}

// statusText describes each error status for the document.
var statusText = map[int]string{
	400: "INVALID_ARGUMENT: the request is invalid, or (CreateMultiCardPayment) the provider refused it; the ErrorInfo reason says what happened to the money.",
	401: "UNAUTHENTICATED: the provider refused this deployment's API key.",
	403: "PERMISSION_DENIED: the caller is not allowed (CALLER_NOT_ALLOWED, CALLER_NOT_ADMIN, IDEMPOTENCY_KEY_NOT_OWNED), or the provider refused the key.",
	404: "NOT_FOUND: no record of the key (IDEMPOTENCY_KEY_EXPIRED when retention deleted it), or the provider answered 404.",
	408: "DEADLINE_EXCEEDED: the request body did not arrive within PAYMENTS_HTTP_READ_TIMEOUT; nothing was sent.",
	409: "ABORTED: PAYMENT_IN_PROGRESS (retry after the RetryInfo's delay), or the provider answered 409.",
	413: "INVALID_ARGUMENT: the request body is over PAYMENTS_MAX_REQUEST_BYTES; nothing was sent.",
	415: "INVALID_ARGUMENT: the request body was not sent as application/json; nothing was sent.",
	422: "FAILED_PRECONDITION: IDEMPOTENCY_KEY_REUSED, IDEMPOTENCY_KEY_EXPIRED, RECORD_NOT_UNKNOWN or RECORD_CHANGED.",
	429: "RESOURCE_EXHAUSTED: paymentsd has too many calls in progress, or the provider rate-limited every attempt.",
	499: "CANCELLED: the caller gave up.",
	500: "INTERNAL or UNKNOWN: the provider answered 500 or an unreadable reply, or paymentsd failed; the reason says whether a payment may exist.",
	501: "UNIMPLEMENTED: the provider answered 501.",
	503: "UNAVAILABLE: the provider or the record store could not be reached, or the circuit breaker is open, or paymentsd is shutting down.",
	504: "DEADLINE_EXCEEDED: the caller's deadline or the upstream timeout came before the provider's answer, or the provider answered 504 or 408.",
}

// retryable are the statuses whose answers may carry a RetryInfo, and so
// a Retry-After header.
var retryable = []int{408, 409, 429, 500, 503, 504}

// retryableCreate are the statuses, besides retryable, whose
// CreateMultiCardPayment answers may carry a RetryInfo: the provider's
// answers that leave a payment possible (PAYMENT_OUTCOME_UNKNOWN: a 501, a
// 4xx other than the refusals that prove nothing was done, which is 400
// INVALID_ARGUMENT, or any answer once an earlier attempt with the key may
// have made the payment) are retried after the RetryInfo's delay, whatever
// their status.
var retryableCreate = []int{400, 401, 403, 404, 501}

// alwaysSet are the message fields (not scalars, enums or lists) of each
// response schema that the REST API always writes.
var alwaysSet = map[string][]string{
	"v1CreateMultiCardPaymentRequest":   {"amountMoney"}, // as GetMultiCardPaymentResponse.request
	"v1CreateMultiCardPaymentResponse":  {"payment"},
	"v1GetMultiCardPaymentResponse":     {"request", "createTime", "updateTime"},
	"v1MultiCardPaymentSummary":         {"amountMoney", "createTime", "updateTime"},
	"v1ResolveMultiCardPaymentResponse": {"payment", "auditEntry"},
	"v1AuditEntry":                      {"createTime"},
	"v1ProviderEvent":                   {"receiveTime"},
}

// notOverREST are fields the REST API never writes (its marshaler puts
// the exact bytes in payment instead).
var notOverREST = map[string][]string{
	"v1CreateMultiCardPaymentResponse": {"paymentJson"},
	"v1GetMultiCardPaymentResponse":    {"paymentJson"},
}

// bodies are the request bodies that get schemas of their own: the
// definition each POST names, the copy it names instead, and the copy's
// required fields (what validation refuses without; the idempotency key
// may come in the Idempotency-Key header instead).
var bodies = []struct{ from, to string }{
	{"v1CreateMultiCardPaymentRequest", "v1CreateMultiCardPaymentBody"},
	{"v1Money", "v1MoneyBody"},
}

var bodyRequired = map[string][]string{
	"v1CreateMultiCardPaymentBody":     {"amountMoney"},
	"v1MoneyBody":                      {"currency"},
	"v1ResolveMultiCardPaymentRequest": {"idempotencyKey", "outcome", "evidence"},
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: openapidoc FILE")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "openapidoc:", err)
		os.Exit(1)
	}
}

func run(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := finish(b)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, out, 0o644)
}

type object = map[string]any

// finish is the whole change, from the generated document to the one
// committed and served.
func finish(b []byte) ([]byte, error) {
	var doc object
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&doc); err != nil {
		return nil, err
	}
	defs, _ := doc["definitions"].(object)
	if defs == nil {
		return nil, fmt.Errorf("no definitions")
	}
	doc["info"].(object)["version"] = "devel"

	// Request bodies.
	for _, c := range bodies {
		def, ok := defs[c.from].(object)
		if !ok {
			return nil, fmt.Errorf("no definition %s", c.from)
		}
		defs[c.to] = clone(def)
	}
	body := defs["v1CreateMultiCardPaymentBody"].(object)
	body["properties"].(object)["amountMoney"] = object{"$ref": "#/definitions/v1MoneyBody"}
	amount := defs["v1MoneyBody"].(object)["properties"].(object)["amount"].(object)
	amount["type"], amount["format"] = "integer", "int64"
	amount["description"] = amount["description"].(string) + "\nSend it as a JSON integer; responses write it as a string of digits, as proto3 JSON writes every int64."
	for name, req := range bodyRequired {
		defs[name].(object)["required"] = toAny(req)
	}

	// Response schemas: every definition but the bodies and enums.
	for name, v := range defs {
		def := v.(object)
		props, ok := def["properties"].(object)
		if !ok || bodyRequired[name] != nil || name == "v1ResolveMultiCardPaymentRequest" {
			continue
		}
		var req []string
		for field, p := range props {
			if slices.Contains(notOverREST[name], field) {
				continue
			}
			if alwaysWritten(defs, p.(object)) || slices.Contains(alwaysSet[name], field) {
				req = append(req, field)
			}
		}
		slices.Sort(req)
		if len(req) > 0 {
			def["required"] = toAny(req)
		}
	}
	defs["rpcStatus"].(object)["description"] = "google.rpc.Status: the gRPC code, a message saying what happened and what to do, and details: a google.rpc.ErrorInfo (domain paymentsd.example.com) whose reason says what happened to the money, and as they apply a google.rpc.RetryInfo, a google.rpc.BadRequest and a payments.v1.ProviderError."
	defs["protobufAny"].(object)["required"] = toAny([]string{"@type"})

	// Operations: error statuses and headers.
	for _, ops := range doc["paths"].(object) {
		for _, v := range ops.(object) {
			op := v.(object)
			id, _ := op["operationId"].(string)
			statuses, ok := errorStatuses[id]
			if !ok {
				return nil, fmt.Errorf("operation %s: no error statuses listed for it", id)
			}
			responses := op["responses"].(object)
			ok200 := responses["200"].(object)
			headers, _ := ok200["headers"].(object)
			if headers == nil {
				headers = object{}
			}
			headers["X-Request-Id"] = requestIDHeader()
			ok200["headers"] = headers
			for _, s := range statuses {
				h := object{"X-Request-Id": requestIDHeader()}
				if slices.Contains(retryable, s) || (id == "PaymentsService_CreateMultiCardPayment" && slices.Contains(retryableCreate, s)) {
					h["Retry-After"] = object{"type": "integer", "description": "Seconds to wait before retrying with the same idempotency key: the RetryInfo's delay, rounded up. Present when the answer carries a RetryInfo."}
				}
				responses[strconv.Itoa(s)] = object{
					"description": statusText[s],
					"schema":      object{"$ref": "#/definitions/rpcStatus"},
					"headers":     h,
				}
			}
			for _, p := range op["parameters"].([]any) {
				prm := p.(object)
				switch {
				case prm["in"] == "body" && refersTo(prm["schema"], "v1CreateMultiCardPaymentRequest"):
					prm["schema"] = object{"$ref": "#/definitions/v1CreateMultiCardPaymentBody"}
				case prm["in"] == "query":
					// An empty parameter (pageSize=) means its default:
					// service.dropEmptyQuery.
					prm["allowEmptyValue"] = true
				}
			}
		}
	}

	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// alwaysWritten reports whether the marshaler writes a property whatever
// its value: scalars, enums and lists (default values are written), not
// messages, timestamps or Structs (left out when unset).
func alwaysWritten(defs object, p object) bool {
	if ref, ok := p["$ref"].(string); ok {
		target, _ := defs[ref[len("#/definitions/"):]].(object)
		_, isEnum := target["enum"]
		return isEnum
	}
	switch p["type"] {
	case "object":
		return false
	case "string":
		return p["format"] != "date-time"
	}
	return true
}

func refersTo(schema any, name string) bool {
	s, _ := schema.(object)
	return s != nil && s["$ref"] == "#/definitions/"+name
}

func requestIDHeader() object {
	return object{"type": "string", "description": "The call's request ID: the caller's X-Request-Id if valid, else one paymentsd made; its log lines carry it."}
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

func clone(v any) object {
	b, _ := json.Marshal(v)
	var out object
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	d.Decode(&out)
	return out
}
