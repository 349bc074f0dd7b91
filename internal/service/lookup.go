package service

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/engine"
	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/upstream"
)

// GetMultiCardPayment implements paymentsv1.PaymentsServiceServer: it
// answers from the record only. A key whose record retention deleted is
// NOT_FOUND with ErrorInfo IDEMPOTENCY_KEY_EXPIRED, saying in what state
// the record ended.
func (s *Service) GetMultiCardPayment(ctx context.Context, req *paymentsv1.GetMultiCardPaymentRequest) (*paymentsv1.GetMultiCardPaymentResponse, error) {
	key := req.GetIdempotencyKey()
	s.engine.Await(ctx, key)
	start := time.Now()
	rec, err := s.store.Get(ctx, key)
	s.metrics.StoreOp(engine.OpGet, start, err)
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
		s.metrics.StoreOp(engine.OpAudit, start, err)
		if err != nil {
			return nil, s.lookupError(ctx, err)
		}
		resp.AuditEntries = auditEntries(entries)
	}
	start = time.Now()
	as, err := s.store.Attempts(ctx, rec)
	s.metrics.StoreOp(engine.OpAttempts, start, err)
	if err != nil {
		return nil, s.lookupError(ctx, err)
	}
	resp.AttemptHistory = attemptHistory(as)
	return resp, nil
}

// attemptHistory is the API's view of a record's attempts.
func attemptHistory(as []record.Attempt) []*paymentsv1.PaymentAttempt {
	out := make([]*paymentsv1.PaymentAttempt, 0, len(as))
	for _, a := range as {
		pa := &paymentsv1.PaymentAttempt{
			Number:             int32(a.Number),
			Kind:               paymentsv1.AttemptKind(a.Kind),
			Replica:            a.Replica(),
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
func (s *Service) record(rec record.Record) *paymentsv1.GetMultiCardPaymentResponse {
	resp := &paymentsv1.GetMultiCardPaymentResponse{
		IdempotencyKey: rec.Key,
		State:          paymentState(rec.State),
		Request: &paymentsv1.CreateMultiCardPaymentRequest{
			AmountMoney:    &paymentsv1.Money{Currency: rec.Currency, Amount: rec.Amount},
			IdempotencyKey: rec.Key,
		},
		PaymentJson:        rec.Reply,
		ProviderHttpStatus: int32(rec.ProviderStatus),
		Attempts:           int32(rec.Requests),
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
	if rec.State == record.Succeeded {
		if rec.ProviderStatus == 0 {
			resp.PaymentJson = resolvedReply(rec.Reply)
		}
		if upstream.CheckReply(resp.PaymentJson) == nil {
			resp.Payment = paymentFromReply
		}
	}
	return resp
}

func paymentState(st record.State) paymentsv1.PaymentState {
	switch st {
	case record.InProgress:
		return paymentsv1.PaymentState_PAYMENT_STATE_IN_PROGRESS
	case record.Succeeded:
		return paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED
	case record.NotCreated:
		return paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED
	case record.OutcomeUnknown:
		return paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN
	}
	return paymentsv1.PaymentState_PAYMENT_STATE_UNSPECIFIED
}
