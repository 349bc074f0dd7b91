package service

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/engine"
	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/upstream"
)

// ErrorInfo reasons of the admin calls and of keys owned by other callers.
const (
	// ReasonCallerNotAdmin: the call needs an identity in
	// PAYMENTS_ADMIN_CALLERS.
	ReasonCallerNotAdmin = "CALLER_NOT_ADMIN"
	// ReasonKeyNotOwned: the key's record was created by another caller;
	// nothing was sent, and nothing of the record is told.
	ReasonKeyNotOwned = "IDEMPOTENCY_KEY_NOT_OWNED"
	// ReasonRecordNotUnknown: only a record whose outcome is unknown can
	// be resolved.
	ReasonRecordNotUnknown = "RECORD_NOT_UNKNOWN"
	// ReasonPageTokenInvalid: the page token is malformed, or was made
	// with other filters.
	ReasonPageTokenInvalid = "PAGE_TOKEN_INVALID"
	// ReasonRecordChanged: the record changed after the person looked at
	// it (expected_update_time): nothing was changed; look again.
	ReasonRecordChanged = "RECORD_CHANGED"
	// ReasonResolutionOutcomeUnknown: the resolution was sent to be
	// committed and the store's answer was lost: read the record.
	ReasonResolutionOutcomeUnknown = "RESOLUTION_OUTCOME_UNKNOWN"
)

// simulatedActor is the audit entry's actor for a resolution made without
// an identity under --simulate.
const simulatedActor = "simulate"

// Page bounds of ListMultiCardPayments, as ListProviderEvents': a page fits
// a default gRPC client's 4 MiB receive limit.
const (
	defaultListPageSize = 100
	maxListPageBytes    = 3 << 20
)

// isAdmin reports whether the caller of ctx may make the admin calls.
func (s *Service) isAdmin(ctx context.Context) bool {
	if s.everyoneAdmin {
		return true
	}
	c := identityOf(ctx)
	return c != nil && s.admins.has(c.id)
}

// actor is the audit entry's actor for an admin call from ctx: the
// caller's identity, which is the one identity its certificate names and
// the one PAYMENTS_ADMIN_CALLERS admitted; "simulate" for a caller without
// one under --simulate.
func (s *Service) actor(ctx context.Context) string {
	if caller := CallerFromContext(ctx); caller != "" {
		return caller
	}
	return simulatedActor
}

// scoped reports whether the caller of ctx sees only its own records: it
// has an identity and is no admin. A caller without one (no mTLS) is
// scoped by nothing, as every record it can see was made without one.
func (s *Service) scoped(ctx context.Context) bool {
	return CallerFromContext(ctx) != "" && !s.isAdmin(ctx)
}

func (s *Service) notAdminError(ctx context.Context, what string) error {
	msg := what + " needs a caller identity listed in PAYMENTS_ADMIN_CALLERS"
	if CallerFromContext(ctx) == "" {
		msg += "; this call came without a client certificate (without mTLS the admin calls are refused, except under --simulate)"
	}
	return withDetails(status.New(codes.PermissionDenied, msg), s.errorInfo(ReasonCallerNotAdmin, nil))
}

// notOwnedError answers a call with a key another caller created. It says
// nothing of that record: not its state, amount or caller.
func (s *Service) notOwnedError() error {
	return withDetails(status.New(codes.PermissionDenied,
		"this idempotency key belongs to another caller identity; nothing was sent. Use a new key for this payment, unless this service may have created it under another certificate identity: then ask the payments team to look the key up before paying again"),
		s.errorInfo(ReasonKeyNotOwned, nil))
}

// ListMultiCardPayments implements paymentsv1.PaymentsServiceServer.
func (s *Service) ListMultiCardPayments(ctx context.Context, req *paymentsv1.ListMultiCardPaymentsRequest) (*paymentsv1.ListMultiCardPaymentsResponse, error) {
	q := store.ListQuery{
		Limit:     int(req.GetPageSize()),
		MaxBytes:  maxListPageBytes,
		WithReply: req.GetView() == paymentsv1.ListView_LIST_VIEW_FULL,
	}
	q.WithAttempts = q.WithReply
	if q.Limit == 0 {
		q.Limit = defaultListPageSize
	}
	caller := req.GetCaller()
	if !s.isAdmin(ctx) {
		self := CallerFromContext(ctx)
		if self == "" {
			return nil, s.notAdminError(ctx, "listing payments")
		}
		if caller != "" && caller != self {
			return nil, s.notAdminError(ctx, "listing another caller's payments")
		}
		caller = self
	}
	if caller != "" {
		q.ByCaller, q.Caller = true, caller
	}
	for _, st := range req.GetState() {
		q.States = append(q.States, record.State(st))
	}
	slices.Sort(q.States)
	q.States = slices.Compact(q.States)
	// A timestamp outside protobuf's range (years 1 to 9999) would
	// overflow the store's microseconds, or be refused by PostgreSQL,
	// and answer the wrong records or a store failure.
	if t := req.GetCreatedAfter(); t != nil {
		if err := t.CheckValid(); err != nil {
			return nil, badRequest("created_after", "must be a valid time between the years 1 and 9999")
		}
		q.CreatedAfter = t.AsTime()
	}
	if t := req.GetCreatedBefore(); t != nil {
		if err := t.CheckValid(); err != nil {
			return nil, badRequest("created_before", "must be a valid time between the years 1 and 9999")
		}
		q.CreatedBefore = t.AsTime()
	}
	if !q.CreatedAfter.IsZero() && !q.CreatedBefore.IsZero() && !q.CreatedAfter.Before(q.CreatedBefore) {
		return nil, badRequest("created_before", "created_before must be later than created_after")
	}
	if req.SettlementGaveUp != nil {
		g := req.GetSettlementGaveUp()
		q.GaveUp = &g
	}
	fp := listFingerprint(q)
	if tok := req.GetPageToken(); tok != "" {
		c, err := decodePageToken(tok, fp)
		if err != nil {
			return nil, withDetails(status.New(codes.InvalidArgument, "page_token: "+err.Error()+"; start again without a page_token"),
				s.errorInfo(ReasonPageTokenInvalid, nil), fieldViolation("page_token", err.Error()))
		}
		q.After = &c
	}
	start := time.Now()
	page, err := s.store.ListRecords(ctx, q)
	s.metrics.StoreOp(engine.OpList, start, err)
	if err != nil {
		return nil, s.readError(ctx, err)
	}
	resp := &paymentsv1.ListMultiCardPaymentsResponse{Payments: make([]*paymentsv1.MultiCardPaymentSummary, 0, len(page.Records))}
	for _, rec := range page.Records {
		sum := s.summary(rec, q.WithReply)
		if q.WithAttempts {
			sum.AttemptHistory = attemptHistory(page.Attempts[rec.Key])
		}
		resp.Payments = append(resp.Payments, sum)
	}
	if page.More && page.Next != nil {
		resp.NextPageToken = encodePageToken(*page.Next, fp)
	}
	return resp, nil
}

func (s *Service) summary(rec record.Record, withReply bool) *paymentsv1.MultiCardPaymentSummary {
	sum := &paymentsv1.MultiCardPaymentSummary{
		IdempotencyKey:     rec.Key,
		State:              paymentState(rec.State),
		AmountMoney:        &paymentsv1.Money{Currency: rec.Currency, Amount: rec.Amount},
		Caller:             rec.Caller,
		CreateTime:         timestamppb.New(rec.CreatedAt),
		UpdateTime:         timestamppb.New(rec.UpdatedAt),
		ProviderHttpStatus: int32(rec.ProviderStatus),
		Attempts:           int32(rec.Requests),
		SettlementGaveUp:   rec.GaveUp,
		LastError:          rec.LastError,
		Resolved:           rec.Resolved(),
		Environment:        s.env,
	}
	if !rec.SettleBy.IsZero() {
		sum.SettlementWindowEndTime = timestamppb.New(rec.SettleBy)
	}
	if withReply {
		sum.PaymentJson = rec.Reply
	}
	return sum
}

// readError is the answer when the records can't be read for a list.
func (s *Service) readError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	s.logger.ErrorContext(ctx, "record store failed", slog.String("error", err.Error()))
	return withDetails(status.New(codes.Unavailable, "paymentsd's record store can't be read now; retry shortly"),
		&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
}

func badRequest(field, msg string) error {
	return withDetails(status.New(codes.InvalidArgument, field+": "+msg), fieldViolation(field, msg))
}

func fieldViolation(field, msg string) *errdetails.BadRequest {
	return &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: msg}}}
}

// Page tokens: base64url of a version byte, 8 bytes of the filters'
// fingerprint, the last record's created_at in Unix microseconds (8 bytes)
// and its tie-break on the key. They only position the page: the filters,
// and the caller's scope, are applied afresh on every call.
const pageTokenVersion = 1

func listFingerprint(q store.ListQuery) [8]byte {
	h := sha256.New()
	fmt.Fprintf(h, "states=%v;after=%d;before=%d;bycaller=%t;caller=%q;full=%t;",
		q.States, micros(q.CreatedAfter), micros(q.CreatedBefore), q.ByCaller, q.Caller, q.WithReply)
	if q.GaveUp != nil {
		fmt.Fprintf(h, "gaveup=%t", *q.GaveUp)
	}
	var fp [8]byte
	copy(fp[:], h.Sum(nil))
	return fp
}

func micros(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

func encodePageToken(c store.Cursor, fp [8]byte) string {
	b := make([]byte, 0, 17+len(c.Tie))
	b = append(b, pageTokenVersion)
	b = append(b, fp[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(c.CreatedAt.UnixMicro()))
	b = append(b, c.Tie...)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodePageToken(tok string, fp [8]byte) (store.Cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) < 17 || b[0] != pageTokenVersion {
		return store.Cursor{}, errors.New("not a page token of this API")
	}
	if !bytes.Equal(b[1:9], fp[:]) {
		return store.Cursor{}, errors.New("the page token was made with other filters, caller or view")
	}
	at := time.UnixMicro(int64(binary.BigEndian.Uint64(b[9:17]))).UTC()
	if timestamppb.New(at).CheckValid() != nil {
		return store.Cursor{}, errors.New("not a page token of this API")
	}
	return store.Cursor{CreatedAt: at, Tie: bytes.Clone(b[17:])}, nil
}

// ResolveMultiCardPayment implements paymentsv1.PaymentsServiceServer.
func (s *Service) ResolveMultiCardPayment(ctx context.Context, req *paymentsv1.ResolveMultiCardPaymentRequest) (*paymentsv1.ResolveMultiCardPaymentResponse, error) {
	if !s.isAdmin(ctx) {
		return nil, s.notAdminError(ctx, "resolving a payment")
	}
	key := req.GetIdempotencyKey()
	var res record.Resolve
	audit := store.AuditInfo{Evidence: req.GetEvidence(), Actor: s.actor(ctx)}
	if ci, ok := ctx.Value(callInfoKey{}).(*callInfo); ok {
		audit.RequestID, audit.CallerRequestID = ci.requestID, ci.callerRequestID
	}
	if t := req.GetExpectedUpdateTime(); t != nil {
		if err := t.CheckValid(); err != nil {
			return nil, badRequest("expected_update_time", "must be a valid time: the record's update_time as looked up")
		}
		res.UnchangedSince = t.AsTime()
	}
	var label string
	switch req.GetOutcome() {
	case paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED:
		res.To, label = record.Succeeded, "succeeded"
		if r := req.GetReplyJson(); r != "" {
			if _, err := upstream.DecodeReply([]byte(r)); err != nil {
				return nil, badRequest("reply_json", "must be the provider's payment as a JSON object")
			}
			if err := s.checkReplyBelongs(ctx, key, []byte(r)); err != nil {
				return nil, err
			}
			res.Reply = []byte(r)
		}
	case paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED:
		res.To, label = record.NotCreated, "not_created"
		if req.GetReplyJson() != "" {
			return nil, badRequest("reply_json", "a reply goes only with RESOLUTION_OUTCOME_SUCCEEDED")
		}
	default:
		return nil, badRequest("outcome", "must be RESOLUTION_OUTCOME_SUCCEEDED or RESOLUTION_OUTCOME_NOT_CREATED")
	}
	start := time.Now()
	got, err := s.store.Resolve(ctx, key, res, audit)
	s.metrics.StoreOp(engine.OpResolve, start, err)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, status.Errorf(codes.NotFound, "paymentsd has no record of idempotency key %s in the %s environment", quoteKey(key), envName(s.env))
	case errors.Is(err, store.ErrNotUnknown):
		st := status.New(codes.FailedPrecondition, fmt.Sprintf("only a payment whose outcome is unknown can be resolved; this one is %s: nothing was changed",
			paymentState(got.Record.State)))
		return nil, withDetails(st, s.errorInfo(ReasonRecordNotUnknown, map[string]string{"state": paymentState(got.Record.State).String()}))
	case errors.Is(err, store.ErrChanged):
		st := status.New(codes.FailedPrecondition, fmt.Sprintf("the payment has changed since it was looked up (now %s, updated %s): nothing was changed; look it up again before resolving, as what the provider showed may be out of date",
			paymentState(got.Record.State), got.Record.UpdatedAt.Format(time.RFC3339Nano)))
		return nil, withDetails(st, s.errorInfo(ReasonRecordChanged, map[string]string{"state": paymentState(got.Record.State).String()}))
	case errors.Is(err, store.ErrInFlight):
		delay := time.Second
		if got.Record.State == record.InProgress {
			delay = max(delay, got.Record.LeaseExpiresAt.Sub(got.Record.ReadAt))
		}
		delay = max(delay, got.Record.QuietUntil.Sub(got.Record.ReadAt))
		st := status.New(codes.Aborted, "a request with this idempotency key is being sent to the provider, or may still be there: nothing was changed; its outcome may settle the payment, so look again after the retry delay")
		return nil, withDetails(st, s.errorInfo(ReasonInProgress, map[string]string{"state": paymentState(got.Record.State).String()}),
			&errdetails.RetryInfo{RetryDelay: durationpb.New(delay.Round(time.Millisecond))})
	case errors.Is(err, store.ErrCommitUnknown):
		s.logger.ErrorContext(ctx, "record store failed committing a resolution", slog.String("error", err.Error()))
		return nil, withDetails(status.New(codes.Unavailable, "paymentsd's record store failed while committing the resolution, which may or may not have been recorded: look the key up (GetMultiCardPayment) before resolving again"),
			s.errorInfo(ReasonResolutionOutcomeUnknown, nil))
	case err != nil:
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		s.logger.ErrorContext(ctx, "record store failed resolving a payment", slog.String("error", err.Error()))
		return nil, withDetails(status.New(codes.Unavailable, "paymentsd's record store failed; nothing was recorded: retry shortly"),
			&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
	}
	s.metrics.Resolutions.WithLabelValues(label).Inc()
	s.logger.WarnContext(ctx, "payment resolved by a person", keyAttrs(key,
		slog.String("actor", audit.Actor), slog.String("outcome", label),
		slog.String("from_state", got.Entry.From.String()), slog.Bool("settlement_gave_up", got.Entry.GaveUp))...)
	// The unsettled gauge drops now, not at the next count.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	s.engine.Recount(sctx)
	cancel()

	resp := withPayment(s.record(got.Record))
	// The entries, this one among them, as the store holds them.
	entries, err := s.store.AuditEntries(ctx, got.Record)
	if err != nil {
		entries = []store.AuditEntry{got.Entry}
	}
	resp.AuditEntries = auditEntries(entries)
	if as, err := s.store.Attempts(ctx, got.Record); err == nil {
		resp.AttemptHistory = attemptHistory(as)
	}
	return &paymentsv1.ResolveMultiCardPaymentResponse{Payment: resp, AuditEntry: auditEntry(got.Entry)}, nil
}

func auditEntries(es []store.AuditEntry) []*paymentsv1.AuditEntry {
	out := make([]*paymentsv1.AuditEntry, 0, len(es))
	for _, e := range es {
		out = append(out, auditEntry(e))
	}
	return out
}

func auditEntry(e store.AuditEntry) *paymentsv1.AuditEntry {
	outcome := paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED
	if e.To == record.Succeeded {
		outcome = paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED
	}
	return &paymentsv1.AuditEntry{
		CreateTime:       timestamppb.New(e.CreatedAt),
		Actor:            e.Actor,
		FromState:        paymentState(e.From),
		ToState:          paymentState(e.To),
		Outcome:          outcome,
		Evidence:         e.Evidence,
		RequestId:        e.RequestID,
		ReplyRecorded:    e.ReplyRecorded,
		SettlementGaveUp: e.GaveUp,
		CallerRequestId:  e.CallerRequestID,
	}
}

// resolvedReply is a replay's payment_json when a person resolved the
// record SUCCEEDED with reply: the reply they recorded, or an empty object
// when they recorded none.
func resolvedReply(reply []byte) []byte {
	if reply == nil {
		return []byte("{}")
	}
	return reply
}
