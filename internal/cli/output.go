package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/service"
)

// writeJSON writes m as the REST API writes it (-o json), on a line.
func writeJSON(w io.Writer, m proto.Message) error {
	b, err := service.RESTJSON(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// stateName is a state as the CLI shows it: outcome_unknown.
func stateName(s paymentsv1.PaymentState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "PAYMENT_STATE_"))
}

func amount(m *paymentsv1.Money) string {
	if m == nil {
		return "-"
	}
	return fmt.Sprintf("%d %s", m.GetAmount(), m.GetCurrency())
}

func providerStatusText(s int32) string {
	if s == 0 {
		return "-"
	}
	return fmt.Sprint(s)
}

func timeText(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format("2006-01-02 15:04:05")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printable quotes s if it holds anything a terminal would act on, or
// whitespace that would break a table's columns.
func printable(s string) string {
	for _, r := range s {
		// strconv.IsPrint is false for control and format characters
		// (right-to-left overrides, zero-width spaces), line and paragraph
		// separators and spaces other than ' ', which %q escapes.
		if r == ' ' || r == utf8.RuneError || !strconv.IsPrint(r) {
			return fmt.Sprintf("%q", s)
		}
	}
	return s
}
