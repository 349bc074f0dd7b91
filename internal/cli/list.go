package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/service"
)

const listText = `Usage: paymentsd payments list [flags]

List payments, oldest first, as a table (or JSON lines with -o json: one
payments.v1.MultiCardPaymentSummary per line, as the REST API writes it).
At 3 a.m.: 'paymentsd payments list --in-doubt' lists every payment whose
outcome is unknown; --gave-up only those paymentsd_records_unsettled counts.
`

func runList(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) error {
	var filters filterFlags
	v := newVerb("list", listText, env, stdout, stderr)
	filters.register(v.fs, "created-after", "created-before")
	v.outputFlag("output: table or json (JSON lines)")
	limit := v.fs.Int("limit", 500, "at most this many payments; 0 for all")
	if ok, err := v.parse(args); !ok {
		return err
	}
	if *limit < 0 {
		return usageError("--limit %d: want 0 (all) or more", *limit)
	}
	req, err := filters.request("created-after", "created-before", time.Now())
	if err != nil {
		return err
	}
	client, closeConn, err := v.conn.Dial()
	if err != nil {
		return err
	}
	defer closeConn()

	w := bufio.NewWriter(stdout)
	defer w.Flush()
	var table *tabwriter.Writer
	if !v.json {
		table = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(table, "KEY\tSTATE\tAMOUNT\tCALLER\tCREATED (UTC)\tATTEMPTS\tPROVIDER\tNOTE")
	}
	shown, more := 0, false
	for {
		if *limit > 0 {
			req.PageSize = int32(min(1000, *limit-shown+1)) // one more tells whether there are more
		} else {
			req.PageSize = 1000
		}
		callCtx, cancel := context.WithTimeout(ctx, v.conn.Timeout)
		page, err := client.ListMultiCardPayments(callCtx, req)
		cancel()
		if err != nil {
			return callError("list", err)
		}
		for _, p := range page.GetPayments() {
			if *limit > 0 && shown == *limit {
				more = true
				break
			}
			shown++
			if v.json {
				b, err := service.RESTJSON(p)
				if err != nil {
					return err
				}
				w.Write(b)
				w.WriteByte('\n')
				continue
			}
			fmt.Fprintf(table, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", printable(p.GetIdempotencyKey()), stateName(p.GetState()),
				amount(p.GetAmountMoney()), dash(printable(p.GetCaller())), timeText(p.GetCreateTime()), p.GetAttempts(),
				providerStatusText(p.GetProviderHttpStatus()), note(p))
		}
		if more || page.GetNextPageToken() == "" {
			break
		}
		req.PageToken = page.GetNextPageToken()
	}
	if table != nil {
		table.Flush()
	}
	switch {
	case more:
		fmt.Fprintf(stderr, "%d payments shown; there are more: narrow the filters or raise --limit (0 for all)\n", shown)
	case shown == 0:
		fmt.Fprintln(stderr, "no payments match")
	}
	return nil
}

// note is the table's last column: why a payment needs a person, or what
// one did.
func note(p *paymentsv1.MultiCardPaymentSummary) string {
	var notes []string
	if p.GetSettlementGaveUp() {
		notes = append(notes, "settlement gave up")
	} else if p.GetState() == paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN {
		notes = append(notes, "settling until "+timeText(p.GetSettlementWindowEndTime()))
	}
	if p.GetResolved() {
		notes = append(notes, "resolved by a person")
	}
	if len(notes) == 0 {
		return "-"
	}
	return strings.Join(notes, "; ")
}
