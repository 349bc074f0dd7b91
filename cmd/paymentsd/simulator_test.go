package main

import (
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
)

// TestSimulatorTestKeys drives each of docs/simulator.md's test keys
// through paymentsd --simulate, over REST, and checks the answer the page
// promises: the HTTP status, the reason, and the state the record settles
// in. The page must list every one.
func TestSimulatorTestKeys(t *testing.T) {
	t.Parallel()
	in := start(t, nil, "--simulate")
	page, err := os.ReadFile("../../docs/simulator.md")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		prefix, key string
		status      int
		reason      string
		// settles is the state the record ends in without anyone's help
		// (in the settlement window); OUTCOME_UNKNOWN ones stay so.
		settles paymentsv1.PaymentState
	}{
		{"", "order-sim-1", http.StatusOK, "", paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED},
		{simulator.KeyDecline, "sim-decline-1", http.StatusBadRequest, "PAYMENT_NOT_CREATED", paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED},
		{simulator.KeyStatus, "sim-status-403-1", http.StatusForbidden, "PAYMENT_NOT_CREATED", paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED},
		{simulator.KeyStatus, "sim-status-429-1", http.StatusTooManyRequests, "PAYMENT_NOT_CREATED", paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED},
		{simulator.KeyStatus, "sim-status-500-1", http.StatusInternalServerError, "PAYMENT_OUTCOME_UNKNOWN", paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN},
		{simulator.KeySlow, "sim-slow-1", http.StatusOK, "", paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED},
		{simulator.KeyHang, "sim-hang-1", http.StatusGatewayTimeout, "PAYMENT_OUTCOME_UNKNOWN", paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED},
		{simulator.KeyReset, "sim-reset-1", http.StatusServiceUnavailable, "PAYMENT_OUTCOME_UNKNOWN", paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED},
		{simulator.KeyLost, "sim-lost-1", http.StatusServiceUnavailable, "PAYMENT_OUTCOME_UNKNOWN", paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED},
		{simulator.KeyInDoubt, "sim-in-doubt-1", http.StatusConflict, "PAYMENT_OUTCOME_UNKNOWN", paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN},
	}
	for _, tt := range tests {
		if tt.prefix != "" && !strings.Contains(string(page), "`"+tt.prefix) {
			t.Errorf("docs/simulator.md does not list the test key %s", tt.prefix)
		}
		t.Run(tt.key, func(t *testing.T) {
			t.Parallel()
			r := in.rest(t, validBody(tt.key), nil)
			if r.status != tt.status || restReason(r) != tt.reason {
				t.Fatalf("POST with key %s = %d, reason %q; want %d, %q (%s)", tt.key, r.status, restReason(r), tt.status, tt.reason, r.raw)
			}
			// The settlement window is 20 s under --simulate.
			got := waitForState(t, in, tt.key, tt.settles, time.Minute)
			// A lost answer's record settles with the payment its first
			// request made, on the second attempt.
			if tt.prefix == simulator.KeyLost && (got.GetPayment().GetFields()["id"].GetStringValue() == "" || got.GetAttempts() != 2) {
				t.Errorf("%s settled as %v after %d attempts, want the first request's payment, after 2", tt.key, got.GetPayment(), got.GetAttempts())
			}
		})
	}
}
