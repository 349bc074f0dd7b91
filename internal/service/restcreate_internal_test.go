package service

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// TestServeCreateAnswersAsGenerated: serveCreate answers every REST create
// (paid, replayed, refused by the gateway, by validation, by the header
// key, by a header) as the generated gateway handler did, byte for byte.
func TestServeCreateAnswersAsGenerated(t *testing.T) {
	t.Parallel()
	newHandler := func(generated, traced bool) http.Handler {
		reg := prometheus.NewRegistry()
		opts := Options{
			Logger:          slog.New(slog.NewJSONHandler(io.Discard, nil)),
			Registerer:      reg,
			Gatherer:        reg,
			MaxRequestBytes: 4096,
			generatedCreate: generated,
		}
		if traced {
			opts.TracerProvider, opts.Propagator = noop.NewTracerProvider(), propagation.TraceContext{}
		}
		srv, err := NewServer(newBenchService(t, "sqlite::memory:"), opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.GRPC.Stop)
		return srv.HTTP
	}
	ours, generated := newHandler(false, false), newHandler(true, false)
	oursTraced := newHandler(false, true)

	const valid = `{"amountMoney":{"currency":"USD","amount":1250},"idempotencyKey":"k-1"}`
	json := http.Header{"Content-Type": {"application/json"}}
	with := func(kv ...string) http.Header {
		h := json.Clone()
		for i := 0; i < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return h
	}
	for _, tc := range []struct {
		name   string
		body   string
		header http.Header
	}{
		{"paid", valid, json},
		{"replayed", valid, json},
		{"caller's request ID", `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k-2"}`, with("X-Request-Id", "caller-7")},
		{"caller's request ID not valid", `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k-3"}`, with("X-Request-Id", "a b")},
		{"key in the header", `{"amountMoney":{"currency":"USD","amount":1}}`, with(IdempotencyKeyHeader, `"k-4"`)},
		{"key in both", `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k-5"}`, with(IdempotencyKeyHeader, "k-5")},
		{"keys differ", `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k-6"}`, with(IdempotencyKeyHeader, "k-7")},
		{"no key", `{"amountMoney":{"currency":"USD","amount":1}}`, json},
		{"invalid currency", `{"amountMoney":{"currency":"usd","amount":1},"idempotencyKey":"k-8"}`, json},
		{"unknown field", `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k-9","amountMony":1}`, json},
		{"unknown nested field", `{"amountMoney":{"currency":"USD","amount":1,"cents":5},"idempotencyKey":"k-9"}`, json},
		{"amount not whole", `{"amountMoney":{"currency":"USD","amount":1.5},"idempotencyKey":"k-9"}`, json},
		{"amount out of range", `{"amountMoney":{"currency":"USD","amount":9223372036854775808},"idempotencyKey":"k-9"}`, json},
		{"truncated", `{"amountMoney":{"currency":"USD"`, json},
		{"array", `[1,2]`, json},
		{"null", `null`, json},
		{"trailing data", valid + valid, json},
		{"empty body", ``, json},
		{"not JSON", `amountMoney=USD`, http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}},
		{"escaped key", `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k\u002d10"}`, json},
		{"deadline", `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k-11"}`, with("Grpc-Timeout", "30S")},
		{"deadline not valid", `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k-12"}`, with("Grpc-Timeout", "soon")},
		{"deadline unit not valid", `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k-12"}`, with("Grpc-Timeout", "5x")},
		{"binary header", `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k-13"}`, with("Grpc-Metadata-Trace-Bin", "AAEC")},
		{"binary header not base64", `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k-14"}`, with("Grpc-Metadata-Trace-Bin", "!!!")},
		{"trailers accepted", `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k-15"}`, with("TE", "trailers")},
		{"trailers accepted, refused", `{"amountMoney":{"currency":"usd","amount":1},"idempotencyKey":"k-16"}`, with("TE", "trailers")},
		{"metadata headers", `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k-17"}`, with("Grpc-Metadata-Tenant", "a", "Authorization", "Bearer x", "X-Forwarded-For", "10.0.0.1", "Accept", "application/json")},
	} {
		// The create's path as callers write it, in another encoding of
		// the same path (which the gateway's mux matches), and with a
		// query (which a create does not read).
		for _, path := range []string{createPath, "/v1/multi-card%2Dpayments", createPath + "?idempotencyKey=q-1&empty="} {
			serve := func(h http.Handler) *httptest.ResponseRecorder {
				req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(tc.body))
				maps.Copy(req.Header, tc.header.Clone())
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				return rec
			}
			// Each handler has a record store of its own, and is sent the
			// same calls in the same order.
			want := serve(generated)
			for _, h := range []struct {
				name string
				h    http.Handler
			}{{"serveCreate", ours}, {"serveCreate, traced", oursTraced}} {
				got := serve(h.h)
				if got.Code != want.Code || !bytes.Equal(got.Body.Bytes(), want.Body.Bytes()) {
					t.Errorf("%s, %s: %s answered %d %s\nthe generated handler %d %s", tc.name, path, h.name, got.Code, got.Body, want.Code, want.Body)
				}
				gh, wh := got.Header().Clone(), want.Header().Clone()
				if tc.header.Get("X-Request-Id") != "caller-7" {
					// paymentsd's own, different for each call.
					gh.Del("X-Request-Id")
					wh.Del("X-Request-Id")
				}
				if !maps.EqualFunc(gh, wh, slices.Equal) {
					t.Errorf("%s, %s: %s's header %v, the generated handler's %v", tc.name, path, h.name, gh, wh)
				}
			}
		}
	}
}

// TestCreateDecodedForItsShape: a REST create's body reaches decodeCreate
// (as limitBody's restBody), with tracing off and on.
func TestCreateDecodedForItsShape(t *testing.T) {
	var decoded atomic.Int64
	testHookDecodedCreate = func() { decoded.Add(1) }
	t.Cleanup(func() { testHookDecodedCreate = nil })
	for _, traced := range []bool{false, true} {
		reg := prometheus.NewRegistry()
		opts := Options{
			Logger:          slog.New(slog.NewJSONHandler(io.Discard, nil)),
			Registerer:      reg,
			Gatherer:        reg,
			MaxRequestBytes: 4096,
		}
		if traced {
			opts.TracerProvider, opts.Propagator = noop.NewTracerProvider(), propagation.TraceContext{}
		}
		srv, err := NewServer(newBenchService(t, "sqlite::memory:"), opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.GRPC.Stop)
		before := decoded.Load()
		if err := restCreate(srv.HTTP, fmt.Sprintf("shape-%v", traced)); err != nil {
			t.Fatalf("traced %v: %v", traced, err)
		}
		if decoded.Load() != before+1 {
			t.Errorf("traced %v: the create's body was decoded by protojson, not decodeCreate", traced)
		}
	}
}

// recordingService records what a REST create's handler sees.
type recordingService struct {
	paymentsv1.UnimplementedPaymentsServiceServer
	md          metadata.MD
	hasMD       bool
	deadline    time.Time
	hasDeadline bool
	requestID   string
	callerID    string
}

func (s *recordingService) CreateMultiCardPayment(ctx context.Context, _ *paymentsv1.CreateMultiCardPaymentRequest) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	s.md, s.hasMD = metadata.FromIncomingContext(ctx)
	s.deadline, s.hasDeadline = ctx.Deadline()
	if ci, ok := ctx.Value(callInfoKey{}).(*callInfo); ok {
		s.requestID, s.callerID = ci.requestID, ci.callerRequestID
	}
	return &paymentsv1.CreateMultiCardPaymentResponse{Payment: &structpb.Struct{}}, nil
}

// TestServeCreatePassesNoMetadata: a REST create reaches the service with
// no gRPC metadata, whatever headers it came with, but with the caller's
// request ID and its Grpc-Timeout as its deadline.
func TestServeCreatePassesNoMetadata(t *testing.T) {
	t.Parallel()
	svc := &recordingService{}
	reg := prometheus.NewRegistry()
	srv, err := NewServer(svc, Options{
		Logger:          slog.New(slog.NewJSONHandler(io.Discard, nil)),
		Registerer:      reg,
		Gatherer:        reg,
		MaxRequestBytes: 4096,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.GRPC.Stop)
	req := httptest.NewRequest(http.MethodPost, createPath, strings.NewReader(`{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", "caller-7")
	req.Header.Set("Grpc-Timeout", "30S")
	req.Header.Set("Grpc-Metadata-Tenant", "a")
	req.Header.Set("Accept", "application/json")
	rec := httptest.NewRecorder()
	start := time.Now()
	srv.HTTP.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("POST = %d %s, want 200", rec.Code, rec.Body)
	}
	if svc.hasMD {
		t.Errorf("the service got metadata %v, want none", svc.md)
	}
	if !svc.hasDeadline || svc.deadline.Before(start.Add(29*time.Second)) || svc.deadline.After(time.Now().Add(30*time.Second)) {
		t.Errorf("the service's deadline = %v (%v), want 30 s from the call", svc.deadline, svc.hasDeadline)
	}
	if svc.callerID != "caller-7" || svc.requestID == "" || svc.requestID == "caller-7" {
		t.Errorf("the call's request IDs = %q (caller's %q), want its own and the caller's caller-7", svc.requestID, svc.callerID)
	}
	if got := rec.Header().Get("X-Request-Id"); got != "caller-7" {
		t.Errorf("X-Request-Id = %q, want the caller's", got)
	}
}
