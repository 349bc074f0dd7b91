package cli

import (
	"flag"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// filterFlags are list's and export's filters.
type filterFlags struct {
	states          []string
	inDoubt, gaveUp bool
	from, to        string
	caller          string
}

func (f *filterFlags) register(fs *flag.FlagSet, fromName, toName string) {
	fs.Func("state", "only this state: in_progress, succeeded, not_created, outcome_unknown (repeatable)", func(s string) error {
		f.states = append(f.states, s)
		return nil
	})
	fs.BoolVar(&f.inDoubt, "in-doubt", false, "only payments in doubt: outcome_unknown, inside their settlement window or past it")
	fs.BoolVar(&f.gaveUp, "gave-up", false, "only payments whose settlement gave up (counted by paymentsd_records_unsettled)")
	fs.StringVar(&f.from, fromName, "", "only payments created at or after: RFC 3339, a UTC date (YYYY-MM-DD), today or yesterday")
	fs.StringVar(&f.to, toName, "", "only payments created before: RFC 3339, or through the end of a UTC date, today or yesterday")
	fs.StringVar(&f.caller, "caller", "", "only payments created by this caller identity")
}

func (f *filterFlags) request(fromName, toName string, now time.Time) (*paymentsv1.ListMultiCardPaymentsRequest, error) {
	req := &paymentsv1.ListMultiCardPaymentsRequest{Caller: f.caller}
	for _, s := range f.states {
		st, err := parseState(s)
		if err != nil {
			return nil, err
		}
		req.State = append(req.State, st)
	}
	if f.inDoubt || f.gaveUp {
		if len(req.State) > 0 && !slices.Equal(req.State, []paymentsv1.PaymentState{paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN}) {
			return nil, usageError("--in-doubt and --gave-up select outcome_unknown payments: drop --state")
		}
		req.State = []paymentsv1.PaymentState{paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN}
	}
	if f.gaveUp {
		req.SettlementGaveUp = proto.Bool(true)
	}
	if f.from != "" {
		t, err := parseTime("--"+fromName, f.from, now, false)
		if err != nil {
			return nil, err
		}
		req.CreatedAfter = timestamppb.New(t)
	}
	if f.to != "" {
		t, err := parseTime("--"+toName, f.to, now, true)
		if err != nil {
			return nil, err
		}
		req.CreatedBefore = timestamppb.New(t)
	}
	if req.CreatedAfter != nil && req.CreatedBefore != nil && !req.CreatedAfter.AsTime().Before(req.CreatedBefore.AsTime()) {
		return nil, usageError("--%s %s is not before --%s %s", fromName, f.from, toName, f.to)
	}
	return req, nil
}

// parseState reads a state as outcome_unknown, OUTCOME_UNKNOWN or
// PAYMENT_STATE_OUTCOME_UNKNOWN.
func parseState(s string) (paymentsv1.PaymentState, error) {
	name := strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(s), "-", "_"))
	if !strings.HasPrefix(name, "PAYMENT_STATE_") {
		name = "PAYMENT_STATE_" + name
	}
	v, ok := paymentsv1.PaymentState_value[name]
	if !ok || v == 0 {
		return 0, usageError("--state %q: want in_progress, succeeded, not_created or outcome_unknown", s)
	}
	return paymentsv1.PaymentState(v), nil
}

// parseTime reads a time given as RFC 3339, a date (YYYY-MM-DD, a UTC day),
// "today" or "yesterday" (UTC). A day stands for its start, or, with end,
// for the start of the next day, so that --to 2026-11-23 includes that day.
func parseTime(flagName, s string, now time.Time, end bool) (time.Time, error) {
	day := func(d time.Time) time.Time {
		if end {
			d = d.AddDate(0, 0, 1)
		}
		return d
	}
	today := now.UTC().Truncate(24 * time.Hour)
	switch s {
	case "today":
		return day(today), nil
	case "yesterday":
		return day(today.AddDate(0, 0, -1)), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.Parse(time.DateOnly, s); err == nil {
		return day(d), nil
	}
	return time.Time{}, usageError("%s %q: want RFC 3339 (2026-11-23T09:00:00Z), a UTC date (2026-11-23), today or yesterday", flagName, s)
}
