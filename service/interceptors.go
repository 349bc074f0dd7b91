package service

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	"buf.build/go/protovalidate"
	middleware "github.com/grpc-ecosystem/go-grpc-middleware/v2"
	validatemw "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/protovalidate"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
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

// requestID gives the call paymentsd's own request ID, keeps the caller's
// valid x-request-id beside it, and answers in the response header with
// the caller's (echoed, so that it can match the answer to its request)
// or, if it sent none, paymentsd's.
func requestID(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ci := newCallInfo(ctx)
	// The header goes out with the reply or the error; failing to set it
	// (no transport stream) must not fail the call.
	_ = grpc.SetHeader(ctx, metadata.MD{RequestIDHeader: {cmp.Or(ci.callerRequestID, ci.requestID)}})
	return handler(context.WithValue(ctx, callInfoKey{}, ci), req)
}

// newCallInfo is a call's callInfo, with its request IDs. It reads the
// one key (metadata.ValueFromIncomingContext) rather than copying all the
// metadata (FromIncomingContext) for every call.
func newCallInfo(ctx context.Context) *callInfo {
	id, ok := ctx.Value(ownRequestIDKey{}).(string)
	if !ok {
		id = newRequestID()
	}
	ci := &callInfo{requestID: id}
	if v := metadata.ValueFromIncomingContext(ctx, RequestIDHeader); len(v) > 0 && validRequestID(v[0]) {
		ci.callerRequestID = v[0]
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

// accessLog writes one line per call. It runs inside requestID and outside
// recovery, so it sees the request ID and the final code of every call.
func accessLog(logger *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
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
		if !logger.Enabled(ctx, level) {
			return resp, err
		}
		attrs := make([]slog.Attr, 0, 10)
		attrs = append(attrs,
			slog.String("method", info.FullMethod),
			slog.String("code", code.String()),
			slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
		)
		if ci, ok := ctx.Value(callInfoKey{}).(*callInfo); ok {
			attrs = append(attrs,
				slog.String("request_id", ci.requestID),
				slog.Int("provider_status", ci.providerStatus),
				slog.Int("attempts", ci.attempts),
				slog.Bool("replayed", ci.replayed),
			)
			if ci.callerRequestID != "" {
				attrs = append(attrs, slog.String("caller_request_id", ci.callerRequestID))
			}
		}
		if k, ok := req.(interface{ GetIdempotencyKey() string }); ok {
			attrs = appendKey(attrs, k.GetIdempotencyKey())
		}
		if c := CallerFromContext(ctx); c != "" {
			attrs = append(attrs, slog.String("caller", c))
		}
		if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
			attrs = append(attrs, slog.String("trace_id", sc.TraceID().String()))
		}
		if err != nil {
			attrs = append(attrs, slog.String("error", status.Convert(err).Message()))
		}
		logger.LogAttrs(ctx, level, "call", attrs...)
		return resp, err
	}
}

// maxLoggedKey is how much of an idempotency key a log line carries: keys
// have no documented length limit, and one line must not carry 60 KB.
const maxLoggedKey = 64

// appendKey logs a bounded prefix of the idempotency key, and a short hash
// of the whole key that tells apart keys sharing a prefix.
func appendKey(attrs []slog.Attr, key string) []slog.Attr {
	if key == "" {
		return append(attrs, slog.String("idempotency_key", ""))
	}
	sum := sha256.Sum256([]byte(key))
	logged := key
	if len(logged) > maxLoggedKey {
		logged = strings.ToValidUTF8(logged[:maxLoggedKey], "")
	}
	return append(attrs,
		slog.String("idempotency_key", logged),
		slog.String("idempotency_key_sha256", hex.EncodeToString(sum[:6])),
	)
}

// recoverPanic turns a panic in a handler into Internal, logging it with its
// stack, so one bad call cannot take the service down. The panic may have
// come after the provider call, so its ErrorInfo says
// PAYMENT_OUTCOME_UNKNOWN: that reason is all that tells it from a
// provider 500, also Internal.
func recoverPanic(logger *slog.Logger) func(ctx context.Context, p any) error {
	return func(ctx context.Context, p any) error {
		logger.ErrorContext(ctx, "panic in handler", slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
		st := status.New(codes.Internal, "paymentsd failed while handling the call; if it reached the provider, a payment may have been created: retry with the same idempotency key")
		return withDetails(st,
			&errdetails.ErrorInfo{Reason: ReasonOutcomeUnknown, Domain: ErrorDomain},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
	}
}

// validateUnary is go-grpc-middleware's protovalidate interceptor, with one
// addition: a CreateMultiCardPayment request it refuses carries ErrorInfo
// REQUEST_NOT_SENT, as every refusal made before the key's record is read
// does: this call sent nothing, and an earlier valid call with the key may
// have paid.
func validateUnary(v protovalidate.Validator) grpc.UnaryServerInterceptor {
	validate := validatemw.UnaryServerInterceptor(v)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod != paymentsv1.PaymentsService_CreateMultiCardPayment_FullMethodName {
			return validate(ctx, req, info, handler)
		}
		valid := false
		resp, err := validate(ctx, req, info, func(ctx context.Context, req any) (any, error) {
			valid = true
			return handler(ctx, req)
		})
		if st, ok := status.FromError(err); err != nil && !valid && ok {
			if withInfo, err2 := st.WithDetails(notSentInfo()); err2 == nil {
				err = withInfo.Err()
			}
		}
		return resp, err
	}
}

// chainUnary combines interceptors into one, the first outermost, as
// grpc.ChainUnaryInterceptor does. The REST gateway, which calls the service
// in-process, goes through the same chain.
func chainUnary(interceptors ...grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		next := handler
		for i := len(interceptors) - 1; i >= 0; i-- {
			next = bind(interceptors[i], info, next)
		}
		return next(ctx, req)
	}
}

func bind(i grpc.UnaryServerInterceptor, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) grpc.UnaryHandler {
	return func(ctx context.Context, req any) (any, error) { return i(ctx, req, info, next) }
}

// streamRequestID is requestID for streams.
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
