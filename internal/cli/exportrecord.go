package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// ExportColumns are export's CSV header and JSON lines' keys, in order.
// They are a contract with reconciliation scripts: add columns at the end,
// never rename, remove or reorder one.
var ExportColumns = []string{
	"idempotency_key", "state", "amount", "currency", "caller", "environment",
	"create_time", "update_time", "attempts", "provider_http_status",
	"settlement_gave_up", "settlement_window_end_time", "resolved", "last_error",
	"payment_json", "attempt_history",
}

// ExportRecord is one line of a JSON lines export, keyed as ExportColumns.
type ExportRecord struct {
	IdempotencyKey          string `json:"idempotency_key"`
	State                   string `json:"state"`
	Amount                  string `json:"amount"` // a string: int64 is not exact in every JSON reader
	Currency                string `json:"currency"`
	Caller                  string `json:"caller"`
	Environment             string `json:"environment"`
	CreateTime              string `json:"create_time"`
	UpdateTime              string `json:"update_time"`
	Attempts                int32  `json:"attempts"`
	ProviderHTTPStatus      int32  `json:"provider_http_status"`
	SettlementGaveUp        bool   `json:"settlement_gave_up"`
	SettlementWindowEndTime string `json:"settlement_window_end_time"`
	Resolved                bool   `json:"resolved"`
	LastError               string `json:"last_error"`
	PaymentJSON             string `json:"payment_json"`
	// AttemptHistory is every attempt for the key, oldest first; in CSV,
	// as a JSON array.
	AttemptHistory []ExportAttempt `json:"attempt_history"`
}

// ExportAttempt is one attempt in an export, as PaymentAttempt, with the
// provider's reply as a string (exactly, for a reply in UTF-8).
type ExportAttempt struct {
	Number             int32  `json:"number"`
	Kind               string `json:"kind"` // call or settlement
	Replica            string `json:"replica"`
	ClaimOwner         string `json:"claim_owner"`
	RequestID          string `json:"request_id"`
	StartTime          string `json:"start_time"`
	EndTime            string `json:"end_time"`
	ProviderHTTPStatus int32  `json:"provider_http_status"`
	HTTPRequests       int32  `json:"http_requests"`
	Outcome            string `json:"outcome"`
	Code               int32  `json:"code"`
	Error              string `json:"error"`
	Abandoned          bool   `json:"abandoned"`
	InFlight           bool   `json:"in_flight"`
	PaymentJSON        string `json:"payment_json"`
}

func exportAttempts(as []*paymentsv1.PaymentAttempt) []ExportAttempt {
	out := make([]ExportAttempt, 0, len(as))
	for _, a := range as {
		kind := ""
		switch a.GetKind() {
		case paymentsv1.AttemptKind_ATTEMPT_KIND_CALL:
			kind = "call"
		case paymentsv1.AttemptKind_ATTEMPT_KIND_SETTLEMENT:
			kind = "settlement"
		}
		out = append(out, ExportAttempt{
			Number: a.GetNumber(), Kind: kind, Replica: a.GetReplica(), ClaimOwner: a.GetClaimOwner(),
			RequestID: a.GetRequestId(), StartTime: exportTime(a.GetStartTime()), EndTime: exportTime(a.GetEndTime()),
			ProviderHTTPStatus: a.GetProviderHttpStatus(), HTTPRequests: a.GetHttpRequests(), Outcome: stateName(a.GetOutcome()),
			Code: a.GetCode(), Error: a.GetError(), Abandoned: a.GetAbandoned(), InFlight: a.GetInFlight(),
			PaymentJSON: string(a.GetPaymentJson()),
		})
	}
	return out
}

func newExportRecord(p *paymentsv1.MultiCardPaymentSummary) ExportRecord {
	r := ExportRecord{
		IdempotencyKey:          p.GetIdempotencyKey(),
		State:                   stateName(p.GetState()),
		Caller:                  p.GetCaller(),
		Environment:             environmentName(p.GetEnvironment()),
		CreateTime:              exportTime(p.GetCreateTime()),
		UpdateTime:              exportTime(p.GetUpdateTime()),
		Attempts:                p.GetAttempts(),
		ProviderHTTPStatus:      p.GetProviderHttpStatus(),
		SettlementGaveUp:        p.GetSettlementGaveUp(),
		SettlementWindowEndTime: exportTime(p.GetSettlementWindowEndTime()),
		Resolved:                p.GetResolved(),
		LastError:               p.GetLastError(),
		PaymentJSON:             string(p.GetPaymentJson()),
		AttemptHistory:          exportAttempts(p.GetAttemptHistory()),
	}
	if m := p.GetAmountMoney(); m != nil {
		r.Amount, r.Currency = strconv.FormatInt(m.GetAmount(), 10), m.GetCurrency()
	}
	return r
}

// csv is the record's CSV row. The text cells paymentsd does not write
// itself (the key, the caller, the last error and the provider's reply)
// pass through csvText.
func (r ExportRecord) csv() []string {
	// Not json.Marshal, which would escape <, > and & in the provider's
	// replies.
	var attempts bytes.Buffer
	enc := json.NewEncoder(&attempts)
	enc.SetEscapeHTML(false)
	enc.Encode(r.AttemptHistory)
	return []string{
		csvText(r.IdempotencyKey), r.State, r.Amount, r.Currency, csvText(r.Caller), r.Environment,
		r.CreateTime, r.UpdateTime, strconv.Itoa(int(r.Attempts)), strconv.Itoa(int(r.ProviderHTTPStatus)),
		strconv.FormatBool(r.SettlementGaveUp), r.SettlementWindowEndTime, strconv.FormatBool(r.Resolved), csvText(r.LastError),
		csvText(r.PaymentJSON), csvText(strings.TrimSuffix(attempts.String(), "\n")),
	}
}

// csvText is a text cell as CSV carries it safely. A cell a spreadsheet
// could take for a formula (starting with =, +, -, @, a tab or a carriage
// return: OWASP's "CSV injection"), or one holding a character that
// reorders or hides text when shown (bidi controls, zero-width and other
// format characters, C1 controls, line and paragraph separators), is
// written as a JSON string literal instead: in double quotes, those
// characters escaped (\u202e). So is a cell that starts with a double
// quote, so that the rule can be undone: a cell that starts with " is
// JSON; decode it for the exact value. Every other cell is as it is.
func csvText(s string) string {
	if s == "" {
		return s
	}
	switch s[0] {
	case '=', '+', '-', '@', '\t', '\r', '"':
		return jsonString(s)
	}
	for _, r := range s {
		if r >= utf8.RuneSelf && hides(r) {
			return jsonString(s)
		}
	}
	return s
}

// hides reports whether r changes or hides how text around it is shown:
// control characters (Cc), format characters (Cf: bidi controls, zero-width
// characters), and line and paragraph separators (Zl, Zp).
func hides(r rune) bool {
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp)
}

// jsonString is s as a JSON string literal, with every character hides
// reports \u-escaped.
func jsonString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)
	return string(escapeHidden(bytes.TrimSuffix(b.Bytes(), []byte("\n"))))
}

// escapeHidden \u-escapes, in JSON that encoding/json wrote, every
// character hides reports that it left as it is (it escapes only ASCII
// controls, U+2028 and U+2029). Such characters can only be inside JSON
// strings, so the JSON means the same.
func escapeHidden(b []byte) []byte {
	var out []byte
	start := 0
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf && c != 0x7f {
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if !hides(r) {
			i += size
			continue
		}
		out = append(out, b[start:i]...)
		for _, u := range utf16.Encode([]rune{r}) {
			out = fmt.Appendf(out, `\u%04x`, u)
		}
		i += size
		start = i
	}
	if out == nil {
		return b
	}
	return append(out, b[start:]...)
}

func environmentName(e paymentsv1.Environment) string {
	switch e {
	case paymentsv1.Environment_ENVIRONMENT_SANDBOX:
		return "sandbox"
	case paymentsv1.Environment_ENVIRONMENT_LIVE:
		return "live"
	}
	return ""
}

func exportTime(t *timestamppb.Timestamp) string {
	if t == nil {
		return ""
	}
	// As the API writes it (protojson: RFC 3339 with 0, 3, 6 or 9
	// fractional digits), so that an export and a lookup agree byte for
	// byte; RFC3339Nano would drop trailing zeros.
	b, err := protojson.Marshal(t)
	if err != nil {
		return t.AsTime().UTC().Format(time.RFC3339Nano)
	}
	return strings.Trim(string(b), `"`)
}
