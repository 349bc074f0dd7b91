package cli

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
	"strings"
	"sync/atomic"
	"time"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/config"
)

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

func runExport(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) error {
	var filters filterFlags
	v := newVerb("export", exportText, env, stdout, stderr)
	filters.register(v.fs, "from", "to")
	format := v.fs.String("format", "csv", "csv or jsonl")
	output := v.fs.String("output", "", "write to this file instead of stdout (replaced, once the export is whole)")
	if ok, err := v.parse(args); !ok {
		return err
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
	client, closeConn, err := v.conn.Dial()
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
	n, err := ExportPayments(ctx, client, req, *format, out, ExportOptions{
		Timeout: v.conn.Timeout, Progress: stderr, ProgressAfter: 2 * time.Second,
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

// ExportOptions are how ExportPayments calls paymentsd and reports
// progress.
type ExportOptions struct {
	Timeout time.Duration // of each page's call
	// Progress, if not nil, gets a line each second once the export has
	// run for ProgressAfter.
	Progress      io.Writer
	ProgressAfter time.Duration
}

// ExportPayments writes every payment req matches to w as format (csv or
// jsonl), a page at a time, and returns how many it wrote: what
// 'paymentsd payments export' writes.
func ExportPayments(ctx context.Context, client paymentsv1.PaymentsServiceClient, req *paymentsv1.ListMultiCardPaymentsRequest, format string, w io.Writer, opts ExportOptions) (int, error) {
	req.View = paymentsv1.ListView_LIST_VIEW_FULL
	req.PageSize = 1000
	req.PageToken = ""
	bw := bufio.NewWriterSize(w, 256<<10)
	var cw *csv.Writer
	var enc *json.Encoder
	var line bytes.Buffer // one JSON line, before escapeHidden
	if format == "csv" {
		cw = csv.NewWriter(bw)
		if err := cw.Write(ExportColumns); err != nil {
			return 0, err
		}
	} else {
		enc = json.NewEncoder(&line)
		enc.SetEscapeHTML(false)
	}

	var written atomic.Int64
	if opts.Progress != nil {
		done := make(chan struct{})
		defer close(done)
		start := time.Now()
		go func() {
			timer := time.NewTimer(opts.ProgressAfter)
			defer timer.Stop()
			for {
				select {
				case <-done:
					return
				case <-timer.C:
				}
				n := written.Load()
				elapsed := time.Since(start)
				fmt.Fprintf(opts.Progress, "export: %d payments so far, %.0f/s, %s\n", n, float64(n)/elapsed.Seconds(), elapsed.Round(time.Second))
				timer.Reset(time.Second)
			}
		}()
	}

	for {
		callCtx, cancel := context.WithTimeout(ctx, opts.Timeout)
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
