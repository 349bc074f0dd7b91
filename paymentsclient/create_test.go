package paymentsclient_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/paymentsclient"
)

func TestCreateSendsTheCallersKey(t *testing.T) {
	t.Parallel()
	p := startPaymentsd(t, paymentsdOptions{})
	c := paymentsclient.New(p.conn)
	key := paymentsclient.NewIdempotencyKey()
	req := payment(key)
	sent := proto.Clone(req)

	resp, err := c.Create(t.Context(), req)
	if err != nil {
		t.Fatalf("Create(%s) = %v, want a payment", key, err)
	}
	if resp.GetReplayed() || resp.GetProviderHttpStatus() != http.StatusOK {
		t.Errorf("Create(%s) replayed %v, status %d; want a new payment, 200", key, resp.GetReplayed(), resp.GetProviderHttpStatus())
	}
	if !proto.Equal(req, sent) {
		t.Errorf("Create changed the caller's request: %v, was %v", req, sent)
	}
	again, err := c.Create(t.Context(), req)
	if err != nil || !again.GetReplayed() {
		t.Errorf("Create(%s) again = replayed %v, %v; want the replay", key, again.GetReplayed(), err)
	}
	rec, err := c.Get(t.Context(), key)
	if err != nil || rec.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED {
		t.Errorf("Get(%s) = %v, %v; want SUCCEEDED", key, rec.GetState(), err)
	}
	p.onlyKey(t, key)
	if got := p.provider.KeyStats(key).Charges; got != 1 {
		t.Errorf("provider charged key %d times, want 1", got)
	}
}

// TestCreateRetriesWhileTimeIsLeft scripts the provider to fail in each
// way for 1.5 s and then recover: with time to spend, Create must keep
// retrying with the caller's key, and end with the payment, charged once.
func TestCreateRetriesWhileTimeIsLeft(t *testing.T) {
	t.Parallel()
	failures := []struct {
		name  string
		reply simulator.Reply
	}{
		{"500", simulator.Reply{Status: http.StatusInternalServerError, Body: []byte(`{"error":"boom"}`)}},
		{"503", simulator.Reply{Status: http.StatusServiceUnavailable}},
		{"429", simulator.Reply{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"1"}}}},
		{"409", simulator.Reply{Status: http.StatusConflict}},
		{"reset", simulator.Reply{Fault: simulator.Reset}},
		{"hangup", simulator.Reply{Fault: simulator.Hangup}},
		{"cut body", simulator.Reply{Fault: simulator.CutBody}},
		// Longer than paymentsd's upstream timeout: each attempt is cut
		// off and presumed still at the provider for the quiet period.
		{"timeout", simulator.Reply{Delay: 2 * upstreamTimeout}},
	}
	for _, f := range failures {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			p := startPaymentsd(t, paymentsdOptions{})
			start := time.Now()
			p.provider.SetScript(func(int, simulator.Request) simulator.Reply {
				if time.Since(start) < 1500*time.Millisecond {
					return f.reply
				}
				return simulator.Reply{}
			})
			c := paymentsclient.New(p.conn)
			key := paymentsclient.NewIdempotencyKey()
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			resp, err := c.Create(ctx, payment(key))
			if err != nil {
				t.Fatalf("Create(%s) with the provider failing (%s) for 1.5 s, 20 s to spend = %v; want the payment", key, f.name, err)
			}
			if resp.GetProviderHttpStatus() != http.StatusOK {
				t.Errorf("Create(%s) provider status %d, want 200", key, resp.GetProviderHttpStatus())
			}
			p.onlyKey(t, key)
			if n := p.provider.KeyStats(key).Requests; n < 2 {
				t.Errorf("provider got %d requests with the key, want a retry", n)
			}
		})
	}
}

// TestCreateStubbornProvider: the provider creates the payment but takes
// longer than paymentsd waits; Create's retries with the same key get
// that payment, never a second one.
func TestCreateStubbornProvider(t *testing.T) {
	t.Parallel()
	p := startPaymentsd(t, paymentsdOptions{})
	p.provider.Stubborn(true)
	p.provider.SetScript(simulator.Sequence(simulator.Reply{Delay: 3 * upstreamTimeout / 2}))
	c := paymentsclient.New(p.conn)
	key := paymentsclient.NewIdempotencyKey()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := c.Create(ctx, payment(key)); err != nil {
		t.Fatalf("Create(%s) = %v, want the payment", key, err)
	}
	p.onlyKey(t, key)
	if got := p.provider.KeyStats(key).Charges; got != 1 {
		t.Errorf("provider charged the key %d times, want 1", got)
	}
}

func TestCreateTerminal(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		reply    simulator.Reply
		want     error
		wantCode codes.Code
	}{
		{"provider 403", simulator.Reply{Status: http.StatusForbidden}, paymentsclient.ErrNotCreated, codes.PermissionDenied},
		{"provider 401", simulator.Reply{Status: http.StatusUnauthorized}, paymentsclient.ErrNotCreated, codes.Unauthenticated},
		{"provider 400", simulator.Reply{Status: http.StatusBadRequest}, paymentsclient.ErrInvalidRequest, codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := startPaymentsd(t, paymentsdOptions{})
			p.provider.SetScript(simulator.Always(tt.reply))
			key := paymentsclient.NewIdempotencyKey()
			_, err := paymentsclient.New(p.conn).Create(t.Context(), payment(key))
			checkError(t, err, key, tt.want, tt.wantCode, 1)
			if !errors.Is(err, paymentsclient.ErrNotCreated) {
				t.Errorf("Create(%s) = %v, want ErrNotCreated too", key, err)
			}
			p.onlyKey(t, key)
		})
	}

	t.Run("key reused", func(t *testing.T) {
		t.Parallel()
		p := startPaymentsd(t, paymentsdOptions{})
		c := paymentsclient.New(p.conn)
		key := paymentsclient.NewIdempotencyKey()
		if _, err := c.Create(t.Context(), payment(key)); err != nil {
			t.Fatal(err)
		}
		other := payment(key)
		other.AmountMoney.Amount++
		_, err := c.Create(t.Context(), other)
		checkError(t, err, key, paymentsclient.ErrKeyReused, codes.FailedPrecondition, 1)
		p.onlyKey(t, key)
	})
	t.Run("invalid", func(t *testing.T) {
		t.Parallel()
		p := startPaymentsd(t, paymentsdOptions{})
		key := paymentsclient.NewIdempotencyKey()
		req := payment(key)
		req.AmountMoney.Currency = "usd"
		_, err := paymentsclient.New(p.conn).Create(t.Context(), req)
		checkError(t, err, key, paymentsclient.ErrInvalidRequest, codes.InvalidArgument, 1)
		if errors.Is(err, paymentsclient.ErrNotCreated) {
			t.Errorf("Create(invalid) = %v: REQUEST_NOT_SENT is not ErrNotCreated", err)
		}
		if n := len(p.provider.AllKeyStats()); n != 0 {
			t.Errorf("the provider saw %d keys, want none", n)
		}
	})
	t.Run("caller not allowed", func(t *testing.T) {
		t.Parallel()
		p := startPaymentsd(t, paymentsdOptions{allowedCallers: []string{"spiffe://example.com/checkout"}})
		key := paymentsclient.NewIdempotencyKey()
		_, err := paymentsclient.New(p.conn).Create(t.Context(), payment(key))
		checkError(t, err, key, paymentsclient.ErrCallerNotAllowed, codes.PermissionDenied, 1)
		if n := len(p.provider.AllKeyStats()); n != 0 {
			t.Errorf("the provider saw %d keys, want none", n)
		}
	})
}

// TestCreateEmptyKey: Create never makes up a key; a request without one
// is refused before anything is sent, and left as it was.
func TestCreateEmptyKey(t *testing.T) {
	t.Parallel()
	p := startPaymentsd(t, paymentsdOptions{})
	req := payment("")
	_, err := paymentsclient.New(p.conn).Create(t.Context(), req)
	checkError(t, err, "", paymentsclient.ErrInvalidRequest, codes.InvalidArgument, 0)
	if req.GetIdempotencyKey() != "" {
		t.Errorf("Create set the caller's key to %q", req.GetIdempotencyKey())
	}
	if n := len(p.provider.AllKeyStats()); n != 0 {
		t.Errorf("the provider saw %d keys, want none", n)
	}
}

// TestCreateDeadline: when its time runs out, Create looks the key up and
// answers from the record.
func TestCreateDeadline(t *testing.T) {
	t.Parallel()

	t.Run("outcome unknown", func(t *testing.T) {
		t.Parallel()
		p := startPaymentsd(t, paymentsdOptions{})
		p.provider.SetScript(simulator.Always(simulator.Reply{Status: http.StatusInternalServerError}))
		p.ready(t)
		key := paymentsclient.NewIdempotencyKey()
		ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
		defer cancel()
		_, err := paymentsclient.New(p.conn).Create(ctx, payment(key))
		// The lookup may catch settlement re-sending the key: then the
		// record is IN_PROGRESS, and so is the answer.
		var perr *paymentsclient.Error
		if !errors.As(err, &perr) {
			t.Fatalf("Create(%s) against a provider answering 500 = %v, want a *paymentsclient.Error", key, err)
		}
		// It retried until its time ran out: the error says so.
		if !errors.Is(err, context.DeadlineExceeded) || perr.Attempts < 2 {
			t.Errorf("Create(%s) = %v after %d attempts, want retries until context.DeadlineExceeded", key, err, perr.Attempts)
		}
		switch perr.State {
		case paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN:
			if !errors.Is(err, paymentsclient.ErrOutcomeUnknown) {
				t.Errorf("Create(%s) = %v with record state %v, want ErrOutcomeUnknown", key, err, perr.State)
			}
		case paymentsv1.PaymentState_PAYMENT_STATE_IN_PROGRESS:
			if !errors.Is(err, paymentsclient.ErrInProgress) {
				t.Errorf("Create(%s) = %v with record state %v, want ErrInProgress", key, err, perr.State)
			}
		default:
			t.Errorf("Create(%s) = %v, record state %v; want the lookup's OUTCOME_UNKNOWN or IN_PROGRESS", key, err, perr.State)
		}
		if errors.Is(err, paymentsclient.ErrNotCreated) {
			t.Errorf("Create(%s) = %v must not allow a new key", key, err)
		}
		p.onlyKey(t, key)
	})

	t.Run("in progress", func(t *testing.T) {
		t.Parallel()
		// paymentsd waits for the provider far longer than the caller, so
		// the record is IN_PROGRESS when the caller's deadline comes.
		p := startPaymentsd(t, paymentsdOptions{upstreamTimeout: time.Minute})
		release := make(chan struct{})
		defer close(release)
		// Held until the test ends.
		p.provider.SetScript(simulator.Always(simulator.Reply{Wait: release}))
		p.ready(t)
		key := paymentsclient.NewIdempotencyKey()
		// Long enough that the lookup's reserve (a quarter, at most 2 s)
		// answers on a loaded machine.
		ctx, cancel := context.WithTimeout(t.Context(), 8*time.Second)
		defer cancel()
		_, err := paymentsclient.New(p.conn).Create(ctx, payment(key))
		var perr *paymentsclient.Error
		if !errors.As(err, &perr) || !errors.Is(err, paymentsclient.ErrInProgress) {
			t.Fatalf("Create(%s) with the provider holding the request = %v, want ErrInProgress", key, err)
		}
		if perr.State != paymentsv1.PaymentState_PAYMENT_STATE_IN_PROGRESS {
			t.Errorf("Create(%s) error state %v, want IN_PROGRESS from the lookup", key, perr.State)
		}
		p.onlyKey(t, key)
	})

	t.Run("answer lost", func(t *testing.T) {
		t.Parallel()
		// The network loses paymentsd's answer to the first call until
		// the caller's deadline: the lookup finds the payment.
		var once sync.Once
		lose := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			lost := false
			if method == paymentsv1.PaymentsService_CreateMultiCardPayment_FullMethodName {
				once.Do(func() { lost = true })
			}
			if !lost {
				return invoker(ctx, method, req, reply, cc, opts...)
			}
			// paymentsd gets the call and answers it, however long that
			// takes; the caller hears nothing until its deadline.
			if err := invoker(context.WithoutCancel(ctx), method, req, reply, cc, opts...); err != nil {
				return err
			}
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		}
		p := startPaymentsd(t, paymentsdOptions{interceptor: lose})
		p.ready(t)
		key := paymentsclient.NewIdempotencyKey()
		// Long enough that the lookup's reserve (a quarter, at most 2 s)
		// answers on a loaded machine.
		ctx, cancel := context.WithTimeout(t.Context(), 8*time.Second)
		defer cancel()
		resp, err := paymentsclient.New(p.conn).Create(ctx, payment(key))
		if err != nil {
			t.Fatalf("Create(%s) whose answer was lost = %v, want the payment from the lookup", key, err)
		}
		if !resp.GetReplayed() || resp.GetProviderHttpStatus() != http.StatusOK || len(resp.GetPaymentJson()) == 0 {
			t.Errorf("Create(%s) = replayed %v, status %d, %d bytes; want the recorded payment", key, resp.GetReplayed(), resp.GetProviderHttpStatus(), len(resp.GetPaymentJson()))
		}
		p.onlyKey(t, key)
	})
}

func TestGet(t *testing.T) {
	t.Parallel()
	p := startPaymentsd(t, paymentsdOptions{})
	c := paymentsclient.New(p.conn)
	_, err := c.Get(t.Context(), "never-used")
	checkError(t, err, "never-used", paymentsclient.ErrNotFound, codes.NotFound, 1)
	_, err = c.Get(t.Context(), "")
	checkError(t, err, "", paymentsclient.ErrInvalidRequest, codes.InvalidArgument, 0)
}

// checkError fails t unless err is an *Error for key that matches want,
// with code and attempts.
func checkError(t *testing.T, err error, key string, want error, code codes.Code, attempts int) {
	t.Helper()
	var perr *paymentsclient.Error
	if !errors.As(err, &perr) {
		t.Fatalf("error %v (%T), want a *paymentsclient.Error", err, err)
	}
	if !errors.Is(err, want) || perr.Code != code || perr.IdempotencyKey != key || perr.Attempts != attempts {
		t.Errorf("error %v: code %v, key %q, %d attempts; want %v, %v, %q, %d", err, perr.Code, perr.IdempotencyKey, perr.Attempts, want, code, key, attempts)
	}
	if status.Code(err) != code && perr.Err != nil {
		t.Errorf("status.Code(%v) = %v, want %v", err, status.Code(err), code)
	}
}

// TestCreateKeyExpired: a key whose record retention deleted is refused
// for good, and Create says so at once, with nothing sent.
func TestCreateKeyExpired(t *testing.T) {
	t.Parallel()
	p := startPaymentsd(t, paymentsdOptions{retention: time.Millisecond})
	c := paymentsclient.New(p.conn)
	key := paymentsclient.NewIdempotencyKey()
	if _, err := c.Create(t.Context(), payment(key)); err != nil {
		t.Fatal(err)
	}
	// Retention runs every 100 ms; no event marks its pass but the
	// lookup's answer.
	deadline := time.After(time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := c.Get(t.Context(), key)
		if errors.Is(err, paymentsclient.ErrKeyExpired) {
			if !errors.Is(err, paymentsclient.ErrNotFound) || status.Code(err) != codes.NotFound {
				t.Errorf("Get(expired %s) = %v, want ErrNotFound too, NotFound", key, err)
			}
			break
		}
		if err != nil && !errors.Is(err, paymentsclient.ErrNotFound) {
			t.Fatalf("Get(%s) = %v", key, err)
		}
		select {
		case <-deadline:
			t.Fatal("the record was not deleted within a minute")
		case <-tick.C:
		}
	}
	requests := p.provider.KeyStats(key).Requests
	_, err := c.Create(t.Context(), payment(key))
	checkError(t, err, key, paymentsclient.ErrKeyExpired, codes.FailedPrecondition, 1)
	if errors.Is(err, paymentsclient.ErrNotCreated) {
		t.Errorf("Create(expired key) = %v: must not allow a new key", err)
	}
	if n := p.provider.KeyStats(key).Requests; n != requests {
		t.Errorf("the provider got %d more requests with the expired key, want none", n-requests)
	}
}

// TestCreateUntilPaymentsdIsUp: paymentsd is not listening when Create
// starts; it retries the transport's UNAVAILABLE with the same key until
// paymentsd comes up.
func TestCreateUntilPaymentsdIsUp(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	refused := make(chan struct{})
	var once sync.Once
	noteRefusal := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if status.Code(err) == codes.Unavailable {
			once.Do(func() { close(refused) })
		}
		return err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(noteRefusal))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// However long paymentsd takes to start on a loaded machine, the
	// client waits for it (not only WithNotReachedTimeout's default).
	c := paymentsclient.New(conn, paymentsclient.WithBackoff(10*time.Millisecond, 200*time.Millisecond), paymentsclient.WithNotReachedTimeout(0))
	key := paymentsclient.NewIdempotencyKey()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Create(ctx, payment(key))
		done <- err
	}()

	<-refused
	p := startPaymentsd(t, paymentsdOptions{addr: addr})
	if err := <-done; err != nil {
		t.Fatalf("Create(%s) while paymentsd came up = %v, want the payment", key, err)
	}
	p.onlyKey(t, key)
	if n := p.provider.KeyStats(key).Requests; n != 1 {
		t.Errorf("the provider got %d requests with the key, want 1", n)
	}
}

// TestCreateLookupOfAnotherRequest: a caller reuses a key for a different
// amount, and every attempt is lost before paymentsd (which would have
// said IDEMPOTENCY_KEY_REUSED). The lookup then finds the first request's
// payment, which is not this request's: Create must not return it as this
// payment, nor say ErrNotCreated; the answer is ErrKeyReused.
func TestCreateLookupOfAnotherRequest(t *testing.T) {
	t.Parallel()
	var lose sync.Map // keys whose Create calls are lost
	interceptor := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*paymentsv1.CreateMultiCardPaymentRequest); ok {
			if _, ok := lose.Load(r.GetAmountMoney().GetAmount()); ok {
				return status.Error(codes.Unavailable, "connection lost before paymentsd")
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	p := startPaymentsd(t, paymentsdOptions{interceptor: interceptor})
	p.ready(t)
	c := paymentsclient.New(p.conn, paymentsclient.WithBackoff(time.Millisecond, 10*time.Millisecond))
	key := paymentsclient.NewIdempotencyKey()
	first := payment(key)
	if _, err := c.Create(t.Context(), first); err != nil {
		t.Fatalf("Create(%s) = %v, want the payment", key, err)
	}

	for _, tc := range []struct {
		name  string
		other *paymentsv1.CreateMultiCardPaymentRequest
	}{
		{"amount", &paymentsv1.CreateMultiCardPaymentRequest{AmountMoney: &paymentsv1.Money{Currency: "USD", Amount: 99999}, IdempotencyKey: key}},
		{"currency", &paymentsv1.CreateMultiCardPaymentRequest{AmountMoney: &paymentsv1.Money{Currency: "EUR", Amount: 77777}, IdempotencyKey: key}},
	} {
		lose.Store(tc.other.GetAmountMoney().GetAmount(), true)
		resp, err := paymentsclient.New(p.conn, paymentsclient.WithMaxAttempts(2), paymentsclient.WithBackoff(time.Millisecond, time.Millisecond)).Create(t.Context(), tc.other)
		if err == nil {
			t.Errorf("%s: Create(%s) of another request under a used key, every attempt lost = the first request's payment (replayed %v); want ErrKeyReused", tc.name, key, resp.GetReplayed())
			continue
		}
		var perr *paymentsclient.Error
		if !errors.As(err, &perr) || !errors.Is(err, paymentsclient.ErrKeyReused) || errors.Is(err, paymentsclient.ErrNotCreated) {
			t.Errorf("%s: Create(%s) = %v, want ErrKeyReused only", tc.name, key, err)
		}
	}
	p.onlyKey(t, key)
	if n := p.provider.KeyStats(key).Charges; n != 1 {
		t.Errorf("provider charged the key %d times, want 1", n)
	}
}

// TestCreateLookupWhileAnAttemptIsLate: attempt 1 is held on its way to
// paymentsd (a congested link, a proxy) past the end of Create's
// attempts, and cut off by the attempt timeout; the others go by another
// path, and the provider refuses them
// with 429 (the record says NOT_CREATED, and the answer is retried). At
// the deadline the lookup finds NOT_CREATED, which does not cover attempt
// 1: delivered after the lookup, it creates the payment. Create must not
// have said ErrNotCreated, which would let the caller pay again under a
// new key.
func TestCreateLookupWhileAnAttemptIsLate(t *testing.T) {
	t.Parallel()
	var lookups atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*paymentsv1.GetMultiCardPaymentRequest); ok && r.GetIdempotencyKey() != "warm-up" {
			lookups.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	p := startPaymentsd(t, paymentsdOptions{interceptor: count})
	var refuse atomic.Bool // the provider answers 429 until the late attempt
	refuse.Store(true)
	p.provider.SetScript(func(int, simulator.Request) simulator.Reply {
		if refuse.Load() {
			return simulator.Reply{Status: http.StatusTooManyRequests}
		}
		return simulator.Reply{}
	})
	p.ready(t)
	l := startLink(t, p.addr)
	slow := dialLink(t, l)
	l.Hold()

	key := paymentsclient.NewIdempotencyKey()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
	defer cancel()
	c := paymentsclient.New(&routes{slow: slow, fast: p.conn},
		paymentsclient.WithAttemptTimeout(time.Second),
		paymentsclient.WithBackoff(time.Millisecond, 10*time.Millisecond))
	_, err := c.Create(ctx, payment(key))
	var perr *paymentsclient.Error
	if !errors.As(err, &perr) || perr.State != paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED || lookups.Load() == 0 {
		t.Fatalf("Create(%s) = %v after %d lookups; the test did not stage a lookup finding NOT_CREATED", key, err, lookups.Load())
	}
	if errors.Is(err, paymentsclient.ErrNotCreated) || !errors.Is(err, paymentsclient.ErrOutcomeUnknown) {
		t.Errorf("Create(%s) with an attempt still on its way = %v, want ErrOutcomeUnknown, never ErrNotCreated", key, err)
	}

	// The late attempt arrives, and pays.
	refuse.Store(false)
	l.Release()
	waitForState(t, c, key, paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED)
	p.onlyKey(t, key)
}
