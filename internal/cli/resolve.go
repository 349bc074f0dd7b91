package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/config"
)

const resolveText = `Usage: paymentsd payments resolve [flags] KEY --outcome succeeded|not-created

Record what you found out about a payment in doubt (outcome_unknown), for
example on the provider's dashboard:
  succeeded    the provider created it: later calls with the key replay it
               (with the reply given by --reply-file, if any).
  not-created  the provider certainly has no payment for it: the next call
               with the key makes a new attempt.
The evidence (what you saw, such as the provider's payment ID) is required:
give it with --evidence or type it when asked. resolve shows the payment and
asks you to confirm unless --yes is given. The change and its audit entry
are written together; 'paymentsd payments get KEY' shows them. While a
request with the key may still be at the provider, paymentsd changes
nothing (PAYMENT_IN_PROGRESS) and says how long to wait; --wait waits.
`

func runResolve(ctx context.Context, args []string, env func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	v := newVerb("resolve", resolveText, env, stdout, stderr)
	outcomeFlag := v.fs.String("outcome", "", "succeeded or not-created (required)")
	evidence := v.fs.String("evidence", "", "what you saw, e.g. the provider dashboard's payment ID and status; asked for if not given")
	replyFile := v.fs.String("reply-file", "", "with succeeded: a file holding the provider's payment JSON, exactly as you got it")
	yes := v.fs.Bool("yes", false, "don't ask for confirmation")
	wait := v.fs.Duration("wait", 0, "while a request with the key may still be at the provider (PAYMENT_IN_PROGRESS), wait as paymentsd asks and try again, for up to this long; 0: don't wait")
	v.outputFlag("output: table or json")
	key, ok, err := v.parseKey(args)
	if !ok {
		return err
	}
	req := &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: key}
	var meaning string
	switch strings.ToLower(strings.ReplaceAll(*outcomeFlag, "_", "-")) {
	case "succeeded":
		req.Outcome = paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED
		meaning = "the provider created it; later calls with the key replay it"
	case "not-created":
		req.Outcome = paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED
		meaning = "the provider has no payment for it; the next call with the key makes a new attempt"
	case "":
		return usageError("--outcome is required: succeeded or not-created")
	default:
		return usageError("--outcome %q: want succeeded or not-created", *outcomeFlag)
	}
	if *replyFile != "" {
		if req.Outcome != paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED {
			return usageError("--reply-file goes with --outcome succeeded only")
		}
		b, err := os.ReadFile(*replyFile)
		if err != nil {
			return usageError("--reply-file: %w", config.FileError(err))
		}
		req.ReplyJson = string(b)
	}
	client, closeConn, err := v.conn.Dial()
	if err != nil {
		return err
	}
	defer closeConn()

	// Show what is about to change before asking anything.
	callCtx, cancel := context.WithTimeout(ctx, v.conn.Timeout)
	current, err := client.GetMultiCardPayment(callCtx, &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
	cancel()
	if err != nil {
		return callError("resolve: get the payment", err)
	}
	if current.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN {
		return &exitError{ExitRefused, fmt.Errorf("resolve: %s is %s, not outcome_unknown: only a payment in doubt can be resolved; nothing changed",
			printable(key), stateName(current.GetState()))}
	}
	// If a retry or settlement sends the key while the person reads the
	// dashboard and types, what they saw may be out of date: paymentsd
	// then changes nothing (RECORD_CHANGED).
	req.ExpectedUpdateTime = current.GetUpdateTime()
	fmt.Fprintf(stderr, "Payment %s: %s, %s, created %s UTC by %s, %d attempt(s), last error: %s\n",
		printable(key), stateName(current.GetState()), amount(current.GetRequest().GetAmountMoney()), timeText(current.GetCreateTime()),
		dash(printable(current.GetCaller())), current.GetAttempts(), dash(printable(current.GetLastError())))

	in := bufio.NewReader(stdin)
	req.Evidence = *evidence
	if blank(req.Evidence) && *evidence == "" {
		fmt.Fprint(stderr, "Evidence: what did you see, and where (for example the provider dashboard's payment ID and status)?\n"+
			"End with an empty line.\n> ")
		req.Evidence, err = readParagraph(in, stderr)
		if err != nil {
			return err
		}
	}
	if blank(req.Evidence) {
		return usageError("resolve: the evidence is blank or invisible: say what you saw, and where; nothing changed")
	}
	if !*yes {
		fmt.Fprintf(stderr, "Resolve %s as %s: %s.\nEvidence: %s\nProceed? [y/N] ",
			printable(key), strings.ToUpper(strings.ReplaceAll(*outcomeFlag, "-", "_")), meaning, req.Evidence)
		answer, err := in.ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			return &exitError{ExitDeclined, errors.New("resolve: not confirmed; nothing changed (--yes skips the question)")}
		}
	}
	resp, err := resolveWaiting(ctx, client, req, v.conn.Timeout, *wait, stderr)
	if err != nil {
		if status.Code(err) == codes.Unavailable || status.Code(err) == codes.DeadlineExceeded {
			return fmt.Errorf("%w (the resolution may or may not have been recorded: 'paymentsd payments get' shows which)", callError("resolve", err))
		}
		return callError("resolve", err)
	}
	fmt.Fprintf(stderr, "Resolved %s: %s -> %s.\n", printable(key), stateName(resp.GetAuditEntry().GetFromState()), stateName(resp.GetAuditEntry().GetToState()))
	if v.json {
		return writeJSON(stdout, resp)
	}
	return writePayment(stdout, key, resp.GetPayment())
}

// resolveWaiting resolves req, and while paymentsd answers
// PAYMENT_IN_PROGRESS (a request with the key is being sent, or may still
// be at the provider) waits the RetryInfo's delay and asks again, for up
// to wait. The request keeps its expected_update_time: if a request did
// change the record meanwhile, paymentsd says RECORD_CHANGED and nothing
// is resolved.
func resolveWaiting(ctx context.Context, client paymentsv1.PaymentsServiceClient, req *paymentsv1.ResolveMultiCardPaymentRequest, timeout, wait time.Duration, stderr io.Writer) (*paymentsv1.ResolveMultiCardPaymentResponse, error) {
	deadline := time.Now().Add(wait)
	for {
		callCtx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := client.ResolveMultiCardPayment(callCtx, req)
		cancel()
		delay := retryDelayOf(err)
		if err == nil || status.Code(err) != codes.Aborted || delay <= 0 || time.Now().Add(delay).After(deadline) {
			return resp, err
		}
		fmt.Fprintf(stderr, "A request with the key may still be at the provider; trying again in %v.\n", delay.Round(100*time.Millisecond))
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// blank reports whether s has nothing a person can read: only separators
// (Unicode category Z: spaces such as U+00A0 and U+3000) and invisible
// characters (category C: controls, and format characters such as
// U+200B), as paymentsd's own rule for evidence has it.
func blank(s string) bool {
	for _, r := range s {
		if !unicode.In(r, unicode.Z, unicode.C) {
			return false
		}
	}
	return true
}

// readParagraph reads lines until an empty line or the end of input.
func readParagraph(in *bufio.Reader, prompt io.Writer) (string, error) {
	var lines []string
	for {
		line, err := in.ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return "", err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		lines = append(lines, line)
		if errors.Is(err, io.EOF) {
			break
		}
		fmt.Fprint(prompt, "> ")
	}
	return strings.Join(lines, "\n"), nil
}
