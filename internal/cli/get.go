package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

const getText = `Usage: paymentsd payments get [flags] KEY

Show the payment whose idempotency key is KEY, its attempts (each call's
and each settlement re-send's: which replica, when, the provider's status
and reply exactly, and what was recorded), and its audit trail: who
resolved it, when, from and to which state, and with what evidence.
-o json prints payments.v1.GetMultiCardPaymentResponse as the REST API does.
`

func runGet(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) error {
	v := newVerb("get", getText, env, stdout, stderr)
	v.outputFlag("output: table or json")
	key, ok, err := v.parseKey(args)
	if !ok {
		return err
	}
	client, closeConn, err := v.conn.Dial()
	if err != nil {
		return err
	}
	defer closeConn()
	callCtx, cancel := context.WithTimeout(ctx, v.conn.Timeout)
	defer cancel()
	p, err := client.GetMultiCardPayment(callCtx, &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
	if err != nil {
		return callError("get", err)
	}
	if v.json {
		return writeJSON(stdout, p)
	}
	return writePayment(stdout, key, p)
}

// writePayment writes a record for a person to read.
func writePayment(stdout io.Writer, key string, p *paymentsv1.GetMultiCardPaymentResponse) error {
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	state := stateName(p.GetState())
	if p.GetSettlementGaveUp() {
		state += " (settlement gave up)"
	}
	fields := []struct{ name, value string }{
		{"Key", printable(key)},
		{"State", state},
		{"Amount", amount(p.GetRequest().GetAmountMoney())},
		{"Caller", dash(printable(p.GetCaller()))},
		{"Environment", strings.ToLower(strings.TrimPrefix(p.GetEnvironment().String(), "ENVIRONMENT_"))},
		{"Created (UTC)", timeText(p.GetCreateTime())},
		{"Updated (UTC)", timeText(p.GetUpdateTime())},
		{"Attempts", fmt.Sprint(p.GetAttempts())},
		{"Provider status", providerStatusText(p.GetProviderHttpStatus())},
		{"Last error", dash(printable(p.GetLastError()))},
		{"Settlement window ends", timeText(p.GetSettlementWindowEndTime())},
		{"Request ID", dash(printable(p.GetRequestId()))},
	}
	for _, f := range fields {
		fmt.Fprintf(w, "%s:\t%s\n", f.name, f.value)
	}
	if len(p.GetPaymentJson()) > 0 {
		fmt.Fprintf(w, "Provider reply:\t%s\n", printable(string(p.GetPaymentJson())))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if err := writeAttempts(stdout, p.GetAttemptHistory()); err != nil {
		return err
	}
	entries := p.GetAuditEntries()
	if len(entries) == 0 {
		_, err := io.WriteString(stdout, "\nAudit trail: none\n")
		return err
	}
	io.WriteString(stdout, "\nAudit trail:\n")
	w = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  WHEN (UTC)\tBY\tFROM\tTO\tREQUEST ID\tCALLER'S REQUEST ID\tEVIDENCE")
	for _, e := range entries {
		from := stateName(e.GetFromState())
		if e.GetSettlementGaveUp() {
			from += " (gave up)"
		}
		to := stateName(e.GetToState())
		if e.GetReplyRecorded() {
			to += " (reply recorded)"
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", timeText(e.GetCreateTime()), printable(e.GetActor()), from, to,
			dash(printable(e.GetRequestId())), dash(printable(e.GetCallerRequestId())), printable(e.GetEvidence()))
	}
	return w.Flush()
}

// writeAttempts writes a record's attempts as a table: who made each,
// when, the provider's status, what was recorded, and the provider's
// reply exactly (or why it failed).
func writeAttempts(stdout io.Writer, attempts []*paymentsv1.PaymentAttempt) error {
	if len(attempts) == 0 {
		_, err := io.WriteString(stdout, "\nAttempts: none recorded\n")
		return err
	}
	io.WriteString(stdout, "\nAttempts:\n")
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  #\tBY\tREPLICA\tREQUEST ID\tSTARTED (UTC)\tENDED (UTC)\tPROVIDER\tOUTCOME\tREPLY OR ERROR")
	for _, a := range attempts {
		by := strings.ToLower(strings.TrimPrefix(a.GetKind().String(), "ATTEMPT_KIND_"))
		outcome := stateName(a.GetOutcome())
		switch {
		case a.GetInFlight():
			outcome = "in flight"
		case a.GetAbandoned():
			outcome += " (abandoned)"
		}
		ended := timeText(a.GetEndTime())
		detail := string(a.GetPaymentJson())
		if detail == "" || a.GetProviderHttpStatus() < 200 || a.GetProviderHttpStatus() > 299 {
			detail = strings.TrimSpace(a.GetError() + " " + detail)
		}
		fmt.Fprintf(w, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.GetNumber(), by, dash(printable(a.GetReplica())),
			dash(printable(a.GetRequestId())), timeText(a.GetStartTime()), ended, providerStatusText(a.GetProviderHttpStatus()),
			outcome, dash(printable(detail)))
	}
	return w.Flush()
}
