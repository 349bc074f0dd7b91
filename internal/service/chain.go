package service

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"time"
	"unsafe"

	"buf.build/go/protovalidate"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// unaryChain is the server's unary interceptor chain, for gRPC calls and
// the REST gateway's alike. From the outermost: metrics (grpcprom), so
// that they see the final code, including Internal from a recovered panic;
// the request ID; the caller's identity; the access log, which records
// refusals too; the allowlist; panic recovery; validation, so that an
// invalid request never reaches the provider; and the drain's hard stop.
//
// Past metrics, the steps are straight-line code in one method rather
// than interceptors chained by closures: a call costs one closure rather
// than one per step.
type unaryChain struct {
	metrics   grpc.UnaryServerInterceptor
	logger    *slog.Logger
	gate      gate
	validator protovalidate.Validator
	// recovered answers a call whose handler panicked.
	recovered func(ctx context.Context, p any) error
	// stop ends when the drain's hard stop cuts calls off.
	stop context.Context
	// env is the environment served, which refusals name.
	env paymentsv1.Environment
}

// intercept is the chain as a grpc.UnaryServerInterceptor.
func (c *unaryChain) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	return c.metrics(ctx, req, info, func(ctx context.Context, req any) (any, error) {
		return c.call(ctx, req, info, handler)
	})
}

// bind is the chain around handler, the method info names, as one
// handler: what intercept does for each call, with its closure made once.
// The REST gateway calls each method so.
func (c *unaryChain) bind(info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) grpc.UnaryHandler {
	inner := func(ctx context.Context, req any) (any, error) {
		return c.call(ctx, req, info, handler)
	}
	return func(ctx context.Context, req any) (any, error) {
		return c.metrics(ctx, req, info, inner)
	}
}

// call is the chain inside metrics.
func (c *unaryChain) call(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	// paymentsd's own request ID, with the caller's valid x-request-id
	// kept beside it; the response header echoes the caller's (so that it
	// can match the answer to its request) or, if it sent none,
	// paymentsd's. It goes out with the reply or the error; failing to
	// set it (no transport stream) must not fail the call. It is set once
	// the handler has returned, which is still before either is written:
	// grpc-go keeps a header set earlier in a map of its own for the
	// whole call (about 440 bytes for each call in flight). The call's
	// info also holds the caller's identity, for the access log,
	// CallerFromContext and the server span.
	ci := newCallInfo(ctx)
	ctx = context.WithValue(ctx, callInfoKey{}, ci)
	if id := ci.caller; id != nil && !id.id.IsZero() {
		trace.SpanFromContext(ctx).SetAttributes(attribute.String(CallerAttribute, id.id.String()))
	}
	start := time.Now()
	resp, err := c.admitted(ctx, req, info, handler)
	if !ci.rest {
		// A REST answer's X-Request-Id is withRequestID's.
		_ = grpc.SetHeader(ctx, metadata.MD{RequestIDHeader: {cmp.Or(ci.callerRequestID, ci.requestID)}})
	}
	c.log(ctx, req, info, ci, start, err)
	return resp, err
}

// admitted calls handler if the allowlist admits the caller and the
// request is valid, recovering a panic as Internal; at the drain's hard
// stop the handler's context ends with errHardStop.
func (c *unaryChain) admitted(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	if err := c.gate.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	defer func() {
		if p := recover(); p != nil {
			resp, err = nil, c.recovered(ctx, p)
		}
	}()
	if err := c.validate(ctx, req, info.FullMethod); err != nil {
		return nil, err
	}
	// The hard stop cancels the handler's context, so that a call cut off
	// by the drain deadline returns paymentsd's own status, with the
	// ErrorInfo that says what happened to the money, instead of the bare
	// error a closed connection gives; see stoppedStatus.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(c.stop, func() { cancel(errHardStop) })
	defer stop()
	resp, err = handler(ctx, req)
	if err != nil && errors.Is(context.Cause(ctx), errHardStop) {
		err = stoppedStatus(err)
	}
	return resp, err
}

// validate checks req against its protovalidate rules (validationError),
// with one addition: a CreateMultiCardPayment request it refuses carries
// ErrorInfo REQUEST_NOT_SENT, as every refusal made before the key's record
// is read does: this call sent nothing, and an earlier valid call with the
// key may have paid.
func (c *unaryChain) validate(ctx context.Context, req any, fullMethod string) error {
	if r, ok := req.(*paymentsv1.CreateMultiCardPaymentRequest); ok && keepsCreateRules(r) {
		return nil
	}
	err := validationError(ctx, c.validator, req)
	if err == nil || fullMethod != paymentsv1.PaymentsService_CreateMultiCardPayment_FullMethodName {
		return err
	}
	if withInfo, err2 := status.Convert(err).WithDetails(notSentInfo(c.env)); err2 == nil {
		return withInfo.Err()
	}
	return err
}

// accessLine holds a call line's fields, so that the line costs one
// allocation however many fields it has: slog would otherwise copy all but
// the first five into a slice of their own.
type accessLine struct {
	attrs [14]slog.Attr
	// keySum is the hex of the first 6 bytes of the idempotency key's
	// SHA-256, the value of the idempotency_key_sha256 field.
	keySum [12]byte
}

// log writes the call's line: at info level, warning for a code that
// needs a look, error for one that needs someone now.
func (c *unaryChain) log(ctx context.Context, req any, info *grpc.UnaryServerInfo, ci *callInfo, start time.Time, err error) {
	code := status.Code(err)
	level := slog.LevelInfo
	switch code {
	case codes.OK, codes.InvalidArgument, codes.Canceled, codes.NotFound, codes.Aborted:
	default:
		level = slog.LevelWarn
	}
	if code == codes.Internal || code == codes.Unknown || code == codes.Unauthenticated || code == codes.PermissionDenied {
		level = slog.LevelError
	}
	if !c.logger.Enabled(ctx, level) {
		return
	}
	line := new(accessLine)
	a := append(line.attrs[:0],
		slog.String("method", info.FullMethod),
		slog.String("code", code.String()),
		slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
		slog.String("request_id", ci.requestID),
		slog.Int("provider_status", ci.providerStatus),
		slog.Int("attempts", ci.attempts),
		slog.Bool("replayed", ci.replayed),
	)
	if ci.callerRequestID != "" {
		a = append(a, slog.String("caller_request_id", ci.callerRequestID))
	}
	if k, ok := req.(interface{ GetIdempotencyKey() string }); ok {
		a = line.appendKey(a, k.GetIdempotencyKey())
	}
	if caller := CallerFromContext(ctx); caller != "" {
		a = append(a, slog.String("caller", caller))
	}
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		a = append(a, slog.String("trace_id", sc.TraceID().String()))
	}
	if err != nil {
		a = append(a, slog.String("error", status.Convert(err).Message()))
	}
	// A group with no key: handlers write its fields as the line's own.
	c.logger.LogAttrs(ctx, level, "call", slog.Attr{Value: slog.GroupValue(a...)})
}

// appendKey is appendKey for the access line, with the hash kept in line.
func (line *accessLine) appendKey(a []slog.Attr, key string) []slog.Attr {
	if key == "" {
		return append(a, slog.String("idempotency_key", ""))
	}
	sum := sha256.Sum256([]byte(key))
	hex.Encode(line.keySum[:], sum[:6])
	logged := key
	if len(logged) > maxLoggedKey {
		logged = strings.ToValidUTF8(logged[:maxLoggedKey], "")
	}
	return append(a,
		slog.String("idempotency_key", logged),
		// line.keySum is never written again, and line lives as long
		// as the string does: the string may use its bytes.
		slog.String("idempotency_key_sha256", unsafe.String(&line.keySum[0], len(line.keySum))),
	)
}
