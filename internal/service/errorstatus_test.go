package service

import (
	"errors"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// TestErrorStatusOtherFailure checks failureStatus's answer to a failure that
// is not the upstream client's (which the client never returns today): it
// says what happened to the money like every other, and an earlier attempt
// that may have created the payment keeps the outcome unknown.
func TestErrorStatusOtherFailure(t *testing.T) {
	s := &Service{env: paymentsv1.Environment_ENVIRONMENT_SANDBOX}
	tests := []struct {
		name        string
		maybeBefore bool
		wantReason  string
		wantRetry   bool
	}{
		{"first attempt", false, ReasonNotCreated, false},
		{"after an attempt that may have created it", true, ReasonOutcomeUnknown, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := s.failureStatus(errors.New("not an upstream error"), tt.maybeBefore)
			var reason, domain string
			retry := false
			for _, d := range st.Details() {
				switch d := d.(type) {
				case *errdetails.ErrorInfo:
					reason, domain = d.GetReason(), d.GetDomain()
				case *errdetails.RetryInfo:
					retry = true
				}
			}
			if st.Code() != codes.Internal || reason != tt.wantReason || domain != ErrorDomain || retry != tt.wantRetry {
				t.Errorf("failureStatus(maybeBefore=%v) = %v, reason %q, domain %q, RetryInfo %v; want %v, %s, %s, %v",
					tt.maybeBefore, st.Code(), reason, domain, retry, codes.Internal, tt.wantReason, ErrorDomain, tt.wantRetry)
			}
		})
	}
}
