package service

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"runtime/debug"
	"time"

	middleware "github.com/grpc-ecosystem/go-grpc-middleware/v2"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/engine"
)

// RequestIDHeader is the gRPC metadata key and HTTP header that carries a
// call's request ID, in both directions.
const RequestIDHeader = "x-request-id"

// callInfo collects what the handler learns about a call for its log line.
type callInfo struct {
	// requestID is paymentsd's own ID of the call, always made here: it
	// is what records and audit entries name. callerRequestID is the
	// caller's x-request-id, if it sent a valid one: a label of the
	// caller's, kept beside it, never in its place.
	requestID       string
	callerRequestID string
	providerStatus  int
	attempts        int
	replayed        bool
	// rest: the call came through the REST gateway.
	rest bool
	// caller is what the connection says of who is calling: nil without
	// a client certificate.
	caller *caller
}

type callInfoKey struct{}

// noteProvider records the provider's status and the attempts made, for the
// call's log line.
func noteProvider(ctx context.Context, status, attempts int) {
	if ci, ok := ctx.Value(callInfoKey{}).(*callInfo); ok {
		ci.providerStatus = status
		ci.attempts = attempts
	}
}

// noteReplayed marks the call as answered from its record.
func noteReplayed(ctx context.Context) {
	if ci, ok := ctx.Value(callInfoKey{}).(*callInfo); ok {
		ci.replayed = true
	}
}

// newCallInfo is a call's callInfo, with its request IDs and its caller:
// a REST call's from its httpCall (withRequestID's and identifyHTTP's), a
// gRPC call's from the one metadata key (metadata.ValueFromIncomingContext)
// rather than a copy of all the metadata (FromIncomingContext), and from
// its peer.
func newCallInfo(ctx context.Context) *callInfo {
	ci := &callInfo{}
	if c := restCallOf(ctx); c != nil {
		ci.rest = true
		ci.requestID = c.ownRequestID
		if validRequestID(c.callerRequestID) {
			ci.callerRequestID = c.callerRequestID
		}
		ci.caller = c.caller
	} else {
		if v := metadata.ValueFromIncomingContext(ctx, RequestIDHeader); len(v) > 0 && validRequestID(v[0]) {
			ci.callerRequestID = v[0]
		}
		ci.caller = identityOf(ctx)
	}
	if ci.requestID == "" {
		ci.requestID = newRequestID()
	}
	return ci
}

func validRequestID(id string) bool {
	if len(id) == 0 || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

func newRequestID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// maxLoggedKey is how much of an idempotency key a log line carries: keys
// have no documented length limit, and one line must not carry 60 KB.
const maxLoggedKey = 64

// appendKey logs a key as every line about a key does: engine.AppendKey.
func appendKey(attrs []slog.Attr, key string) []slog.Attr { return engine.AppendKey(attrs, key) }

// recoverPanic turns a panic in a handler into Internal, logging it with its
// stack, so one bad call cannot take the service down. The panic may have
// come after the provider call, so its ErrorInfo says
// PAYMENT_OUTCOME_UNKNOWN: that reason is all that tells it from a
// provider 500, also Internal.
func recoverPanic(logger *slog.Logger, env paymentsv1.Environment) func(ctx context.Context, p any) error {
	return func(ctx context.Context, p any) error {
		logger.ErrorContext(ctx, "panic in handler", slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
		st := status.New(codes.Internal, "paymentsd failed while handling the call; if it reached the provider, a payment may have been created: retry with the same idempotency key")
		return withDetails(st,
			&errdetails.ErrorInfo{Reason: ReasonOutcomeUnknown, Domain: ErrorDomain, Metadata: map[string]string{"environment": envName(env)}},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
	}
}

// streamRequestID gives a stream a request ID, as unaryChain does a call.
func streamRequestID(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ci := newCallInfo(ss.Context())
	_ = ss.SetHeader(metadata.MD{RequestIDHeader: {cmp.Or(ci.callerRequestID, ci.requestID)}})
	wrapped := middleware.WrapServerStream(ss)
	wrapped.WrappedContext = context.WithValue(ss.Context(), callInfoKey{}, ci)
	return handler(srv, wrapped)
}

// streamAccessLog writes one call line per stream, when it ends.
func streamAccessLog(logger *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		ctx := ss.Context()
		code := status.Code(err)
		level := slog.LevelInfo
		switch code {
		case codes.OK, codes.InvalidArgument, codes.Canceled, codes.DeadlineExceeded:
		case codes.Internal, codes.Unknown:
			level = slog.LevelError
		default:
			level = slog.LevelWarn
		}
		if !logger.Enabled(ctx, level) {
			return err
		}
		attrs := []slog.Attr{
			slog.String("method", info.FullMethod),
			slog.String("code", code.String()),
			slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
		}
		if ci, ok := ctx.Value(callInfoKey{}).(*callInfo); ok {
			attrs = append(attrs, slog.String("request_id", ci.requestID))
			if ci.callerRequestID != "" {
				attrs = append(attrs, slog.String("caller_request_id", ci.callerRequestID))
			}
		}
		if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
			attrs = append(attrs, slog.String("trace_id", sc.TraceID().String()))
		}
		if err != nil {
			attrs = append(attrs, slog.String("error", status.Convert(err).Message()))
		}
		logger.LogAttrs(ctx, level, "call", attrs...)
		return err
	}
}
