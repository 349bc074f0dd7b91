package service

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/store"
	"example.com/paymentsd/upstream"
)

// ErrorInfo reasons of the payment records.
const (
	// ReasonKeyReused: the key's record holds a different request.
	ReasonKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// ReasonInProgress: another call with the key is in flight, or an
	// earlier request with it may still be at the provider.
	ReasonInProgress = "PAYMENT_IN_PROGRESS"
	// ReasonKeyExpired: the key's record was deleted by retention; its
	// tombstone refuses the key for good.
	ReasonKeyExpired = "IDEMPOTENCY_KEY_EXPIRED"
)

// notCreatedWait bounds how long a call that learnt that no payment was
// created waits for its record to say so before it answers: past it, the
// caller is told the outcome is unknown (the outbox goes on writing it).
const notCreatedWait = 5 * time.Second

// CreateMultiCardPayment implements paymentsv1.PaymentsServiceServer. The
// request has been validated by the interceptor chain (see NewServer).
//
// The record for the key is committed before anything is sent, and the
// provider is called outside any transaction; see store.Begin for what a
// call may do with a key.
func (s *Service) CreateMultiCardPayment(ctx context.Context, req *paymentsv1.CreateMultiCardPaymentRequest) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	ctx, cancel := answerBeforeDeadline(ctx)
	defer cancel()
	money := req.GetAmountMoney()
	key := req.GetIdempotencyKey()
	body, err := upstream.EncodeRequest(upstream.Payment{
		Currency:       money.GetCurrency(),
		Amount:         money.GetAmount(),
		IdempotencyKey: key,
	})
	if err != nil {
		return nil, withDetails(status.New(codes.Internal, "paymentsd could not encode the request; this call sent nothing"), s.errorInfo(ReasonNotSent, nil))
	}
	claim := store.Claim{
		Key:        key,
		Body:       body,
		BodySHA256: sha256.Sum256(body),
		Currency:   money.GetCurrency(),
		Amount:     money.GetAmount(),
		Caller:     CallerFromContext(ctx),
		// A caller with an identity may use only keys it created: another
		// caller's key is refused, saying nothing of its record.
		OwnKeysOnly: CallerFromContext(ctx) != "",
		LeaseTTL:    s.leaseTTL,
		Window:      s.window,
		Quiet:       s.quiet,
	}
	if ci, ok := ctx.Value(callInfoKey{}).(*callInfo); ok {
		claim.RequestID = ci.requestID
	}
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		claim.TraceID = sc.TraceID().String()
	}

	// An outcome this process holds for the key is written first: its
	// record may be gone (the database went back in time), and a claim
	// now would find none and send the key again.
	if !s.waitPending(ctx, key) {
		return nil, s.inProgressError(key)
	}
	for {
		claim.Owner = s.owner + "/" + newRequestID()[:12]
		// The lease is counted from before the claim could commit, on
		// this process's monotonic clock: the store's clock (for
		// PostgreSQL, the server's) started it later, so the lease ends
		// no earlier than claimed plus its length, whatever this
		// process's wall clock says.
		claimed := time.Now()
		s.claims.hold(claim.Owner)
		began, err := s.store.Begin(ctx, claim)
		s.metrics.storeOp(opBegin, claimed, err)
		if err != nil {
			err = s.beginError(ctx, claim, err)
			s.claimEnded(claim.Owner, key)
			return nil, err
		}
		if began.Outcome != store.Acquired {
			s.claims.done(claim.Owner)
		}
		switch began.Outcome {
		case store.Acquired:
			// The claim ends when the outbox has written its outcome.
			return s.send(ctx, claim.Owner, claimed, began)
		case store.Quiet:
			s.metrics.quietWaits.Inc()
			return nil, s.quietError(began.Record)
		case store.Expired:
			s.metrics.expired.Inc()
			if claim.OwnKeysOnly && !began.Tombstone.CallerKnown {
				// A tombstone from before tombstones kept their caller:
				// it may be another caller's, so nothing of it is told.
				return nil, s.expiredUntoldError(key)
			}
			return nil, s.expiredError(codes.FailedPrecondition, key, began.Tombstone)
		case store.Replay:
			return s.replay(ctx, began.Record)
		case store.Reused:
			s.metrics.reuses.Inc()
			return nil, s.reusedError(key)
		case store.NotOwned:
			return nil, s.notOwnedError()
		case store.PastWindow:
			return nil, s.recordedError(began.Record)
		case store.Busy:
			rec, err := s.waitForOutcome(ctx, key, began.Record)
			if err != nil {
				return nil, err
			}
			switch rec.State {
			case store.StateSucceeded:
				return s.replay(ctx, rec)
			case store.StateNotCreated, store.StateOutcomeUnknown:
				return nil, s.recordedError(rec)
			}
			// The holder's lease expired: try to take the record over.
		default:
			// Nothing was sent by this call, but what the record holds is
			// not known: an earlier call may have created the payment.
			return nil, withDetails(status.New(codes.Internal, "paymentsd's record store gave an unexpected answer; this call sent nothing, but an earlier call with the key may have created the payment: retry with the same idempotency key"), s.errorInfo(ReasonOutcomeUnknown, nil))
		}
	}
}

// send makes the provider call for a record this call has acquired (its
// claim began at claimed), and records its outcome.
//
// The request does not end when the caller gives up: cutting off
// paymentsd's side would not stop the provider working on it, and would
// leave the key's outcome unknown and the key quiet for the provider quiet
// period. So the request runs detached from the caller, bounded only by
// the lease (and the client's timeout), and its outcome is recorded
// whenever it comes; a caller whose deadline comes first is told that the
// request is still at the provider, and its retry waits for (or replays)
// the recorded outcome.
func (s *Service) send(ctx context.Context, owner string, claimed time.Time, began store.Began) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	rec := began.Record
	// An earlier attempt for this key may have created the payment, so
	// nothing this attempt learns short of a 2xx can make it NotCreated.
	maybeBefore := began.Prior == store.StateOutcomeUnknown || began.Prior == store.StateInProgress
	if !s.sends.acquire() {
		return nil, s.sendNothing(ctx, rec.Key, owner, maybeBefore, codes.ResourceExhausted,
			"paymentsd is waiting on too many provider requests")
	}
	dctx, cancelDetached := context.WithCancel(context.WithoutCancel(ctx))
	stopOnCutOff := context.AfterFunc(s.cutOff, cancelDetached)
	sendCtx, cancel, ok := s.withinLease(dctx, s.sendBy(claimed, rec, maybeBefore))
	release := func() {
		cancel()
		stopOnCutOff()
		cancelDetached()
		s.sends.release()
	}
	if !ok {
		release()
		return nil, s.sendNothing(ctx, rec.Key, owner, maybeBefore, codes.Unavailable,
			"paymentsd's record store was too slow to let this call reach the provider in time")
	}
	s.sending.Add(1)
	if _, ok := ctx.Deadline(); !ok && !overREST(ctx) {
		return s.sendHere(ctx, owner, rec, maybeBefore, sendCtx, cancelDetached, release)
	}
	done := make(chan sent, 1)
	go func() {
		r := s.sendAndRecord(sendCtx, owner, rec, maybeBefore)
		release()
		s.sending.Done()
		done <- r
		// The outcome is written on this goroutine, which the caller
		// does not wait for.
		if r.pending {
			s.land(r.out)
		}
	}()
	// The caller's answer waits for the send (and, for a success or a
	// refusal, for its record: see answer); the send and its record do
	// not wait for the caller.
	select {
	case r := <-done:
		return s.answer(ctx, r)
	case <-ctx.Done():
		if errors.Is(context.Cause(ctx), errHardStop) {
			// paymentsd is shutting down and the drain deadline has
			// passed: the request is cut off, and the caller hears what
			// that means for the money.
			cancelDetached()
			return s.answer(ctx, <-done)
		}
		return nil, s.stillAtProviderError(ctx, rec.Key)
	}
}

// sendHere is send for a gRPC caller that set no deadline, on the
// caller's goroutine rather than one of its own: its context ends only
// when the caller goes away (and nobody hears the answer) or at the
// drain's hard stop, so the answer never has to go out while the request
// is still at the provider. A gRPC caller that goes away frees its
// in-flight slot and its stream as its stream ends, however long the
// handler runs on. A REST caller's call holds its in-flight slot (and its
// connection) until the handler returns, so a REST caller that goes away
// must be answered at once, as send does: it never comes here. The request runs with sendCtx, detached from the caller
// as in send; at the hard stop it is cut off (cancelDetached), and the
// caller hears what that means for the money. A caller that went away is
// answered as send would have answered it when it went.
func (s *Service) sendHere(ctx context.Context, owner string, rec store.Record, maybeBefore bool, sendCtx context.Context, cancelDetached, release func()) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	stopOnHardStop := context.AfterFunc(ctx, func() {
		if errors.Is(context.Cause(ctx), errHardStop) {
			cancelDetached()
		}
	})
	r := s.sendAndRecord(sendCtx, owner, rec, maybeBefore)
	stopOnHardStop()
	release()
	s.sending.Done()
	if r.pending {
		go s.land(r.out)
	}
	if ctx.Err() != nil && !errors.Is(context.Cause(ctx), errHardStop) {
		return nil, s.stillAtProviderError(ctx, rec.Key)
	}
	return s.answer(ctx, r)
}

// sent is what a send learnt, and its outcome on its way to the record.
type sent struct {
	reply   *upstream.Reply
	callErr error
	// st is the answer to callErr, nil after a success.
	st  *status.Status
	out *outcome
	// pending: out must still be written (land).
	pending bool
}

// sendAndRecord sends rec's body and hands the outcome to the outbox,
// which writes it to the record however long that takes: the caller must
// land it if pending. It runs detached from the caller, and touches
// nothing of the caller's call.
func (s *Service) sendAndRecord(ctx context.Context, owner string, rec store.Record, maybeBefore bool) sent {
	reply, callErr := s.client.Send(ctx, rec.Body)
	received := time.Now()
	fin := s.outcome(reply, callErr, maybeBefore)
	fin.Key, fin.Owner, fin.Claimed = rec.Key, owner, rec.Claimed()
	r := sent{reply: reply, callErr: callErr}
	if callErr != nil {
		r.st = s.failureStatus(callErr, maybeBefore)
		fin.Code, fin.LastError = int32(r.st.Code()), r.st.Message()
	}
	r.out, r.pending = s.pendOutcome(fin, received)
	return r
}

// answer is the caller's answer for what its send learnt.
//
//   - A success is answered once its record is committed, so that a
//     lookup or retry anywhere finds it, or when the caller's deadline
//     comes first: it is the truth either way, and the outbox goes on
//     writing it (and holds the key meanwhile).
//   - NotCreated is answered only once it is recorded: a caller told that
//     no payment was created may pay again under a new key, so the record
//     must never be left for settlement to re-send. If it is not written
//     within notCreatedWait (or the caller's deadline), the caller is told
//     the outcome is unknown; the outbox goes on writing it.
//   - An unknown outcome is answered at once.
func (s *Service) answer(ctx context.Context, r sent) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	if r.callErr == nil {
		r.out.wait(ctx, 0)
		noteProvider(ctx, r.reply.Status, r.reply.Attempts)
		return &paymentsv1.CreateMultiCardPaymentResponse{
			Payment:            paymentFor(ctx),
			PaymentJson:        r.reply.Body,
			ProviderHttpStatus: int32(r.reply.Status),
			Environment:        s.env,
		}, nil
	}
	if r.out.fin.State == store.StateNotCreated && !r.out.wait(ctx, notCreatedWait) {
		r.st = s.failureStatus(r.callErr, true)
	}
	noteFailure(ctx, r.callErr)
	return nil, r.st.Err()
}

// stillAtProviderError answers a caller whose deadline (or cancellation)
// came before the provider's answer: its request is still at the
// provider, and paymentsd goes on waiting for the answer and records it.
func (s *Service) stillAtProviderError(ctx context.Context, key string) error {
	code := codes.DeadlineExceeded
	if errors.Is(ctx.Err(), context.Canceled) {
		code = codes.Canceled
	}
	st := status.Newf(code, "the call's deadline came before the payment provider's answer; the request for idempotency key %s is still at the provider, and paymentsd is waiting for the answer and will record it: retry with the same key (never a new one) to get the outcome", quoteKey(key))
	return s.retryable(st, ReasonInProgress)
}

// Shutdown waits for the provider requests paymentsd is still waiting on,
// whose callers may have gone, and for every outcome in the outbox to be
// recorded. If ctx ends first it cuts the requests off (each is recorded
// as possibly still at the provider), gives their outcomes a last moment,
// and stops the outbox: each outcome still not recorded is logged at
// error level, with its key, state and provider status. Its record stays
// in progress, and settlement sends the key again once its lease and
// quiet period have passed. Call it once nothing can start a call any
// more.
func (s *Service) Shutdown(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		s.sending.Wait()
		close(done)
	}()
	select {
	case <-done:
		if s.outbox.waitIdle(ctx) {
			s.outbox.stopAndWait()
			return
		}
	case <-ctx.Done():
	}
	s.cutOffSends()
	<-done
	last, cancel := context.WithTimeout(context.Background(), outboxLastChance)
	s.outbox.waitIdle(last)
	cancel()
	s.outbox.stopAndWait()
}

// sendSlots bounds the provider requests paymentsd waits on at once. A
// call's in-flight slot ends when its caller goes; its request may not.
type sendSlots struct {
	n, max atomic.Int64
}

func (l *sendSlots) acquire() bool {
	if l.n.Add(1) > l.max.Load() {
		l.n.Add(-1)
		return false
	}
	return true
}

func (l *sendSlots) release() { l.n.Add(-1) }

// sendBy is when a send for rec, claimed at claimed (this process's
// monotonic clock), must end: before its lease does; and, for a re-send of
// a key an earlier attempt may have created, before the settlement window
// closes (past it the provider may have forgotten the key). Both are read
// as durations from rec's ReadAt, the store's clock as it wrote the claim,
// which was after claimed: so the send ends no later than the store
// thinks, however this process's wall clock differs from the store's.
func (s *Service) sendBy(claimed time.Time, rec store.Record, maybeBefore bool) time.Time {
	by := claimed.Add(rec.LeaseExpiresAt.Sub(rec.ReadAt))
	if maybeBefore {
		by = earliest(by, claimed.Add(rec.SettleBy.Sub(rec.ReadAt)))
	}
	return by
}

// withinLease bounds a send by the lease on its record: the request must be
// over, one way or the other, a margin before the lease expires and
// another call or replica may take the record over (once the request's
// quiet period, too, has passed). It reports false when too little of the
// lease is left to send at all (the store was slow to commit the claim).
func (s *Service) withinLease(ctx context.Context, by time.Time) (context.Context, context.CancelFunc, bool) {
	margin := min(s.leaseTTL/5, 2*time.Second)
	left := time.Until(by) - margin
	if left <= margin {
		return ctx, func() {}, false
	}
	ctx, cancel := context.WithTimeout(ctx, left)
	return ctx, cancel, true
}

// quietLeft is how much of the provider quiet period of a request that
// started at start (this process's monotonic clock) is left.
func (s *Service) quietLeft(start time.Time) time.Duration {
	return s.quiet - time.Since(start)
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// sendNothing records and answers a call that acquired its record but
// sends nothing after all (why says why; code is the answer's): nothing was
// sent. If the key started afresh the record becomes NotCreated and the
// caller is told so; if an earlier attempt may have created the payment it
// stays unknown, for settlement.
func (s *Service) sendNothing(ctx context.Context, key, owner string, maybeBefore bool, code codes.Code, why string) error {
	fin := store.Finish{Key: key, Owner: owner, State: store.StateNotCreated, Code: int32(code),
		LastError: why + "; nothing was sent"}
	reason, msg := ReasonNotCreated, why+"; nothing was sent and no payment exists for this idempotency key: retry with the same key"
	if maybeBefore {
		fin.State, fin.SettleAfter = store.StateOutcomeUnknown, settleBackoff(s.settleBase, 0)
		reason, msg = ReasonOutcomeUnknown, why+"; nothing was sent by this call, but an earlier one may have created the payment: retry with the same idempotency key, never a new one"
	}
	o := s.writeOutcome(fin, time.Now())
	if fin.State == store.StateNotCreated && !o.wait(ctx, notCreatedWait) {
		// Until it is written the record stays InProgress, held by this
		// process's outbox.
		reason, msg = ReasonOutcomeUnknown, why+", and then paymentsd could not yet record that nothing was sent: retry with the same idempotency key, never a new one"
	}
	return s.retryable(status.New(code, msg), reason)
}

// waitPending waits until an outcome this process has for key, if any, is
// written (or never will be), so that a lookup after the caller's answer
// finds it. It reports false if ctx ended first.
func (s *Service) waitPending(ctx context.Context, key string) bool {
	if o := s.outbox.pendingFor(key); o != nil {
		select {
		case <-o.landed:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// outcome turns a provider call's result into the record's new state. A
// request that may still be at the provider keeps the key quiet for the
// rest of its quiet period.
func (s *Service) outcome(reply *upstream.Reply, err error, maybeBefore bool) store.Finish {
	var fin store.Finish
	if err == nil {
		fin.State = store.StateSucceeded
		fin.AddAttempts = reply.Attempts
		fin.ProviderStatus = reply.Status
		fin.Reply = reply.Body
		return fin
	}
	fin.State = store.StateNotCreated
	fin.LastError = err.Error()
	var uerr *upstream.Error
	if errors.As(err, &uerr) {
		fin.AddAttempts = uerr.Attempts
		if uerr.MaybeCreated {
			fin.State = store.StateOutcomeUnknown
		}
		if uerr.AtProvider {
			fin.QuietFor = s.quietLeft(uerr.LastAttemptStart)
		}
		var se *upstream.StatusError
		if errors.As(uerr.Err, &se) {
			fin.ProviderStatus = se.Status
			fin.Reply = se.Body
		}
	}
	if maybeBefore {
		fin.State = store.StateOutcomeUnknown
	}
	if fin.State == store.StateOutcomeUnknown {
		fin.SettleAfter = settleBackoff(s.settleBase, 0)
	}
	return fin
}

// replay answers a call from a Succeeded record, without calling the
// provider.
//
// A record a person resolved SUCCEEDED (provider status 0) replays their
// resolution: the reply they recorded, or an empty object, with resolved
// set.
func (s *Service) replay(ctx context.Context, rec store.Record) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	resolved := rec.ProviderStatus == 0
	reply := rec.Reply
	if resolved {
		reply = resolvedReply(rec.Reply)
	}
	if err := upstream.CheckReply(reply); err != nil {
		// The payment exists; of the reasons, only "unknown" never leads a
		// caller to pay again under a new key.
		return nil, withDetails(status.New(codes.Internal, "paymentsd's record of this payment could not be read; the payment exists: look it up with GetMultiCardPayment"), s.errorInfo(ReasonOutcomeUnknown, nil))
	}
	s.metrics.replays.Inc()
	noteProvider(ctx, rec.ProviderStatus, 0)
	noteReplayed(ctx)
	return &paymentsv1.CreateMultiCardPaymentResponse{
		Payment:            paymentFor(ctx),
		PaymentJson:        reply,
		ProviderHttpStatus: int32(rec.ProviderStatus),
		Environment:        s.env,
		Replayed:           true,
		Resolved:           resolved,
	}, nil
}

// takeoverRetry is how often a call waiting on a record whose expired
// lease may not be taken over yet asks again.
const takeoverRetry = time.Second

// waitForOutcome waits until the record for key leaves InProgress, or its
// holder's lease expires, within ctx's deadline; busy is the record as
// Begin found it. If its lease had expired already (Begin may not take it
// over yet: see store.Busy), it waits for the record to change, or for
// takeoverRetry. When the deadline comes first it returns ABORTED with
// PAYMENT_IN_PROGRESS.
func (s *Service) waitForOutcome(ctx context.Context, key string, busy store.Record) (store.Record, error) {
	s.metrics.waits.Inc()
	changed, release := s.waiters.subscribe(key)
	defer release()
	refused := !busy.LeaseExpiresAt.After(busy.ReadAt)
	begun := time.Now()
	poll := 5 * time.Millisecond
	for {
		s.waitPending(ctx, key)
		start := time.Now()
		rec, err := s.store.Get(ctx, key)
		s.metrics.storeOp(opGet, start, err)
		expired := !rec.LeaseExpiresAt.After(rec.ReadAt)
		switch {
		case err == nil && rec.State != store.StateInProgress:
			return rec, nil
		case err == nil && expired && (!refused || rec.LeaseOwner != busy.LeaseOwner || time.Since(begun) >= takeoverRetry):
			return rec, nil
		case err != nil && ctx.Err() == nil:
			// Another call holds the key and may be at the provider now:
			// whatever the store's trouble, the answer is that it is in
			// progress, never that nothing was created.
			s.logger.ErrorContext(ctx, "record store failed while waiting on a key in flight", slog.String("error", err.Error()))
			return store.Record{}, s.inProgressError(key)
		}
		// Another process may hold the key, so poll as well as listen.
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return store.Record{}, s.inProgressError(key)
		case <-changed:
			t.Stop()
			changed, release = s.resubscribe(key, release)
		case <-t.C:
			poll = min(poll*2, 200*time.Millisecond)
		}
	}
}

func (s *Service) resubscribe(key string, release func()) (<-chan struct{}, func()) {
	release()
	return s.waiters.subscribe(key)
}

// GetMultiCardPayment implements paymentsv1.PaymentsServiceServer: it
// answers from the record only. A key whose record retention deleted is
// NOT_FOUND with ErrorInfo IDEMPOTENCY_KEY_EXPIRED, saying in what state
// the record ended.
func (s *Service) GetMultiCardPayment(ctx context.Context, req *paymentsv1.GetMultiCardPaymentRequest) (*paymentsv1.GetMultiCardPaymentResponse, error) {
	key := req.GetIdempotencyKey()
	s.waitPending(ctx, key)
	start := time.Now()
	rec, err := s.store.Get(ctx, key)
	s.metrics.storeOp(opGet, start, err)
	if err == nil && s.scoped(ctx) && rec.Caller != CallerFromContext(ctx) {
		// Another caller's record: answered as if there were none.
		return nil, s.noRecordError(key)
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		ts, terr := s.store.Tombstone(ctx, key)
		switch {
		case terr == nil && (!s.scoped(ctx) || (ts.CallerKnown && ts.Caller == CallerFromContext(ctx))):
			return nil, s.expiredError(codes.NotFound, key, ts)
		case terr != nil && !errors.Is(terr, store.ErrNotFound):
			return nil, s.lookupError(ctx, terr)
		}
		// A caller that sees only its own records is not told of another
		// caller's tombstone, nor of one that does not know its caller.
		return nil, s.noRecordError(key)
	case err != nil:
		return nil, s.lookupError(ctx, err)
	}
	resp := s.record(rec)
	if !rec.ResolvedAt.IsZero() {
		start := time.Now()
		entries, err := s.store.AuditEntries(ctx, rec)
		s.metrics.storeOp(opAudit, start, err)
		if err != nil {
			return nil, s.lookupError(ctx, err)
		}
		resp.AuditEntries = auditEntries(entries)
	}
	start = time.Now()
	as, err := s.store.Attempts(ctx, rec)
	s.metrics.storeOp(opAttempts, start, err)
	if err != nil {
		return nil, s.lookupError(ctx, err)
	}
	resp.AttemptHistory = attemptHistory(as)
	return resp, nil
}

// attemptHistory is the API's view of a record's attempts.
func attemptHistory(as []store.Attempt) []*paymentsv1.PaymentAttempt {
	out := make([]*paymentsv1.PaymentAttempt, 0, len(as))
	for _, a := range as {
		pa := &paymentsv1.PaymentAttempt{
			Number:             int32(a.Number),
			Kind:               paymentsv1.AttemptKind(a.Kind),
			Replica:            a.Replica,
			ClaimOwner:         a.Owner,
			RequestId:          a.RequestID,
			ProviderHttpStatus: int32(a.ProviderStatus),
			HttpRequests:       int32(a.HTTPRequests),
			PaymentJson:        a.Reply,
			Outcome:            paymentState(a.State),
			Code:               a.Code,
			Error:              a.Error,
			Abandoned:          a.Abandoned,
			InFlight:           a.InFlight,
		}
		if !a.StartedAt.IsZero() {
			pa.StartTime = timestamppb.New(a.StartedAt)
		}
		if !a.EndedAt.IsZero() {
			pa.EndTime = timestamppb.New(a.EndedAt)
		}
		out = append(out, pa)
	}
	return out
}

func (s *Service) noRecordError(key string) error {
	return status.Errorf(codes.NotFound, "paymentsd has no record of idempotency key %s in the %s environment (never used here, or its record and tombstone are both past retention)", quoteKey(key), envName(s.env))
}

// record is the API's view of rec (without its audit entries). A
// succeeded record's payment is paymentFromReply: see withPayment.
func (s *Service) record(rec store.Record) *paymentsv1.GetMultiCardPaymentResponse {
	resp := &paymentsv1.GetMultiCardPaymentResponse{
		IdempotencyKey: rec.Key,
		State:          paymentState(rec.State),
		Request: &paymentsv1.CreateMultiCardPaymentRequest{
			AmountMoney:    &paymentsv1.Money{Currency: rec.Currency, Amount: rec.Amount},
			IdempotencyKey: rec.Key,
		},
		PaymentJson:        rec.Reply,
		ProviderHttpStatus: int32(rec.ProviderStatus),
		Attempts:           int32(rec.Attempts),
		CreateTime:         timestamppb.New(rec.CreatedAt),
		UpdateTime:         timestamppb.New(rec.UpdatedAt),
		LastError:          rec.LastError,
		Environment:        s.env,
		Caller:             rec.Caller,
		RequestId:          rec.RequestID,
		TraceId:            rec.TraceID,
		SettlementGaveUp:   rec.GaveUp,
	}
	if !rec.AttemptStartedAt.IsZero() {
		resp.LastAttemptTime = timestamppb.New(rec.AttemptStartedAt)
	}
	// As in a list's summary and the export, whatever the state.
	if !rec.SettleBy.IsZero() {
		resp.SettlementWindowEndTime = timestamppb.New(rec.SettleBy)
	}
	if rec.QuietUntil.After(rec.ReadAt) {
		resp.ProviderQuietUntil = timestamppb.New(rec.QuietUntil)
	}
	if rec.State == store.StateSucceeded {
		if rec.ProviderStatus == 0 {
			resp.PaymentJson = resolvedReply(rec.Reply)
		}
		if upstream.CheckReply(resp.PaymentJson) == nil {
			resp.Payment = paymentFromReply
		}
	}
	return resp
}

func paymentState(st store.State) paymentsv1.PaymentState {
	switch st {
	case store.StateInProgress:
		return paymentsv1.PaymentState_PAYMENT_STATE_IN_PROGRESS
	case store.StateSucceeded:
		return paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED
	case store.StateNotCreated:
		return paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED
	case store.StateOutcomeUnknown:
		return paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN
	}
	return paymentsv1.PaymentState_PAYMENT_STATE_UNSPECIFIED
}

// notStorableError is the answer for a key the record store can't hold
// exactly. No record can exist for such a key, so nothing was ever sent
// with it: that is known, and the reason is PAYMENT_NOT_CREATED.
func (s *Service) notStorableError(field string) error {
	st := status.New(codes.InvalidArgument, field+": this idempotency key can't be stored exactly by paymentsd's record store (it holds a character the database can't keep), so paymentsd has never sent it and sent nothing now; no payment exists for it")
	br := &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
		Field: field, Description: "can't be stored exactly",
	}}}
	return withDetails(st, s.errorInfo(ReasonNotCreated, nil), br)
}

// notSentError is the answer when the record store failed before the
// call could read the key's record: this call sent nothing, and nothing is
// known of what earlier calls with the key did.
func (s *Service) notSentError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		code := codes.DeadlineExceeded
		if errors.Is(ctx.Err(), context.Canceled) {
			code = codes.Canceled
		}
		return withDetails(status.New(code, "the call ended before paymentsd could write its record; this call sent nothing: retry with the same idempotency key, or look it up"), s.errorInfo(ReasonNotSent, nil))
	}
	s.logger.ErrorContext(ctx, "record store failed", slog.String("error", err.Error()))
	st := status.New(codes.Unavailable, "paymentsd could not write or read its payment record, so this call sent nothing; what earlier calls with the key did stands: retry with the same idempotency key, or look it up")
	return s.retryable(st, ReasonNotSent)
}

// beginError is the answer when claiming the key's record failed. This
// call sent nothing, but an earlier one with the key may have created the
// payment; another call's claim for it, on this replica or another, may
// be about to commit (a read sees only committed records); and this call's
// own claim may have committed after all (the store could not tell:
// store.ErrCommitUnknown), leaving a record that settlement would send.
// So paymentsd reads the record, briefly, before answering:
//
//   - this call's own claim, committed after all: it is marked NotCreated
//     if the claim started the key afresh, so settlement never sends it,
//     and the caller is told PAYMENT_NOT_CREATED (the call held the key's
//     lease until then, so no other call could have sent it); if it took
//     over a record whose earlier attempt may have created the payment, it
//     stays unknown, for settlement;
//   - a record another call holds: PAYMENT_IN_PROGRESS;
//   - an unknown or succeeded record: PAYMENT_OUTCOME_UNKNOWN;
//   - a tombstone: IDEMPOTENCY_KEY_EXPIRED;
//   - no record, a record that certainly created nothing, or no answer at
//     all: REQUEST_NOT_SENT. No record is not proof that no payment
//     exists: a claim that has not committed yet is invisible.
//
// If the claim may have committed and the record can't be read, the answer
// is PAYMENT_OUTCOME_UNKNOWN (settlement may send it).
func (s *Service) beginError(ctx context.Context, claim store.Claim, err error) error {
	if errors.Is(err, store.ErrKeyNotStorable) {
		return s.notStorableError("idempotency_key")
	}
	mayHaveCommitted := errors.Is(err, store.ErrCommitUnknown)
	wait := recheckTimeout
	if ctx.Err() != nil {
		// The caller's deadline, less the margin kept to answer it
		// (answerBeforeDeadline), has come: the record is read only
		// while the answer can still reach the caller.
		wait = recheckAfterDeadline
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wait)
	defer cancel()
	rec, gerr := s.store.Get(rctx, claim.Key)
	switch {
	case gerr == nil && rec.State == store.StateInProgress && rec.LeaseOwner == claim.Owner:
		fin := store.Finish{Key: claim.Key, Owner: claim.Owner, State: store.StateNotCreated,
			Code: int32(codes.Unavailable), LastError: "paymentsd's record store failed as the record was written; nothing was sent"}
		// A claim that started the key afresh (a new record, or one whose
		// attempts created nothing) may be marked NotCreated; one that
		// took over an unknown or abandoned record may not.
		fresh := rec.PriorState == 0 || rec.PriorState == store.StateNotCreated
		if !fresh {
			fin.State, fin.SettleAfter = store.StateOutcomeUnknown, settleBackoff(s.settleBase, 0)
		}
		if o := s.writeOutcome(fin, time.Now()); o.wait(rctx, recheckTimeout) && fin.State == store.StateNotCreated {
			return s.notCreatedError(ctx, err)
		}
	case gerr == nil && rec.State == store.StateInProgress:
		if mayHaveCommitted {
			// Another call's lease, as read; this claim, still in a
			// stuck transaction (store.Begin stopped waiting for it),
			// may yet take the record over once that lease ends.
			s.releaseUnseenClaim(claim)
		}
		return s.inProgressError(claim.Key)
	case gerr == nil && (rec.State == store.StateOutcomeUnknown || rec.State == store.StateSucceeded):
		// Below: an earlier call may have created the payment. This
		// claim, if its transaction is stuck, may yet take the unknown
		// record over.
		if mayHaveCommitted {
			s.releaseUnseenClaim(claim)
		}
	case mayHaveCommitted:
		// The claim may be written, and can't be seen.
		s.releaseUnseenClaim(claim)
	case errors.Is(gerr, store.ErrNotFound):
		if ts, terr := s.store.Tombstone(rctx, claim.Key); terr == nil {
			return s.expiredError(codes.FailedPrecondition, claim.Key, ts)
		}
		return s.notSentError(ctx, err)
	default:
		return s.notSentError(ctx, err)
	}
	if ctx.Err() == nil {
		s.logger.ErrorContext(ctx, "record store failed", slog.String("error", err.Error()))
	}
	st := status.New(codes.Unavailable, "paymentsd could not be sure its record for this call was written, or an earlier call with the key may have created the payment; this call sent nothing: retry with the same idempotency key, never a new one")
	return s.retryable(st, ReasonOutcomeUnknown)
}

// releaseUnseenClaim hands the outbox the outcome of a claim that may have
// committed, or may commit yet, unseen: if it was, or is, written, the
// outbox releases it, as unknown (it is not known whether it started the
// key afresh), for settlement; if not, there is nothing to release (the
// lease is not this claim's, and the outbox drops the Finish). The outbox
// writes after the claim's own transaction has ended, since the store runs
// its writes in order.
func (s *Service) releaseUnseenClaim(claim store.Claim) {
	s.writeOutcome(store.Finish{Key: claim.Key, Owner: claim.Owner, State: store.StateOutcomeUnknown,
		SettleAfter: settleBackoff(s.settleBase, 0), Code: int32(codes.Unavailable),
		LastError: "paymentsd's record store failed as the record was written; nothing was sent by that call"}, time.Now())
}

// notCreatedError is the answer when this call's own claim committed
// although the store reported an error, and has been marked NotCreated.
func (s *Service) notCreatedError(ctx context.Context, err error) error {
	code := codes.Unavailable
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		code = codes.Canceled
	case ctx.Err() != nil:
		code = codes.DeadlineExceeded
	default:
		s.logger.ErrorContext(ctx, "record store failed", slog.String("error", err.Error()))
	}
	st := status.New(code, "paymentsd's record store failed as it wrote this call's record; nothing was sent, and the record now says no payment exists for this idempotency key: retry with the same key")
	return s.retryable(st, ReasonNotCreated)
}

// lookupError is the answer when a lookup can't read the record: of the
// reasons, only "unknown" is true of a record nobody can read.
func (s *Service) lookupError(ctx context.Context, err error) error {
	if errors.Is(err, store.ErrKeyNotStorable) {
		return s.notStorableError("idempotency_key")
	}
	code := codes.Unavailable
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		code = codes.Canceled
	case ctx.Err() != nil:
		code = codes.DeadlineExceeded
	default:
		s.logger.ErrorContext(ctx, "record store failed", slog.String("error", err.Error()))
	}
	st := status.New(code, "paymentsd could not read its record of this key; retry the lookup")
	return s.retryable(st, ReasonOutcomeUnknown)
}

// recheckTimeout bounds reading a key's record after its claim failed.
const recheckTimeout = 500 * time.Millisecond

// recheckAfterDeadline bounds that read once the caller's deadline (less
// its margin) has passed.
const recheckAfterDeadline = 25 * time.Millisecond

// quietError answers a call for a key whose last request may still be at
// the provider: nothing may be sent with the key until its quiet period
// ends, which the RetryInfo says.
func (s *Service) quietError(rec store.Record) error {
	left := max(rec.QuietUntil.Sub(rec.ReadAt), time.Millisecond)
	st := status.Newf(codes.Aborted, "an earlier request with idempotency key %s ended without the provider's answer and may still be at the provider, so paymentsd sends nothing with the key for %v more; retry with the same key after the RetryInfo's delay, never with a new one (a payment may exist)",
		quoteKey(rec.Key), left.Round(time.Millisecond))
	meta := map[string]string{"provider_quiet_until": rec.QuietUntil.Format(time.RFC3339Nano)}
	return withDetails(st, s.errorInfo(ReasonInProgress, meta), &errdetails.RetryInfo{RetryDelay: durationpb.New(left)})
}

// expiredError answers a call, or a lookup (code NOT_FOUND), for a key
// whose record retention deleted, leaving tombstone ts.
func (s *Service) expiredError(code codes.Code, key string, ts store.Tombstone) error {
	state := paymentState(ts.State)
	meta := map[string]string{
		"state":       state.String(),
		"create_time": ts.CreatedAt.Format(time.RFC3339Nano),
		"update_time": ts.UpdatedAt.Format(time.RFC3339Nano),
		"expire_time": ts.ExpiredAt.Format(time.RFC3339Nano),
	}
	if ts.GaveUp {
		meta["settlement_gave_up"] = "true"
	}
	var msg string
	if code == codes.NotFound {
		msg = fmt.Sprintf("paymentsd's record of idempotency key %s expired and was deleted after the retention period; it ended in state %s (see this error's ErrorInfo)", quoteKey(key), state)
	} else {
		msg = fmt.Sprintf("idempotency key %s belongs to a payment whose record expired and was deleted after the retention period (it ended in state %s); nothing was sent: a key can't be used again after its record expires. Use a new key only for a new payment, and check the provider's dashboard for the old one", quoteKey(key), state)
	}
	return withDetails(status.New(code, msg), s.errorInfo(ReasonKeyExpired, meta))
}

// expiredUntoldError is expiredError for a caller that may not own the
// key's tombstone: it says nothing of how the record ended.
func (s *Service) expiredUntoldError(key string) error {
	msg := fmt.Sprintf("idempotency key %s belongs to a payment whose record expired and was deleted after the retention period; nothing was sent: a key can't be used again after its record expires. Use a new key only for a new payment, and check the provider's dashboard for the old one", quoteKey(key))
	return withDetails(status.New(codes.FailedPrecondition, msg), s.errorInfo(ReasonKeyExpired, nil))
}

func (s *Service) reusedError(key string) error {
	st := status.Newf(codes.FailedPrecondition, "idempotency key %s was first used for a different request (another currency or amount); nothing was sent for this one: use a new key for a new payment, or repeat the first request exactly", quoteKey(key))
	return withDetails(st, s.errorInfo(ReasonKeyReused, nil))
}

func (s *Service) inProgressError(key string) error {
	st := status.Newf(codes.Aborted, "another call with idempotency key %s is still in flight at the provider; retry with the same key to get its outcome", quoteKey(key))
	return s.retryable(st, ReasonInProgress)
}

// recordedError answers a call with the failure recorded for its key, as
// the call that made it was answered.
func (s *Service) recordedError(rec store.Record) error {
	code := codes.Code(rec.Code)
	if code == codes.OK {
		code = codes.Unavailable
	}
	msg := rec.LastError
	reason := ReasonNotCreated
	retryable := true
	delay := time.Second
	if rec.State == store.StateOutcomeUnknown {
		reason = ReasonOutcomeUnknown
		delay = max(delay, rec.QuietUntil.Sub(rec.ReadAt))
		if !rec.SettleBy.After(rec.ReadAt) {
			retryable = false
			msg = "the outcome of the payment with this idempotency key is unknown and paymentsd's settlement window has closed, so it will not be sent again: check the provider's dashboard, and never retry it with a new key"
		}
	}
	if msg == "" {
		msg = "the payment with this idempotency key failed"
	}
	meta := map[string]string{"attempts": strconv.Itoa(rec.Attempts), "recorded": "true"}
	if rec.ProviderStatus != 0 {
		meta["provider_http_status"] = strconv.Itoa(rec.ProviderStatus)
	}
	details := []protoadapt.MessageV1{s.errorInfo(reason, meta)}
	if retryable {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
	}
	if rec.ProviderStatus != 0 {
		details = append(details, &paymentsv1.ProviderError{
			HttpStatus:  int32(rec.ProviderStatus),
			Body:        strings.ToValidUTF8(string(rec.Reply), "\uFFFD"),
			Environment: s.env,
			Attempts:    int32(rec.Attempts),
		})
	}
	return withDetails(status.New(code, msg), details...)
}

func (s *Service) errorInfo(reason string, meta map[string]string) *errdetails.ErrorInfo {
	if meta == nil {
		meta = map[string]string{}
	}
	meta["environment"] = envName(s.env)
	return &errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: meta}
}

// retryable is st with an ErrorInfo of reason and a RetryInfo of a second:
// the error of a call that is worth repeating with the same key.
func (s *Service) retryable(st *status.Status, reason string) error {
	return withDetails(st, s.errorInfo(reason, nil), &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
}

func withDetails(st *status.Status, details ...protoadapt.MessageV1) error {
	if d, err := st.WithDetails(details...); err == nil {
		return d.Err()
	}
	return st.Err()
}

// maxKeyInMessage bounds how much of a key an error message or log line
// repeats.
const maxKeyInMessage = 64

// quoteKey quotes key for a message, cut to a bounded prefix.
func quoteKey(key string) string {
	if len(key) > maxKeyInMessage {
		return strconv.Quote(strings.ToValidUTF8(key[:maxKeyInMessage], "")) + "…"
	}
	return strconv.Quote(key)
}

// keyAttrs are log attributes naming a key as the call line names it (see
// appendKey): a bounded prefix, unquoted, so that one grep by key finds
// both, and a short hash of the whole key.
func keyAttrs(key string, more ...slog.Attr) []any {
	var attrs []any
	for _, a := range appendKey(nil, key) {
		attrs = append(attrs, a)
	}
	for _, a := range more {
		attrs = append(attrs, a)
	}
	return attrs
}

// keyWaiters wakes calls waiting on a key when this process records its
// outcome.
type keyWaiters struct {
	mu sync.Mutex
	m  map[string]*waiter
}

type waiter struct {
	ch   chan struct{}
	refs int
}

func (w *keyWaiters) subscribe(key string) (<-chan struct{}, func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = make(map[string]*waiter)
	}
	wt, ok := w.m[key]
	if !ok {
		wt = &waiter{ch: make(chan struct{})}
		w.m[key] = wt
	}
	wt.refs++
	var once sync.Once
	return wt.ch, func() {
		once.Do(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			wt.refs--
			if wt.refs == 0 && w.m[key] == wt {
				delete(w.m, key)
			}
		})
	}
}

func (w *keyWaiters) notify(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if wt, ok := w.m[key]; ok {
		close(wt.ch)
		delete(w.m, key)
	}
}

// newOwner names this process for record leases.
func newOwner() string {
	var b [6]byte
	rand.Read(b[:])
	return fmt.Sprintf("paymentsd-%x", b)
}
