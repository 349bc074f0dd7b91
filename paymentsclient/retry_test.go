package paymentsclient_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/paymentsclient"
)

// scripted is a PaymentsService over gRPC on 127.0.0.1:0 that answers
// Create with its script's errors in turn, then success, and records the
// keys it was sent. It reaches the answers paymentsd gives only in
// situations hard to stage (expired keys, keys another caller owns, a
// reason from a newer paymentsd).
type scripted struct {
	paymentsv1.UnimplementedPaymentsServiceServer
	mu     sync.Mutex
	script []error
	hang   int // the first hang calls wait for their caller to go
	keys   []string
	record *paymentsv1.GetMultiCardPaymentResponse
}

func (s *scripted) CreateMultiCardPayment(ctx context.Context, req *paymentsv1.CreateMultiCardPaymentRequest) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = append(s.keys, req.GetIdempotencyKey())
	if s.hang > 0 {
		s.hang--
		s.mu.Unlock()
		<-ctx.Done()
		s.mu.Lock()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if len(s.script) > 0 {
		err := s.script[0]
		s.script = s.script[1:]
		return nil, err
	}
	return &paymentsv1.CreateMultiCardPaymentResponse{ProviderHttpStatus: 200}, nil
}

func (s *scripted) GetMultiCardPayment(context.Context, *paymentsv1.GetMultiCardPaymentRequest) (*paymentsv1.GetMultiCardPaymentResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.record == nil {
		return nil, status.Error(codes.NotFound, "no record")
	}
	return s.record, nil
}

func startScripted(t *testing.T, s *scripted, opts ...paymentsclient.Option) *paymentsclient.Client {
	t.Helper()
	srv := grpc.NewServer()
	paymentsv1.RegisterPaymentsServiceServer(srv, s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// Connected before the test's deadlines start.
	if _, err := paymentsv1.NewPaymentsServiceClient(conn).GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "warm-up"}, grpc.WaitForReady(true)); err != nil && status.Code(err) != codes.NotFound {
		t.Fatalf("warm-up lookup = %v", err)
	}
	return paymentsclient.New(conn, append([]paymentsclient.Option{paymentsclient.WithBackoff(time.Millisecond, 10*time.Millisecond)}, opts...)...)
}

// failure is a paymentsd error with reason and, if retryAfter > 0, a
// RetryInfo.
func failure(code codes.Code, reason string, retryAfter time.Duration) error {
	st := status.New(code, "scripted")
	var details []protoadapt.MessageV1
	if reason != "" {
		details = append(details, &errdetails.ErrorInfo{Reason: reason, Domain: "paymentsd.example.com"})
	}
	if retryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)})
	}
	if len(details) > 0 {
		st, _ = st.WithDetails(details...)
	}
	return st.Err()
}

func TestRetryTable(t *testing.T) {
	t.Parallel()
	retried := []struct {
		name string
		err  error
	}{
		{"outcome unknown", failure(codes.Internal, paymentsclient.ReasonOutcomeUnknown, 0)},
		{"in progress", failure(codes.Aborted, paymentsclient.ReasonInProgress, 0)},
		{"in progress past the deadline", failure(codes.DeadlineExceeded, paymentsclient.ReasonInProgress, 0)},
		{"not sent, store down", failure(codes.Unavailable, paymentsclient.ReasonNotSent, 0)},
		{"not sent, too many calls", failure(codes.ResourceExhausted, paymentsclient.ReasonNotSent, 0)},
		{"provider unreachable", failure(codes.Unavailable, paymentsclient.ReasonNotCreated, 0)},
		{"provider rate limited", failure(codes.ResourceExhausted, paymentsclient.ReasonNotCreated, 0)},
		{"transport unavailable", status.Error(codes.Unavailable, "connection refused")},
		{"transport deadline", status.Error(codes.DeadlineExceeded, "deadline")},
		{"transport resource exhausted", status.Error(codes.ResourceExhausted, "cap")},
		{"transport internal", status.Error(codes.Internal, "stream reset")},
	}
	for _, tt := range retried {
		t.Run("retries/"+tt.name, func(t *testing.T) {
			t.Parallel()
			s := &scripted{script: []error{tt.err, tt.err}}
			c := startScripted(t, s)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			if _, err := c.Create(ctx, payment("key-1")); err != nil {
				t.Fatalf("Create after %v twice = %v, want success on the third attempt", tt.err, err)
			}
			if len(s.keys) != 3 || s.keys[0] != "key-1" || s.keys[1] != "key-1" || s.keys[2] != "key-1" {
				t.Errorf("keys sent %q, want key-1 three times", s.keys)
			}
		})
	}

	terminal := []struct {
		name string
		err  error
		want error
	}{
		{"not created", failure(codes.PermissionDenied, paymentsclient.ReasonNotCreated, 0), paymentsclient.ErrNotCreated},
		{"not created, provider timeout", failure(codes.DeadlineExceeded, paymentsclient.ReasonNotCreated, 0), paymentsclient.ErrNotCreated},
		{"provider 400", failure(codes.InvalidArgument, paymentsclient.ReasonNotCreated, 0), paymentsclient.ErrInvalidRequest},
		{"invalid", failure(codes.InvalidArgument, paymentsclient.ReasonNotSent, 0), paymentsclient.ErrInvalidRequest},
		{"key reused", failure(codes.FailedPrecondition, paymentsclient.ReasonKeyReused, 0), paymentsclient.ErrKeyReused},
		{"key expired", failure(codes.FailedPrecondition, paymentsclient.ReasonKeyExpired, 0), paymentsclient.ErrKeyExpired},
		{"key not owned", failure(codes.PermissionDenied, paymentsclient.ReasonKeyNotOwned, 0), paymentsclient.ErrKeyNotOwned},
		{"caller not allowed", failure(codes.PermissionDenied, paymentsclient.ReasonCallerNotAllowed, 0), paymentsclient.ErrCallerNotAllowed},
		{"unknown reason", failure(codes.FailedPrecondition, "SOMETHING_NEW", 0), paymentsclient.ErrOutcomeUnknown},
	}
	for _, tt := range terminal {
		t.Run("stops/"+tt.name, func(t *testing.T) {
			t.Parallel()
			s := &scripted{script: []error{tt.err}}
			c := startScripted(t, s)
			_, err := c.Create(t.Context(), payment("key-1"))
			var perr *paymentsclient.Error
			if !errors.As(err, &perr) || !errors.Is(err, tt.want) {
				t.Fatalf("Create after %v = %v, want %v", tt.err, err, tt.want)
			}
			if perr.Attempts != 1 || len(s.keys) != 1 {
				t.Errorf("Create after %v made %d attempts (server saw %d), want 1", tt.err, perr.Attempts, len(s.keys))
			}
			if status.Code(err) != status.Code(tt.err) {
				t.Errorf("status.Code(%v) = %v, want %v", err, status.Code(err), status.Code(tt.err))
			}
			for _, other := range []error{paymentsclient.ErrNotCreated, paymentsclient.ErrOutcomeUnknown, paymentsclient.ErrKeyReused, paymentsclient.ErrKeyExpired, paymentsclient.ErrKeyNotOwned, paymentsclient.ErrCallerNotAllowed} {
				if other != tt.want && errors.Is(err, other) && !(tt.want == paymentsclient.ErrInvalidRequest && other == paymentsclient.ErrNotCreated) {
					t.Errorf("Create after %v = %v, which also matches %v", tt.err, err, other)
				}
			}
		})
	}
}

// TestRetryInfoHonoured: a retry waits at least paymentsd's RetryInfo delay.
func TestRetryInfoHonoured(t *testing.T) {
	t.Parallel()
	const delay = 300 * time.Millisecond
	s := &scripted{script: []error{failure(codes.Aborted, paymentsclient.ReasonInProgress, delay)}}
	c := startScripted(t, s)
	start := time.Now()
	if _, err := c.Create(t.Context(), payment("key-1")); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < delay {
		t.Errorf("Create retried after %v, before the RetryInfo's %v", took, delay)
	}
}

// TestDeadlineWithinRetryInfo: a RetryInfo longer than the time left does
// not hold Create past its deadline; it looks the key up then.
func TestDeadlineWithinRetryInfo(t *testing.T) {
	t.Parallel()
	s := &scripted{
		script: []error{failure(codes.Aborted, paymentsclient.ReasonInProgress, time.Hour)},
		record: &paymentsv1.GetMultiCardPaymentResponse{State: paymentsv1.PaymentState_PAYMENT_STATE_IN_PROGRESS, Request: payment("key-1")},
	}
	c := startScripted(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Create(ctx, payment("key-1"))
		done <- err
	}()
	select {
	case err := <-done:
		var perr *paymentsclient.Error
		if !errors.As(err, &perr) || !errors.Is(err, paymentsclient.ErrInProgress) || perr.RetryAfter != time.Hour {
			t.Errorf("Create = %v, want ErrInProgress with RetryAfter 1h", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Create slept past its deadline")
	}
}

// TestAttemptTimeout: an attempt that gets no answer is cut off and
// retried with the same key while the context has time left.
func TestAttemptTimeout(t *testing.T) {
	t.Parallel()
	s := &scripted{hang: 2}
	c := startScripted(t, s, paymentsclient.WithAttemptTimeout(100*time.Millisecond))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := c.Create(ctx, payment("key-1")); err != nil {
		t.Fatalf("Create with two attempts unanswered = %v, want success on the third", err)
	}
	if len(s.keys) != 3 || s.keys[2] != "key-1" {
		t.Errorf("keys sent %q, want key-1 three times", s.keys)
	}
}

// TestNotCreatedAfterAnUnansweredAttempt: attempt 1 reaches paymentsd
// and is cut off by the attempt timeout before its answer; attempt 2 gets
// PAYMENT_NOT_CREATED. Attempt 1's fate is unknown, so the answer is
// ErrOutcomeUnknown, never ErrNotCreated.
func TestNotCreatedAfterAnUnansweredAttempt(t *testing.T) {
	t.Parallel()
	s := &scripted{hang: 1, script: []error{failure(codes.PermissionDenied, paymentsclient.ReasonNotCreated, 0)}}
	c := startScripted(t, s, paymentsclient.WithAttemptTimeout(100*time.Millisecond))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := c.Create(ctx, payment("key-1"))
	var perr *paymentsclient.Error
	if !errors.As(err, &perr) || perr.Attempts != 2 {
		t.Fatalf("Create = %v, want an error after 2 attempts", err)
	}
	if errors.Is(err, paymentsclient.ErrNotCreated) || !errors.Is(err, paymentsclient.ErrOutcomeUnknown) {
		t.Errorf("Create after an unanswered attempt and PAYMENT_NOT_CREATED = %v, want ErrOutcomeUnknown, never ErrNotCreated", err)
	}
	if status.Code(err) != codes.PermissionDenied || perr.Reason != paymentsclient.ReasonNotCreated {
		t.Errorf("Create = %v: code %v, reason %q; want the last answer's PermissionDenied, %s", err, status.Code(err), perr.Reason, paymentsclient.ReasonNotCreated)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Create = %v with time left, want no context error", err)
	}
}

// TestMaxAttempts: once the attempts allowed are spent, Create answers
// from the key's record.
func TestMaxAttempts(t *testing.T) {
	t.Parallel()
	unknown := failure(codes.Unavailable, paymentsclient.ReasonOutcomeUnknown, 0)
	s := &scripted{
		script: []error{unknown, unknown, unknown, unknown},
		record: &paymentsv1.GetMultiCardPaymentResponse{State: paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN, Request: payment("key-1")},
	}
	c := startScripted(t, s, paymentsclient.WithMaxAttempts(3))
	_, err := c.Create(t.Context(), payment("key-1"))
	var perr *paymentsclient.Error
	if !errors.As(err, &perr) || !errors.Is(err, paymentsclient.ErrOutcomeUnknown) || perr.Attempts != 3 || perr.State != paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN {
		t.Fatalf("Create = %v, want ErrOutcomeUnknown after 3 attempts, from the record", err)
	}
}

// TestHugeRetryInfo: a RetryInfo as long as a Duration holds (durationpb
// saturates there) still holds Create to its deadline: it does not give
// up at once while time is left.
func TestHugeRetryInfo(t *testing.T) {
	t.Parallel()
	st, _ := status.New(codes.Aborted, "scripted").WithDetails(
		&errdetails.ErrorInfo{Reason: paymentsclient.ReasonInProgress, Domain: "paymentsd.example.com"},
		&errdetails.RetryInfo{RetryDelay: &durationpb.Duration{Seconds: 1 << 62}},
	)
	s := &scripted{
		script: []error{st.Err()},
		record: &paymentsv1.GetMultiCardPaymentResponse{State: paymentsv1.PaymentState_PAYMENT_STATE_IN_PROGRESS, Request: payment("key-1")},
	}
	c := startScripted(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := c.Create(ctx, payment("key-1"))
	// Had the wait wrapped negative, Create would have stopped at once,
	// with time left: its error would not be the deadline's.
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Create = %v, want it to wait out the RetryInfo until its time ran out (context.DeadlineExceeded)", err)
	}
	if !errors.Is(err, paymentsclient.ErrInProgress) {
		t.Errorf("Create = %v, want ErrInProgress", err)
	}
}
