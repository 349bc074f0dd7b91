package service

import (
	"context"
	"crypto/x509"
	"errors"
	"time"

	"google.golang.org/grpc"
)

// callerRefused is the cause of a stream's end when its caller stopped
// being admitted while it was open: the refusal a new call would get.
type callerRefused struct{ err error }

func (r *callerRefused) Error() string { return r.err.Error() }
func (r *callerRefused) Unwrap() error { return r.err }

// recheckedStream serves a stream admitted as c, and ends it, with the
// refusal a new call would get (PERMISSION_DENIED, CALLER_NOT_ALLOWED),
// once c is no longer admitted: once its certificate, or a CA it chains
// to, expires (by g.clock), or the client CAs are re-read without the one
// it chains to. A stream outlives its connection's check at open by up to
// MaxConnectionAge plus MaxConnectionAgeGrace: without this, a watch
// would go on delivering events to a certificate that expired, or whose
// CA was dropped, minutes before. Each message is checked again before it
// is sent, so none goes out after the caller stopped being admitted, even
// should a wake-up come late.
func (g gate) recheckedStream(srv any, ss grpc.ServerStream, c *caller, fullMethod string, handler grpc.StreamHandler) error {
	ctx, end := context.WithCancelCause(ss.Context())
	recheck := func() error {
		if err := g.checkCaller(c, fullMethod); err != nil {
			end(&callerRefused{err})
			return err
		}
		return nil
	}
	done := make(chan struct{})
	defer func() {
		end(nil)
		<-done
	}()
	go func() {
		defer close(done)
		g.watchCaller(ctx, c, recheck)
	}()
	err := handler(srv, &checkedStream{ServerStream: ss, ctx: ctx, recheck: recheck})
	if r := (*callerRefused)(nil); errors.As(context.Cause(ctx), &r) {
		// The handler ended on its context, or on a refused send: either
		// way, the refusal is why.
		return r.err
	}
	return err
}

// watchCaller checks c again whenever what admitted it may have changed,
// until ctx ends or recheck refuses it: at the first expiry among its
// certificate chains, and whenever the client CAs change.
func (g gate) watchCaller(ctx context.Context, c *caller, recheck func() error) {
	clock := g.clock
	if clock == nil {
		clock = SystemClock{}
	}
	for {
		// Taken before the check, so that a change during it still
		// wakes the next wait.
		var changed <-chan struct{}
		if g.trustChanged != nil {
			changed = g.trustChanged()
		}
		if recheck() != nil {
			return
		}
		var expired chan struct{}
		stop := func() bool { return false }
		if at, ok := nextExpiry(c.chains, clock.Now()); ok {
			expired = make(chan struct{})
			stop = clock.AfterFunc(at, func() { close(expired) })
		}
		select {
		case <-ctx.Done():
			stop()
			return
		case <-changed:
		case <-expired:
		}
		stop()
	}
}

// nextExpiry is the first time after now at which one of the chains'
// certificates is expired: just past the earliest NotAfter not yet
// passed. ok is false if none is left to expire.
func nextExpiry(chains [][]*x509.Certificate, now time.Time) (at time.Time, ok bool) {
	for _, chain := range chains {
		for _, cert := range chain {
			// Expired once the clock is after NotAfter (as
			// x509.Certificate.Verify and StillTrusted have it).
			if t := cert.NotAfter.Add(time.Nanosecond); t.After(now) && (!ok || t.Before(at)) {
				at, ok = t, true
			}
		}
	}
	return at, ok
}

// checkedStream is a stream whose caller is checked again before each
// message it sends, and whose context ends once the caller is refused.
type checkedStream struct {
	grpc.ServerStream
	ctx     context.Context
	recheck func() error
}

func (s *checkedStream) Context() context.Context { return s.ctx }

func (s *checkedStream) SendMsg(m any) error {
	if err := s.recheck(); err != nil {
		return err
	}
	return s.ServerStream.SendMsg(m)
}
