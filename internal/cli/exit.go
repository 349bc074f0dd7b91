package cli

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The CLI's exit statuses. paymentsd exits 1 for any other error.
const (
	ExitFailure  = 1 // paymentsd could not be reached or failed; nothing is known to have changed
	ExitUsage    = 2 // bad flags or arguments, or a request paymentsd called invalid
	ExitDenied   = 3 // not allowed: not an admin (CALLER_NOT_ADMIN), not on the allowlist, or no identity (no client certificate)
	ExitNotFound = 4 // no record of the key
	ExitRefused  = 5 // the record is not in a state for it (not OUTCOME_UNKNOWN, or a request is in flight); nothing changed
	ExitDeclined = 6 // the person did not confirm; nothing was sent
)

// exitError is an error with the exit status ExitCode gives it.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// ExitCode is the status paymentsd exits with for err: the CLI's own
// status for an error of Run, ExitFailure for any other.
func ExitCode(err error) int {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return ExitFailure
}

func usageError(format string, args ...any) error {
	return &exitError{ExitUsage, fmt.Errorf(format, args...)}
}

// callError turns a failed call into an error naming the call, the gRPC
// code and paymentsd's reason, with the matching exit status.
func callError(what string, err error) error {
	st := status.Convert(err)
	reason := ""
	var retry time.Duration
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			reason = d.GetReason()
		case *errdetails.RetryInfo:
			retry = d.GetRetryDelay().AsDuration()
		}
	}
	code := ExitFailure
	switch st.Code() {
	case codes.InvalidArgument:
		code = ExitUsage
	case codes.PermissionDenied, codes.Unauthenticated:
		code = ExitDenied
	case codes.NotFound:
		code = ExitNotFound
	case codes.FailedPrecondition, codes.Aborted:
		code = ExitRefused
	}
	msg := st.Code().String()
	if reason != "" {
		msg += " " + reason
	}
	if retry > 0 {
		// PAYMENT_IN_PROGRESS and the like: say when trying again can help.
		return &exitError{code, fmt.Errorf("%s: %s: %s (try again in %v)", what, msg, st.Message(), retry.Round(100*time.Millisecond))}
	}
	return &exitError{code, fmt.Errorf("%s: %s: %s", what, msg, st.Message())}
}

// retryDelayOf is the RetryInfo's delay in err's status, or 0.
func retryDelayOf(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}
