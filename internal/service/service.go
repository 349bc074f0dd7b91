// Package service implements payments.v1.PaymentsService over gRPC and, via
// grpc-gateway, REST. It is the one place that speaks gRPC codes: it turns
// the upstream package's failures into statuses that tell a caller what
// happened to the money and what to do next.
package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/engine"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/upstream"
)

// ErrorDomain is the domain of every google.rpc.ErrorInfo paymentsd returns.
const ErrorDomain = "paymentsd.example.com"

// ErrorInfo reasons: what an error means for the money.
const (
	// ReasonNotCreated: no payment exists for the key. paymentsd says so
	// only when it knows: from the key's record, or from the provider's
	// definite refusal with no earlier attempt that may have created one.
	// A caller may pay again under a new key.
	ReasonNotCreated = "PAYMENT_NOT_CREATED"
	// ReasonOutcomeUnknown: a payment may exist; retry with the same key.
	ReasonOutcomeUnknown = "PAYMENT_OUTCOME_UNKNOWN"
	// ReasonNotSent: this call sent nothing to the provider, and paymentsd
	// did not read the key's record to say more: whatever earlier calls
	// with the key did stands. Retry with the same key, or look it up;
	// never take it as "not created".
	ReasonNotSent = "REQUEST_NOT_SENT"
)

// refusal is the status of a call paymentsd (serving env) turned away
// before sending anything, without reading the key's record. A
// CreateMultiCardPayment call's carries ErrorInfo REQUEST_NOT_SENT; any
// other call's carries no reason, since a lookup turned away says nothing
// about the payment it looks up. A retryDelay adds a RetryInfo.
func refusal(env paymentsv1.Environment, code codes.Code, msg string, create bool, retryDelay time.Duration) *status.Status {
	var details []protoadapt.MessageV1
	if create {
		details = append(details, notSentInfo(env))
	}
	if retryDelay > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryDelay)})
	}
	st := status.New(code, msg)
	if len(details) > 0 {
		if withDetails, err := st.WithDetails(details...); err == nil {
			st = withDetails
		}
	}
	return st
}

// notSentInfo is REQUEST_NOT_SENT's ErrorInfo, for a refusal made outside
// the Service (which has errorInfo): like every reason, it names the
// environment.
func notSentInfo(env paymentsv1.Environment) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{Reason: ReasonNotSent, Domain: ErrorDomain, Metadata: map[string]string{"environment": envName(env)}}
}

// Service implements paymentsv1.PaymentsServiceServer against one provider
// environment: the transport over the payment engine, which keeps a durable
// record per idempotency key.
type Service struct {
	paymentsv1.UnimplementedPaymentsServiceServer
	engine  *engine.Engine
	store   *store.Store
	env     paymentsv1.Environment
	logger  *slog.Logger
	metrics *engine.Metrics
	// quiet is the provider quiet period, for RetryInfo.
	quiet time.Duration

	admins        identitySet
	everyoneAdmin bool
}

// Config configures New. Client, Store and Environment are required.
type Config struct {
	Client      *upstream.Client
	Store       *store.Store
	Environment paymentsv1.Environment
	// Logger gets settlement's and the store's problems; nil discards.
	Logger *slog.Logger
	// Registerer holds the records' metrics; nil uses a private registry.
	Registerer prometheus.Registerer
	// LeaseTTL is how long a call holds its key before another process may
	// take the record over: it must outlast the longest provider call (the
	// client's timeout). Default 30s.
	LeaseTTL time.Duration
	// SettlementWindow is how long after a key's first attempt paymentsd
	// may still send it. Default 10 minutes.
	SettlementWindow time.Duration
	// QuietPeriod is how long a request that ended without the provider's
	// answer is presumed still at the provider, from its start: nothing is
	// sent with its key until it has passed. Default 30s; it must be at
	// least the provider client's timeout.
	QuietPeriod time.Duration
	// Retention is how long records and events are kept; 0 keeps them.
	Retention time.Duration
	// TombstoneRetention is how long a deleted record's tombstone (which
	// refuses its key for good) is kept; 0 keeps them.
	TombstoneRetention time.Duration
	// RetentionInterval is how often Run deletes what retention allows.
	// Default 10 minutes.
	RetentionInterval time.Duration
	// SettleInterval is how often Run looks for records to settle, and the
	// first settlement backoff. Default 1s.
	SettleInterval time.Duration
	// Now is this process's clock, which Run measures against the
	// store's; nil means time.Now. Nothing is decided by it.
	Now func() time.Time
	// MaxSends bounds the provider requests paymentsd waits on at once,
	// including those whose callers have gone; past it a call sends
	// nothing (RESOURCE_EXHAUSTED). Default 1000.
	MaxSends int
	// AdminCallers are the caller identities that may list every caller's
	// records and resolve payments in doubt.
	AdminCallers []Identity
	// EveryoneAdmin makes every caller an admin, identity or not: for
	// --simulate only, so that a newcomer can try the admin calls.
	EveryoneAdmin bool
}

// New returns a Service for cfg.
func New(cfg Config) *Service {
	s := &Service{
		store:         cfg.Store,
		env:           cfg.Environment,
		logger:        cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
		quiet:         cmp.Or(cfg.QuietPeriod, 30*time.Second),
		admins:        newIdentitySet(cfg.AdminCallers),
		everyoneAdmin: cfg.EveryoneAdmin,
	}
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	s.metrics = engine.NewMetrics(reg, cfg.Store)
	s.engine = engine.New(engine.Config{
		Store: cfg.Store, Client: cfg.Client, Describe: s.describe, Logger: s.logger, Metrics: s.metrics,
		LeaseTTL: cfg.LeaseTTL, SettlementWindow: cfg.SettlementWindow, QuietPeriod: cfg.QuietPeriod,
		Retention: cfg.Retention, TombstoneRetention: cfg.TombstoneRetention, RetentionInterval: cfg.RetentionInterval,
		SettleInterval: cfg.SettleInterval, MaxSends: cfg.MaxSends, Now: cfg.Now,
	})
	return s
}

// Replica is this process's name in the records: its lease owners are
// "<replica>/<claim id>", and attempts name it.
func (s *Service) Replica() string { return s.engine.Replica() }

// Run does the payment engine's background work (settlement, giving up,
// retention, the records' gauges) until ctx ends.
func (s *Service) Run(ctx context.Context) { s.engine.Run(ctx) }

// Shutdown waits for the provider requests paymentsd is still waiting on
// and for their outcomes to be recorded, until ctx ends: see
// engine.Engine.Shutdown. Call it once nothing can start a call any more.
func (s *Service) Shutdown(ctx context.Context) { s.engine.Shutdown(ctx) }

// noteFailure notes a failed provider call's status and attempts for the
// access log.
func noteFailure(ctx context.Context, err error) {
	var uerr *upstream.Error
	if !errors.As(err, &uerr) {
		return
	}
	var se *upstream.StatusError
	providerStatus := 0
	if errors.As(uerr.Err, &se) {
		providerStatus = se.Status
	}
	noteProvider(ctx, providerStatus, uerr.Requests)
}

// failureStatus maps a failed provider call to a status whose message says
// what happened and what to do, with ErrorInfo, RetryInfo and ProviderError
// details. It is the only place provider failures become gRPC codes.
// maybeBefore says an earlier call for the key may have created the
// payment, so the outcome is unknown whatever this call learnt. A request
// that may still be at the provider sets the RetryInfo to when its quiet
// period ends: until then a retry would only be told it is in progress.
func (s *Service) failureStatus(err error, maybeBefore bool) *status.Status {
	var uerr *upstream.Error
	if !errors.As(err, &uerr) {
		// The client fails only with *upstream.Error, so this failed before
		// a request was written, and is recorded as such (see outcome).
		if maybeBefore {
			st := status.New(codes.Internal, "paymentsd failed before calling the payment provider, but an earlier attempt with this idempotency key may have created a payment: retry with the same idempotency key, never a new one, to learn the outcome")
			return status.Convert(s.retryable(st, ReasonOutcomeUnknown))
		}
		st := status.New(codes.Internal, "paymentsd failed before calling the payment provider; no payment was created")
		return status.Convert(withDetails(st, s.errorInfo(ReasonNotCreated, nil)))
	}
	var se *upstream.StatusError
	hasStatus := errors.As(uerr.Err, &se)

	code, what := describe(uerr.Err, se)
	msg := what
	if uerr.Requests > 1 {
		msg += fmt.Sprintf(" (after %d attempts)", uerr.Requests)
	}
	reason := ReasonNotCreated
	retryable := code == codes.Unavailable || code == codes.ResourceExhausted || code == codes.DeadlineExceeded
	if uerr.MaybeCreated || maybeBefore {
		reason = ReasonOutcomeUnknown
		retryable = true
		msg += "; a payment may have been created: retry with the same idempotency key, never a new one, to learn the outcome"
		if uerr.AtProvider {
			msg += " (the request may still be at the provider, so paymentsd sends nothing more with the key until the RetryInfo's delay has passed)"
		}
	} else {
		msg += "; no payment was created"
		if retryable {
			msg += ": it is safe to retry with the same idempotency key"
		}
	}

	info := &errdetails.ErrorInfo{
		Reason: reason,
		Domain: ErrorDomain,
		Metadata: map[string]string{
			"attempts":    strconv.Itoa(uerr.Requests),
			"environment": envName(s.env),
		},
	}
	if hasStatus {
		info.Metadata["provider_http_status"] = strconv.Itoa(se.Status)
	}
	st := status.New(code, msg)
	details := []protoadapt.MessageV1{info}
	if retryable {
		delay := time.Second
		var open *upstream.CircuitOpenError
		switch {
		case hasStatus && se.RetryAfter > 0:
			delay = se.RetryAfter
		case errors.As(uerr.Err, &open) && open.RetryAfter > 0:
			// Until the cooldown ends every call is refused again.
			delay = open.RetryAfter
		}
		if uerr.AtProvider {
			delay = max(delay, s.quiet-time.Since(uerr.LastRequestStart))
		}
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
	}
	if hasStatus {
		details = append(details, &paymentsv1.ProviderError{
			HttpStatus:  int32(se.Status),
			Body:        strings.ToValidUTF8(string(se.Body), "\uFFFD"),
			Environment: s.env,
			Attempts:    int32(uerr.Requests),
		})
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st
}

// describe returns the code for a provider failure and a sentence that says
// what happened.
func describe(err error, se *upstream.StatusError) (codes.Code, string) {
	switch {
	case se != nil:
		return codeForHTTP(se.Status), fmt.Sprintf("the payment provider answered %d %s%s", se.Status, http.StatusText(se.Status), advice(se.Status))
	case errors.Is(err, upstream.ErrCircuitOpen):
		return codes.Unavailable, "the payment provider has been failing, so paymentsd is not calling it for a few seconds"
	case errors.Is(err, upstream.ErrUnreachable):
		return codes.Unavailable, "the payment provider could not be reached"
	case errors.Is(err, upstream.ErrConnectionLost):
		return codes.Unavailable, "the connection to the payment provider was lost before its reply was complete"
	case errors.Is(err, upstream.ErrMalformedReply), errors.Is(err, upstream.ErrReplyTooLarge):
		return codes.Unknown, "the payment provider accepted the request but its reply could not be read (" + err.Error() + ")"
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded, "the deadline expired before the payment provider answered"
	case errors.Is(err, context.Canceled):
		return codes.Canceled, "the call was cancelled before the payment provider answered"
	}
	return codes.Internal, "paymentsd could not call the payment provider"
}

func advice(httpStatus int) string {
	switch httpStatus {
	case http.StatusUnauthorized:
		return ": this deployment's API key is missing, unknown or revoked; an operator must fix its configuration"
	case http.StatusForbidden:
		return ": this deployment's API key is not permitted (it may belong to the other environment or be revoked); an operator must fix its configuration"
	case http.StatusBadRequest:
		return ": the provider refused the request as invalid; see the provider_error detail"
	}
	return ""
}

// codeForHTTP maps a provider HTTP status to the nearest canonical code,
// the inverse of google/rpc/code.proto's HTTP mapping; unlisted statuses go
// by their class.
func codeForHTTP(s int) codes.Code {
	switch s {
	case http.StatusBadRequest:
		return codes.InvalidArgument
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.NotFound
	case http.StatusRequestTimeout:
		return codes.DeadlineExceeded
	case http.StatusConflict:
		return codes.Aborted
	case http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case http.StatusInternalServerError:
		return codes.Internal
	case http.StatusNotImplemented:
		return codes.Unimplemented
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return codes.Unavailable
	case http.StatusGatewayTimeout:
		return codes.DeadlineExceeded
	}
	switch {
	case s >= 400 && s < 500:
		return codes.InvalidArgument
	case s >= 500 && s < 600:
		return codes.Internal
	}
	return codes.Unknown
}

func envName(env paymentsv1.Environment) string {
	switch env {
	case paymentsv1.Environment_ENVIRONMENT_SANDBOX:
		return "sandbox"
	case paymentsv1.Environment_ENVIRONMENT_LIVE:
		return "live"
	}
	return "unspecified"
}
