package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
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

func (r exportRecord) csv() []string {
	// Not json.Marshal, which would escape <, > and & in the provider's
	// replies.
	var attempts bytes.Buffer
	enc := json.NewEncoder(&attempts)
	enc.SetEscapeHTML(false)
	enc.Encode(r.AttemptHistory)
	return []string{
		r.IdempotencyKey, r.State, r.Amount, r.Currency, r.Caller, r.Environment,
		r.CreateTime, r.UpdateTime, strconv.Itoa(int(r.Attempts)), strconv.Itoa(int(r.ProviderHTTPStatus)),
		strconv.FormatBool(r.SettlementGaveUp), r.SettlementWindowEndTime, strconv.FormatBool(r.Resolved), r.LastError,
		r.PaymentJSON, strings.TrimSuffix(attempts.String(), "\n"),
	}
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
	return t.AsTime().UTC().Format(time.RFC3339Nano)
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
`

func paymentsExport(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) error {
	var conn connFlags
	var filters filterFlags
	fs := newFlagSet("export", exportText, stdout, stderr)
	conn.register(fs, env)
	filters.register(fs, "from", "to")
	format := fs.String("format", "csv", "csv or jsonl")
	output := fs.String("output", "", "write to this file instead of stdout (replaced, once the export is whole)")
	rest, err := parseArgs(fs, args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
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
	client, closeConn, err := conn.dial()
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
		file, err = os.CreateTemp(filepath.Dir(*output), "."+filepath.Base(*output)+".partial-*")
		if err != nil {
			return usageError("--output: %w", fileError(err))
		}
		defer func() {
			file.Close()
			os.Remove(file.Name()) // fails once renamed
		}()
		out = file
	}
	start := time.Now()
	n, err := exportPayments(ctx, client, req, *format, out, exportOptions{
		timeout: conn.timeout, progress: stderr, progressAfter: 2 * time.Second,
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
	if format == "csv" {
		cw = csv.NewWriter(bw)
		if err := cw.Write(exportColumns); err != nil {
			return 0, err
		}
	} else {
		enc = json.NewEncoder(bw)
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
				err = enc.Encode(r)
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
