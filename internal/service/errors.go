package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/engine"
	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store"
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

// maxKeyInMessage bounds how much of a key an error message or log line
// repeats.
const maxKeyInMessage = 64

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
	if ctx.Err() != nil || (!errors.Is(err, store.ErrCommitUnknown) &&
		(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled))) {
		// The caller's deadline came (or the engine's answer margin before
		// it) while the claim was still queued or committing.
		code := codes.DeadlineExceeded
		if errors.Is(ctx.Err(), context.Canceled) || (ctx.Err() == nil && errors.Is(err, context.Canceled)) {
			code = codes.Canceled
		}
		return withDetails(status.New(code, "the call ended before paymentsd could write its record; this call sent nothing: retry with the same idempotency key, or look it up"), s.errorInfo(ReasonNotSent, nil))
	}
	// The engine logged the store's failure, where it was handled.
	st := status.New(codes.Unavailable, "paymentsd could not write or read its payment record, so this call sent nothing; what earlier calls with the key did stands: retry with the same idempotency key, or look it up")
	return s.retryable(st, ReasonNotSent)
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

// quietError answers a call for a key whose last request may still be at
// the provider: nothing may be sent with the key until its quiet period
// ends, which the RetryInfo says.
func (s *Service) quietError(rec record.Record) error {
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
func (s *Service) recordedError(rec record.Record) error {
	code := codes.Code(rec.Code)
	if code == codes.OK {
		code = codes.Unavailable
	}
	msg := rec.LastError
	reason := ReasonNotCreated
	retryable := true
	delay := time.Second
	if rec.State == record.OutcomeUnknown {
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
	meta := map[string]string{"attempts": strconv.Itoa(rec.Requests), "recorded": "true"}
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
			Attempts:    int32(rec.Requests),
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

// quoteKey quotes key for a message, cut to a bounded prefix.
func quoteKey(key string) string {
	if len(key) > maxKeyInMessage {
		return strconv.Quote(strings.ToValidUTF8(key[:maxKeyInMessage], "")) + "…"
	}
	return strconv.Quote(key)
}

// keyAttrs are log arguments naming key as every line about a key names it
// (engine.AppendKey), then more.
func keyAttrs(key string, more ...slog.Attr) []any {
	var attrs []any
	for _, a := range engine.AppendKey(nil, key) {
		attrs = append(attrs, a)
	}
	for _, a := range more {
		attrs = append(attrs, a)
	}
	return attrs
}
