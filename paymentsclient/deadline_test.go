package paymentsclient_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/paymentsclient"
)

// TestCreateNotCreatedWhileAnAttemptIsInTransit: attempt 1 is held on its
// way to paymentsd and cut off by the attempt timeout; attempt 2 goes by
// another path, and the provider refuses it (400: PAYMENT_NOT_CREATED).
// Then attempt 1 arrives, and the provider accepts it. Create must not have
// said ErrNotCreated, which would let the caller pay again under a new key:
// an attempt was unaccounted for, so the outcome was unknown.
func TestCreateNotCreatedWhileAnAttemptIsInTransit(t *testing.T) {
	t.Parallel()
	p := startPaymentsd(t, paymentsdOptions{})
	p.provider.SetScript(simulator.Sequence(simulator.Reply{Status: http.StatusBadRequest}))
	p.ready(t)
	l := startLink(t, p.addr)
	slow := dialLink(t, l)
	l.Hold()

	c := paymentsclient.New(&routes{slow: slow, fast: p.conn},
		paymentsclient.WithAttemptTimeout(time.Second),
		paymentsclient.WithBackoff(time.Millisecond, 10*time.Millisecond))
	key := paymentsclient.NewIdempotencyKey()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	_, err := c.Create(ctx, payment(key))
	var perr *paymentsclient.Error
	if !errors.As(err, &perr) || perr.Attempts != 2 || perr.Reason != paymentsclient.ReasonNotCreated {
		t.Fatalf("Create(%s) = %v; the test did not stage attempt 2's PAYMENT_NOT_CREATED", key, err)
	}
	if errors.Is(err, paymentsclient.ErrNotCreated) || !errors.Is(err, paymentsclient.ErrOutcomeUnknown) {
		t.Errorf("Create(%s) with attempt 1 on its way = %v, want ErrOutcomeUnknown, never ErrNotCreated", key, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Create(%s) = %v with 20 s left, want no context error", key, err)
	}

	// Attempt 1 arrives, and pays.
	l.Release()
	waitForState(t, c, key, paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED)
	resp, err := c.Create(ctx, payment(key))
	if err != nil || !resp.GetReplayed() {
		t.Errorf("Create(%s) again = replayed %v, %v; want attempt 1's payment", key, resp.GetReplayed(), err)
	}
	p.onlyKey(t, key)
	if n := p.provider.KeyStats(key).Charges; n != 1 {
		t.Errorf("provider charged the key %d times, want 1", n)
	}
}

// TestCreateReturnsByItsDeadline: paymentsd goes silent (the link holds
// everything sent to it) with a payment's attempt and lookup on their
// way. Create must return when its 2 s context ends, with an error that
// matches both ErrOutcomeUnknown and context.DeadlineExceeded.
//
// That it returned no later than the deadline is checked without a clock:
// every call Create made ran on a context whose deadline was no later than
// its own (an interceptor sees each), so nothing it waited on could outlast
// it; it returned ctx's error once ctx was done; and since the link never
// answered, it waited for nothing else.
func TestCreateReturnsByItsDeadline(t *testing.T) {
	t.Parallel()
	p := startPaymentsd(t, paymentsdOptions{})
	p.ready(t)
	var (
		mu    sync.Mutex
		calls []call
	)
	record := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		deadline, ok := ctx.Deadline()
		mu.Lock()
		calls = append(calls, call{method: method, deadline: deadline, hasDeadline: ok})
		mu.Unlock()
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	l := startLink(t, p.addr)
	conn := dialLink(t, l, grpc.WithUnaryInterceptor(record))
	mu.Lock()
	calls = nil // the warm-up
	mu.Unlock()
	l.Hold()

	key := paymentsclient.NewIdempotencyKey()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	deadline, _ := ctx.Deadline()
	returned := make(chan error, 1)
	go func() {
		_, err := paymentsclient.New(conn).Create(ctx, payment(key))
		returned <- err
	}()
	var err error
	select {
	case err = <-returned:
	case <-time.After(time.Minute):
		// Not a measurement: a hang would otherwise end only with the
		// test binary's timeout.
		t.Fatalf("Create(%s) has not returned a minute after its 2 s deadline", key)
	}
	if ctx.Err() == nil {
		t.Errorf("Create(%s) = %v before its context was done; with paymentsd silent, nothing could answer it", key, err)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, paymentsclient.ErrOutcomeUnknown) || errors.Is(err, paymentsclient.ErrNotCreated) {
		t.Errorf("Create(%s) with paymentsd silent = %v; want ErrOutcomeUnknown and context.DeadlineExceeded", key, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) < 2 {
		t.Errorf("Create made calls %v, want an attempt and a lookup", calls)
	}
	for _, c := range calls {
		if !c.hasDeadline || c.deadline.After(deadline) {
			t.Errorf("Create's %s ran with deadline %v (set: %v), past its context's %v: it could outlast the caller's deadline", c.method, c.deadline, c.hasDeadline, deadline)
		}
	}
}

// call is one call a client made, as an interceptor saw it.
type call struct {
	method      string
	deadline    time.Time
	hasDeadline bool
}

// TestCreateCanceled: a caller cancels Create while its attempt is at the
// provider. Create returns at once, with an error that matches
// context.Canceled and says the outcome is unknown, and makes no call
// after the cancellation.
func TestCreateCanceled(t *testing.T) {
	t.Parallel()
	var lookups sync.Map
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*paymentsv1.GetMultiCardPaymentRequest); ok {
			lookups.Store(r.GetIdempotencyKey(), true)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	p := startPaymentsd(t, paymentsdOptions{upstreamTimeout: time.Minute, interceptor: count})
	release := make(chan struct{})
	defer close(release)
	arrived := make(chan struct{})
	var once sync.Once
	p.provider.SetScript(func(int, simulator.Request) simulator.Reply {
		once.Do(func() { close(arrived) })
		return simulator.Reply{Wait: release} // held until the test ends
	})
	p.ready(t)
	key := paymentsclient.NewIdempotencyKey()
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-arrived
		cancel()
	}()
	_, err := paymentsclient.New(p.conn).Create(ctx, payment(key))
	if !errors.Is(err, context.Canceled) || !errors.Is(err, paymentsclient.ErrOutcomeUnknown) {
		t.Errorf("Create(%s) cancelled while at the provider = %v, want ErrOutcomeUnknown and context.Canceled", key, err)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, paymentsclient.ErrNotCreated) {
		t.Errorf("Create(%s) cancelled = %v, want neither context.DeadlineExceeded nor ErrNotCreated", key, err)
	}
	if _, ok := lookups.Load(key); ok {
		t.Errorf("Create(%s) looked the key up after it was cancelled", key)
	}
	p.onlyKey(t, key)
}

// TestCreateNotCreatedAfterAttemptsThatNeverLeft: paymentsd is not
// listening when Create starts, so its first attempts fail before they
// have a connection to go out on; then paymentsd comes up, and its
// provider refuses the payment (403). Attempts that never left this
// process can't reach paymentsd later, so the answer is ErrNotCreated.
func TestCreateNotCreatedAfterAttemptsThatNeverLeft(t *testing.T) {
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
	p.provider.SetScript(simulator.Always(simulator.Reply{Status: http.StatusForbidden}))
	err = <-done
	var perr *paymentsclient.Error
	if !errors.As(err, &perr) || perr.Attempts < 2 {
		t.Fatalf("Create(%s) = %v; the test did not stage a refused attempt before paymentsd's answer", key, err)
	}
	if !errors.Is(err, paymentsclient.ErrNotCreated) || perr.Code != codes.PermissionDenied {
		t.Errorf("Create(%s) refused by the provider after attempts that never left = %v, want ErrNotCreated, PermissionDenied", key, err)
	}
	p.onlyKey(t, key)
}

// waitForState polls key's record until it is in state want, for at most
// a minute: the record changes without an event a test can wait on.
func waitForState(t *testing.T, c *paymentsclient.Client, key string, want paymentsv1.PaymentState) {
	t.Helper()
	deadline := time.After(time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		rec, err := c.Get(t.Context(), key)
		if err == nil && rec.GetState() == want {
			return
		}
		select {
		case <-deadline:
			t.Fatalf("key %s's record did not become %v within a minute (last: %v, %v)", key, want, rec.GetState(), err)
		case <-tick.C:
		}
	}
}
