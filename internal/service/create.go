package service

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/engine"
	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/upstream"
)

// CreateMultiCardPayment implements paymentsv1.PaymentsServiceServer. The
// request has been validated by the interceptor chain (see NewServer).
//
// The payment engine claims the key's record, and commits it, before
// anything is sent, and answers from the record when the key was used
// before; this turns what it learnt into the caller's answer.
func (s *Service) CreateMultiCardPayment(ctx context.Context, req *paymentsv1.CreateMultiCardPaymentRequest) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	money := req.GetAmountMoney()
	caller := CallerFromContext(ctx)
	p := engine.Payment{
		Key:      req.GetIdempotencyKey(),
		Currency: money.GetCurrency(),
		Amount:   money.GetAmount(),
		Caller:   caller,
		// A caller with an identity may use only keys it created: another
		// caller's key is refused, saying nothing of its record.
		OwnKeysOnly: caller != "",
	}
	if ci, ok := ctx.Value(callInfoKey{}).(*callInfo); ok {
		p.RequestID = ci.requestID
	}
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		p.TraceID = sc.TraceID().String()
	}
	return s.respond(ctx, p.Key, s.engine.Create(ctx, p))
}

// respond turns the engine's answer into the caller's: the one place a
// payment's outcome becomes a response or a status.
func (s *Service) respond(ctx context.Context, key string, a engine.Answer) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	switch a.From {
	case record.Replay, record.Late:
		return s.replay(ctx, *a.Record)
	case record.Reused:
		return nil, s.reusedError(key)
	case record.NotOwned:
		return nil, s.notOwnedError()
	case record.Expired:
		if CallerFromContext(ctx) != "" && !a.Tombstone.CallerKnown {
			// A tombstone from before tombstones kept their caller: it may
			// be another caller's, so nothing of it is told.
			return nil, s.expiredUntoldError(key)
		}
		return nil, s.expiredError(codes.FailedPrecondition, key, *a.Tombstone)
	case record.Quiet:
		return nil, s.quietError(*a.Record)
	case record.PastWindow:
		return nil, s.recordedError(*a.Record)
	case record.Busy:
		// The call waited for another claim of the key, which ended so.
		if a.Record.State == record.Succeeded {
			return s.replay(ctx, *a.Record)
		}
		return nil, s.recordedError(*a.Record)
	}
	if a.Sent && a.Told != record.TellInProgress {
		if a.Err != nil {
			noteFailure(ctx, a.Err)
		} else {
			noteProvider(ctx, a.Reply.Status, a.Reply.Requests)
		}
	}
	switch a.Told {
	case record.TellPaid:
		return &paymentsv1.CreateMultiCardPaymentResponse{
			Payment:            paymentFor(ctx),
			PaymentJson:        a.Reply.Body,
			ProviderHttpStatus: int32(a.Reply.Status),
			Environment:        s.env,
		}, nil
	case record.TellInProgress:
		if a.Sent || a.Why != 0 {
			return nil, s.stillAtProviderError(ctx, key)
		}
		return nil, s.inProgressError(key)
	case record.TellNotSent:
		if errors.Is(a.Err, engine.ErrEncode) {
			return nil, withDetails(status.New(codes.Internal, "paymentsd could not encode the request; this call sent nothing"), s.errorInfo(ReasonNotSent, nil))
		}
		return nil, s.notSentError(ctx, a.Err)
	}
	if errors.Is(a.Err, store.ErrKeyNotStorable) {
		return nil, s.notStorableError("idempotency_key")
	}
	return nil, s.outcomeStatus(a).Err()
}

// outcomeStatus is the status of a call told NOT_CREATED or that the
// outcome is unknown: the provider's failure, with its details; or why
// nothing was sent; or that the provider's 2xx is not yet committed; or
// that the call's claim could not be followed.
func (s *Service) outcomeStatus(a engine.Answer) *status.Status {
	maybe := a.Told != record.TellNotCreated
	if a.Sent && a.Reply == nil {
		return s.failureStatus(a.Err, maybe)
	}
	reason := ReasonOutcomeUnknown
	if !maybe {
		reason = ReasonNotCreated
	}
	var code codes.Code
	var msg string
	switch a.Why {
	case engine.TooBusy, engine.TooLate, engine.CallerLeft:
		code, msg = codes.Unavailable, "paymentsd's record store was too slow to let this call reach the provider in time"
		switch a.Why {
		case engine.TooBusy:
			code, msg = codes.ResourceExhausted, "paymentsd is waiting on too many provider requests"
		case engine.CallerLeft:
			code, msg = codes.Canceled, "the call ended before paymentsd could send its request"
		}
		if maybe {
			msg += "; nothing was sent by this call, but an earlier one may have created the payment, or paymentsd could not yet record that nothing was sent: retry with the same idempotency key, never a new one"
		} else {
			msg += "; nothing was sent and no payment exists for this idempotency key: retry with the same key"
		}
	default:
		if a.Reply != nil {
			code, msg = codes.Unavailable, "the payment provider answered, but paymentsd could not yet record its answer, and goes on recording it: retry with the same idempotency key (never a new one) to get the payment"
		} else {
			code, msg = codes.Unavailable, "paymentsd could not be sure its record for this call was written, or an earlier call with the key may have created the payment; this call sent nothing: retry with the same idempotency key, never a new one"
		}
	}
	return status.Convert(s.retryable(status.New(code, msg), reason))
}

// describe is the engine's Describe: how a call with the outcome a
// describes is answered, as its record keeps it.
func (s *Service) describe(a engine.Answer) (int32, string) {
	st := s.outcomeStatus(a)
	return int32(st.Code()), st.Message()
}

// replay answers a call from a Succeeded record, without calling the
// provider.
//
// A record a person resolved SUCCEEDED (provider status 0) replays their
// resolution: the reply they recorded, or an empty object, with resolved
// set.
func (s *Service) replay(ctx context.Context, rec record.Record) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
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
