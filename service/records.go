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
	// ReasonInProgress: another call with the key is in flight.
	ReasonInProgress = "PAYMENT_IN_PROGRESS"
)

// finishTimeout bounds writing a call's outcome, which must happen even
// when the caller has gone.
const finishTimeout = 5 * time.Second

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
		return nil, withDetails(status.New(codes.Internal, "paymentsd could not encode the request; nothing was sent and no payment was created"), s.errorInfo(ReasonNotCreated, nil))
	}
	claim := store.Claim{
		Key:        key,
		Body:       body,
		BodySHA256: sha256.Sum256(body),
		Currency:   money.GetCurrency(),
		Amount:     money.GetAmount(),
		Caller:     CallerFromContext(ctx),
	}
	if ci, ok := ctx.Value(callInfoKey{}).(*callInfo); ok {
		claim.RequestID = ci.requestID
	}
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		claim.TraceID = sc.TraceID().String()
	}

	for {
		now := s.now()
		claim.Owner = s.owner + "/" + newRequestID()[:12]
		claim.Now, claim.LeaseUntil, claim.SettleBy = now, now.Add(s.leaseTTL), now.Add(s.window)
		start := time.Now()
		began, err := s.store.Begin(ctx, claim)
		s.metrics.storeOp("begin", start, err)
		if err != nil {
			return nil, s.beginError(ctx, claim, err)
		}
		switch began.Outcome {
		case store.Acquired:
			return s.send(ctx, claim.Owner, began)
		case store.Replay:
			return s.replay(ctx, began.Record)
		case store.Reused:
			s.metrics.reuses.Inc()
			return nil, s.reusedError(key)
		case store.PastWindow:
			return nil, s.recordedError(began.Record)
		case store.Busy:
			rec, err := s.waitForOutcome(ctx, key)
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

// send makes the provider call for a record this call has acquired, and
// records its outcome.
func (s *Service) send(ctx context.Context, owner string, began store.Began) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	rec := began.Record
	// An earlier attempt for this key may have created the payment, so
	// nothing this attempt learns short of a 2xx can make it NotCreated.
	maybeBefore := began.Prior == store.StateOutcomeUnknown || began.Prior == store.StateInProgress
	// The send ends before the lease does; and a re-send of a key an
	// earlier attempt may have created ends before the settlement window
	// closes: past it the provider may have forgotten the key.
	sendBy := rec.LeaseExpiresAt
	if maybeBefore {
		sendBy = earliest(sendBy, rec.SettleBy)
	}
	sendCtx, cancel, ok := s.withinLease(ctx, sendBy)
	defer cancel()
	if !ok {
		return nil, s.leaseTooShort(ctx, rec.Key, owner, maybeBefore)
	}
	reply, callErr := s.client.Send(sendCtx, rec.Body)
	fin := s.outcome(reply, callErr, maybeBefore)
	fin.Key, fin.Owner = rec.Key, owner

	var resp *paymentsv1.CreateMultiCardPaymentResponse
	var err error
	if callErr == nil {
		noteProvider(ctx, reply.Status, reply.Attempts)
		resp = &paymentsv1.CreateMultiCardPaymentResponse{
			Payment:            reply.Payment,
			PaymentJson:        reply.Body,
			ProviderHttpStatus: int32(reply.Status),
			Environment:        s.env,
		}
	} else {
		err = s.errorStatus(ctx, callErr, maybeBefore)
		st := status.Convert(err)
		fin.Code, fin.LastError = int32(st.Code()), st.Message()
	}

	if fin.State == store.StateSucceeded || fin.State == store.StateOutcomeUnknown {
		// A success, or an outcome nobody knows, is answered without
		// waiting for its record to commit. Were this process to die
		// first, the record would stay InProgress until its lease expired
		// and settlement re-sent the same body with the same key: for a
		// success that gives the provider's same answer, and an unknown
		// outcome is what settlement exists for. Either way the caller was
		// told the truth. It also keeps a call whose deadline is about to
		// expire from spending its last moments on a commit, so the caller
		// gets paymentsd's answer, with its details, rather than a bare
		// DEADLINE_EXCEEDED from its own side. Calls here with the key wait
		// for the commit (Busy, or Get's pending check).
		s.finishLater(ctx, fin)
		return resp, err
	}
	// NotCreated is recorded before it is answered: a caller told that no
	// payment was created may pay again under a new key, so the record
	// must never be left for settlement to re-send. If it can't be
	// recorded, the record stays InProgress and settlement will re-send it
	// once the lease expires, which may create the payment: the caller is
	// told the outcome is unknown.
	if ferr := s.finish(ctx, fin); ferr != nil {
		s.logFinishError(ctx, fin, ferr)
		return nil, s.errorStatus(ctx, callErr, true)
	}
	return resp, err
}

// withinLease bounds a send by the lease on its record: the request must be
// over, one way or the other, a margin before the lease expires and
// another call or replica may take the record over and send it again. It
// reports false when too little of the lease is left to send at all (the
// store was slow to commit the claim).
func (s *Service) withinLease(ctx context.Context, leaseUntil time.Time) (context.Context, context.CancelFunc, bool) {
	margin := min(s.leaseTTL/5, 2*time.Second)
	left := leaseUntil.Sub(s.now()) - margin
	if left <= margin {
		return ctx, func() {}, false
	}
	ctx, cancel := context.WithTimeout(ctx, left)
	return ctx, cancel, true
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// leaseTooShort records and answers a call that acquired its record too
// late to send within the lease (or the settlement window): nothing was
// sent.
func (s *Service) leaseTooShort(ctx context.Context, key, owner string, maybeBefore bool) error {
	fin := store.Finish{Key: key, Owner: owner, Now: s.now(), State: store.StateNotCreated,
		LastError: "paymentsd's record store was too slow to let this attempt be sent; nothing was sent"}
	reason, msg := ReasonNotCreated, "paymentsd's record store was too slow to let this call reach the provider in time; nothing was sent and no payment was created: retry with the same idempotency key"
	if maybeBefore {
		fin.State, fin.NextSettleAt = store.StateOutcomeUnknown, fin.Now.Add(settleBackoff(s.settleBase, 0))
		reason, msg = ReasonOutcomeUnknown, "paymentsd's record store was too slow to let this call reach the provider in time; nothing was sent by this call, but an earlier one may have created the payment: retry with the same idempotency key, never a new one"
	}
	fin.Code = int32(codes.Unavailable)
	if ferr := s.finish(ctx, fin); ferr != nil {
		// Left InProgress, the record will be re-sent by settlement.
		s.logFinishError(ctx, fin, ferr)
		reason, msg = ReasonOutcomeUnknown, "paymentsd's record store was too slow to let this call reach the provider in time, and then could not record that nothing was sent; the payment may still be made when paymentsd settles the key: retry with the same idempotency key, never a new one"
	}
	return s.retryable(status.New(codes.Unavailable, msg), reason)
}

// finishLater records fin without waiting; the key is pending until the
// record is committed.
func (s *Service) finishLater(ctx context.Context, fin store.Finish) {
	done := make(chan struct{})
	s.pending.Store(fin.Key, done)
	start := time.Now()
	ctx = context.WithoutCancel(ctx)
	s.store.FinishLater(fin, func(_ store.Record, ferr error) {
		s.pending.CompareAndDelete(fin.Key, done)
		close(done)
		s.metrics.storeOp("finish", start, ferr)
		s.waiters.notify(fin.Key)
		if ferr != nil {
			s.logFinishError(ctx, fin, ferr)
		}
	})
}

func (s *Service) logFinishError(ctx context.Context, fin store.Finish, ferr error) {
	// The record stays InProgress until its lease expires; settlement
	// then re-sends the same body with the same key, which gives the
	// provider's answer again.
	s.logger.ErrorContext(ctx, "could not record a payment's outcome; settlement will re-send it when its lease expires",
		keyAttrs(fin.Key, slog.String("state", fin.State.String()), slog.String("error", ferr.Error()))...)
}

// waitPending waits until a success this process answered for key, if any,
// is committed, so that a lookup after the answer finds it.
func (s *Service) waitPending(ctx context.Context, key string) {
	if ch, ok := s.pending.Load(key); ok {
		select {
		case <-ch.(chan struct{}):
		case <-ctx.Done():
		}
	}
}

// finish records an outcome and wakes this process's callers waiting on
// the key. It writes even when ctx has ended (the caller has gone): the
// record is what settlement and later calls with the key go by.
func (s *Service) finish(ctx context.Context, fin store.Finish) error {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	start := time.Now()
	_, err := s.store.Finish(fctx, fin)
	s.metrics.storeOp("finish", start, err)
	s.waiters.notify(fin.Key)
	return err
}

// outcome turns a provider call's result into the record's new state.
func (s *Service) outcome(reply *upstream.Reply, err error, maybeBefore bool) store.Finish {
	fin := store.Finish{Now: s.now()}
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
		fin.NextSettleAt = fin.Now.Add(settleBackoff(s.settleBase, 0))
	}
	return fin
}

// replay answers a call from a Succeeded record, without calling the
// provider.
func (s *Service) replay(ctx context.Context, rec store.Record) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	payment, err := upstream.DecodeReply(rec.Reply)
	if err != nil {
		// The payment exists; of the reasons, only "unknown" never leads a
		// caller to pay again under a new key.
		return nil, withDetails(status.New(codes.Internal, "paymentsd's record of this payment could not be read; the payment exists: look it up with GetMultiCardPayment"), s.errorInfo(ReasonOutcomeUnknown, nil))
	}
	s.metrics.replays.Inc()
	noteProvider(ctx, rec.ProviderStatus, 0)
	noteReplayed(ctx)
	return &paymentsv1.CreateMultiCardPaymentResponse{
		Payment:            payment,
		PaymentJson:        rec.Reply,
		ProviderHttpStatus: int32(rec.ProviderStatus),
		Environment:        s.env,
		Replayed:           true,
	}, nil
}

// waitForOutcome waits until the record for key leaves InProgress, or its
// holder's lease expires, within ctx's deadline. When the deadline comes
// first it returns ABORTED with PAYMENT_IN_PROGRESS.
func (s *Service) waitForOutcome(ctx context.Context, key string) (store.Record, error) {
	s.metrics.waits.Inc()
	changed, release := s.waiters.subscribe(key)
	defer release()
	poll := 5 * time.Millisecond
	for {
		s.waitPending(ctx, key)
		start := time.Now()
		rec, err := s.store.Get(ctx, key)
		s.metrics.storeOp("get", start, err)
		switch {
		case err == nil && (rec.State != store.StateInProgress || !rec.LeaseExpiresAt.After(s.now())):
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
// answers from the record only.
func (s *Service) GetMultiCardPayment(ctx context.Context, req *paymentsv1.GetMultiCardPaymentRequest) (*paymentsv1.GetMultiCardPaymentResponse, error) {
	s.waitPending(ctx, req.GetIdempotencyKey())
	start := time.Now()
	rec, err := s.store.Get(ctx, req.GetIdempotencyKey())
	s.metrics.storeOp("get", start, err)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, status.Errorf(codes.NotFound, "paymentsd has no record of idempotency key %s in the %s environment (never used here, or older than the retention period)", quoteKey(req.GetIdempotencyKey()), envName(s.env))
	case err != nil:
		return nil, s.lookupError(ctx, err)
	}
	resp := &paymentsv1.GetMultiCardPaymentResponse{
		State: paymentState(rec.State),
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
	}
	if rec.State == store.StateSucceeded {
		if p, err := upstream.DecodeReply(rec.Reply); err == nil {
			resp.Payment = p
		}
	}
	return resp, nil
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

// storeError is the answer when the record store fails: nothing was sent,
// so no payment was created.
func (s *Service) storeError(ctx context.Context, err error, field string) error {
	if errors.Is(err, store.ErrKeyNotStorable) {
		st := status.New(codes.InvalidArgument, field+": this idempotency key can't be stored exactly by paymentsd's record store (it holds a character the database can't keep); nothing was sent and no payment was created")
		br := &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
			Field: field, Description: "can't be stored exactly",
		}}}
		return withDetails(st, s.errorInfo(ReasonNotCreated, nil), br)
	}
	if ctx.Err() != nil {
		code := codes.DeadlineExceeded
		if errors.Is(ctx.Err(), context.Canceled) {
			code = codes.Canceled
		}
		return withDetails(status.New(code, "the call ended before paymentsd could write its record; nothing was sent and no payment was created"), s.errorInfo(ReasonNotCreated, nil))
	}
	s.logger.ErrorContext(ctx, "record store failed", slog.String("error", err.Error()))
	st := status.New(codes.Unavailable, "paymentsd could not write or read its payment record, so nothing was sent and no payment was created: it is safe to retry with the same idempotency key")
	return s.retryable(st, ReasonNotCreated)
}

// beginError is the answer when claiming the key's record failed. This
// call sent nothing, but an earlier one with the key may have created the
// payment, and the claim itself may have committed (the store could not
// tell: store.ErrCommitUnknown), leaving a record that settlement would
// send. So paymentsd reads the record, briefly, before answering:
//
//   - no record, or one that certainly created nothing: PAYMENT_NOT_CREATED,
//     unless the claim may have committed and the read can't be trusted
//     to have seen it;
//   - this call's own claim, committed after all: it is marked NotCreated
//     if the claim started the key afresh, so settlement never sends it,
//     and OutcomeUnknown otherwise (it took over a record whose earlier
//     attempt may have created the payment);
//   - a record another call holds: PAYMENT_IN_PROGRESS;
//   - anything else (unknown, succeeded): PAYMENT_OUTCOME_UNKNOWN.
//
// When the record can't be read, the answer is storeError's
// PAYMENT_NOT_CREATED if nothing was written, and PAYMENT_OUTCOME_UNKNOWN
// if the claim may have committed.
func (s *Service) beginError(ctx context.Context, claim store.Claim, err error) error {
	if errors.Is(err, store.ErrKeyNotStorable) {
		return s.storeError(ctx, err, "idempotency_key")
	}
	mayHaveCommitted := errors.Is(err, store.ErrCommitUnknown)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recheckTimeout)
	defer cancel()
	rec, gerr := s.store.Get(rctx, claim.Key)
	switch {
	case (gerr != nil || rec.State == store.StateNotCreated) && !mayHaveCommitted:
		// No record (ErrNotFound), one that certainly created nothing, or
		// a store that can't be read; and this claim wrote nothing.
		return s.storeError(ctx, err, "idempotency_key")
	case gerr == nil && rec.State == store.StateInProgress && rec.LeaseOwner == claim.Owner:
		fin := store.Finish{Key: claim.Key, Owner: claim.Owner, Now: s.now(), State: store.StateNotCreated,
			Code: int32(codes.Unavailable), LastError: "paymentsd's record store failed as the record was written; nothing was sent"}
		// A claim that starts the key afresh (a new record, or one whose
		// attempts created nothing) sets its settlement window; one that
		// takes over an unknown or abandoned record keeps the old one.
		fresh := rec.SettleBy.Equal(claim.SettleBy.Truncate(time.Microsecond))
		if !fresh {
			fin.State, fin.NextSettleAt = store.StateOutcomeUnknown, fin.Now.Add(settleBackoff(s.settleBase, 0))
		}
		if ferr := s.finish(rctx, fin); ferr == nil && fin.State == store.StateNotCreated {
			return s.storeError(ctx, err, "idempotency_key")
		}
	case gerr == nil && rec.State == store.StateInProgress:
		return s.inProgressError(claim.Key)
	}
	if ctx.Err() == nil {
		s.logger.ErrorContext(ctx, "record store failed", slog.String("error", err.Error()))
	}
	st := status.New(codes.Unavailable, "paymentsd could not be sure its record for this call was written, or an earlier call with the key may have created the payment; this call sent nothing: retry with the same idempotency key, never a new one")
	return s.retryable(st, ReasonOutcomeUnknown)
}

// lookupError is the answer when a lookup can't read the record: of the
// reasons, only "unknown" is true of a record nobody can read.
func (s *Service) lookupError(ctx context.Context, err error) error {
	if errors.Is(err, store.ErrKeyNotStorable) {
		return s.storeError(ctx, err, "idempotency_key")
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
	if rec.State == store.StateOutcomeUnknown {
		reason = ReasonOutcomeUnknown
		if !rec.SettleBy.After(s.now()) {
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
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
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
