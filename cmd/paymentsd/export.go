package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/config"
)

// exportColumns are export's CSV header and JSON lines' keys, in order.
// They are a contract with reconciliation scripts: add columns at the end,
// never rename, remove or reorder one.
var exportColumns = []string{
	"idempotency_key", "state", "amount", "currency", "caller", "environment",
	"create_time", "update_time", "attempts", "provider_http_status",
	"settlement_gave_up", "settlement_window_end_time", "resolved", "last_error",
	"payment_json", "attempt_history",
}

// exportRecord is one line of a JSON lines export, keyed as exportColumns.
type exportRecord struct {
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
	AttemptHistory []exportAttempt `json:"attempt_history"`
}

// exportAttempt is one attempt in an export, as PaymentAttempt, with the
// provider's reply as a string (exactly, for a reply in UTF-8).
type exportAttempt struct {
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

func exportAttempts(as []*paymentsv1.PaymentAttempt) []exportAttempt {
	out := make([]exportAttempt, 0, len(as))
	for _, a := range as {
		kind := ""
		switch a.GetKind() {
		case paymentsv1.AttemptKind_ATTEMPT_KIND_CALL:
			kind = "call"
		case paymentsv1.AttemptKind_ATTEMPT_KIND_SETTLEMENT:
			kind = "settlement"
		}
		out = append(out, exportAttempt{
			Number: a.GetNumber(), Kind: kind, Replica: a.GetReplica(), ClaimOwner: a.GetClaimOwner(),
			RequestID: a.GetRequestId(), StartTime: exportTime(a.GetStartTime()), EndTime: exportTime(a.GetEndTime()),
			ProviderHTTPStatus: a.GetProviderHttpStatus(), HTTPRequests: a.GetHttpRequests(), Outcome: stateName(a.GetOutcome()),
			Code: a.GetCode(), Error: a.GetError(), Abandoned: a.GetAbandoned(), InFlight: a.GetInFlight(),
			PaymentJSON: string(a.GetPaymentJson()),
		})
	}
	return out
}

func newExportRecord(p *paymentsv1.MultiCardPaymentSummary) exportRecord {
	r := exportRecord{
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
func (r exportRecord) csv() []string {
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

const exportText = `Usage: paymentsd payments export --from FROM --to TO [flags]

Write every payment created in [FROM, TO) as CSV (a header row, then one
row per payment) or JSON lines, oldest first, for reconciliation. It reads
page after page of ListMultiCardPayments with the full view, so it holds
one page at a time however many payments there are. Data goes to stdout (or
--output), progress to stderr when it takes more than 2 seconds.

FROM and TO are RFC 3339 times, UTC dates (YYYY-MM-DD), today or
yesterday; a date as TO means through the end of that day. Yesterday's
payments: paymentsd payments export --from yesterday --to yesterday

Columns, in this order (docs/operations.md): idempotency_key, state,
amount, currency, caller, environment, create_time, update_time, attempts,
provider_http_status, settlement_gave_up, settlement_window_end_time,
resolved, last_error, payment_json, attempt_history (every attempt for the
key, oldest first, as a JSON array: number, kind, replica, claim_owner,
request_id, start_time, end_time, provider_http_status, http_requests,
outcome, code, error, abandoned, in_flight and payment_json, the provider's
reply to it).

A CSV cell that starts with " is a JSON string: one that a spreadsheet
could take for a formula (=, +, -, @, tab, CR) or that holds characters
that reorder or hide text (bidi controls, zero-width characters) is
written so, escaped. JSON lines escape the same characters.
`

func paymentsExport(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) error {
	var filters filterFlags
	v := newVerb("export", exportText, env, stdout, stderr)
	filters.register(v.fs, "from", "to")
	format := v.fs.String("format", "csv", "csv or jsonl")
	output := v.fs.String("output", "", "write to this file instead of stdout (replaced, once the export is whole)")
	rest, ok, err := v.parse(args)
	if !ok {
		return err
	}
	if len(rest) > 0 {
		return usageError("export takes no arguments, got %q", rest)
	}
	if filters.from == "" || filters.to == "" {
		return usageError("export needs --from and --to")
	}
	if *format != "csv" && *format != "jsonl" {
		return usageError("--format %q: want csv or jsonl", *format)
	}
	req, err := filters.request("from", "to", time.Now())
	if err != nil {
		return err
	}
	client, closeConn, err := v.conn.dial()
	if err != nil {
		return err
	}
	defer closeConn()

	// --output is written under a temporary name and renamed once the
	// export is whole, so a file by that name is never a partial export.
	// Like the temporary file, it is readable by its owner only: it holds
	// every payment of the range.
	out := stdout
	var file *os.File
	if *output != "" {
		removeStalePartials(*output, stderr)
		file, err = os.CreateTemp(filepath.Dir(*output), "."+filepath.Base(*output)+".partial-*")
		if err != nil {
			return usageError("--output: %w", config.FileError(err))
		}
		defer func() {
			file.Close()
			os.Remove(file.Name()) // fails once renamed
		}()
		out = file
	}
	start := time.Now()
	n, err := exportPayments(ctx, client, req, *format, out, exportOptions{
		timeout: v.conn.timeout, progress: stderr, progressAfter: 2 * time.Second,
	})
	if err != nil {
		return err
	}
	if file != nil {
		if err := file.Sync(); err != nil {
			return fmt.Errorf("--output: %w", err)
		}
		if err := file.Close(); err != nil {
			return fmt.Errorf("--output: %w", err)
		}
		if err := os.Rename(file.Name(), *output); err != nil {
			return fmt.Errorf("--output: %w", err)
		}
	}
	elapsed := time.Since(start)
	fmt.Fprintf(stderr, "exported %d payments created from %s to %s in %s\n", n,
		req.GetCreatedAfter().AsTime().Format(time.RFC3339), req.GetCreatedBefore().AsTime().Format(time.RFC3339), elapsed.Round(time.Millisecond))
	return nil
}

// removeStalePartials removes the temporary files of earlier exports to
// output that were killed before they could remove their own (SIGKILL, a
// crash, the machine going down), and says so. An export ended by
// SIGINT, SIGTERM or SIGHUP removes its own.
func removeStalePartials(output string, stderr io.Writer) {
	pattern := filepath.Join(globQuote(filepath.Dir(output)), globQuote("."+filepath.Base(output)+".partial-")+"*")
	stale, _ := filepath.Glob(pattern)
	for _, f := range stale {
		if err := os.Remove(f); err == nil {
			fmt.Fprintf(stderr, "removed %s: the partial file of an earlier export to %s that was killed before it finished\n", printable(f), printable(output))
		}
	}
}

// globQuote escapes filepath.Match's special characters in s.
func globQuote(s string) string {
	return strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`).Replace(s)
}

type exportOptions struct {
	timeout time.Duration // of each page's call
	// progress gets a line each second once the export has run for
	// progressAfter.
	progress      io.Writer
	progressAfter time.Duration
}

// exportPayments writes every payment req matches to w as format (csv or
// jsonl), a page at a time, and returns how many it wrote.
func exportPayments(ctx context.Context, client paymentsv1.PaymentsServiceClient, req *paymentsv1.ListMultiCardPaymentsRequest, format string, w io.Writer, opts exportOptions) (int, error) {
	req.View = paymentsv1.ListView_LIST_VIEW_FULL
	req.PageSize = 1000
	req.PageToken = ""
	bw := bufio.NewWriterSize(w, 256<<10)
	var cw *csv.Writer
	var enc *json.Encoder
	var line bytes.Buffer // one JSON line, before escapeHidden
	if format == "csv" {
		cw = csv.NewWriter(bw)
		if err := cw.Write(exportColumns); err != nil {
			return 0, err
		}
	} else {
		enc = json.NewEncoder(&line)
		enc.SetEscapeHTML(false)
	}

	var written atomic.Int64
	if opts.progress != nil {
		done := make(chan struct{})
		defer close(done)
		start := time.Now()
		go func() {
			timer := time.NewTimer(opts.progressAfter)
			defer timer.Stop()
			for {
				select {
				case <-done:
					return
				case <-timer.C:
				}
				n := written.Load()
				elapsed := time.Since(start)
				fmt.Fprintf(opts.progress, "export: %d payments so far, %.0f/s, %s\n", n, float64(n)/elapsed.Seconds(), elapsed.Round(time.Second))
				timer.Reset(time.Second)
			}
		}()
	}

	for {
		callCtx, cancel := context.WithTimeout(ctx, opts.timeout)
		page, err := client.ListMultiCardPayments(callCtx, req)
		cancel()
		if err != nil {
			return int(written.Load()), callError(fmt.Sprintf("export (after %d payments)", written.Load()), err)
		}
		for _, p := range page.GetPayments() {
			r := newExportRecord(p)
			if cw != nil {
				err = cw.Write(r.csv())
			} else {
				line.Reset()
				if err = enc.Encode(r); err == nil {
					_, err = bw.Write(escapeHidden(line.Bytes()))
				}
			}
			if err != nil {
				return int(written.Load()), fmt.Errorf("export: write: %w", err)
			}
		}
		written.Add(int64(len(page.GetPayments())))
		if page.GetNextPageToken() == "" {
			break
		}
		req.PageToken = page.GetNextPageToken()
	}
	if cw != nil {
		cw.Flush()
		if err := cw.Error(); err != nil {
			return int(written.Load()), fmt.Errorf("export: write: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return int(written.Load()), fmt.Errorf("export: write: %w", err)
	}
	return int(written.Load()), nil
}
