package service

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/upstream"
)

// benchReply is the provider's reply in these benchmarks, about 300 bytes.
const benchReply = `{"payment":{"id":"pay_8f2b61c4d0e9","status":"COMPLETED",` +
	`"amountMoney":{"amount":1250,"currency":"USD"},` +
	`"cards":[{"brand":"VISA","last4":"4242","amountMoney":{"amount":750,"currency":"USD"}},` +
	`{"brand":"MASTERCARD","last4":"4444","amountMoney":{"amount":500,"currency":"USD"}}],` +
	`"idempotencyKey":"order-1234-attempt-1"}}`

// replyTransport answers every request with 200 and benchReply, without a
// network, so that the benchmarks measure paymentsd's own work.
type replyTransport struct{}

func (replyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	return &http.Response{
		StatusCode:    http.StatusOK,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(strings.NewReader(benchReply)),
		ContentLength: int64(len(benchReply)),
		Request:       req,
	}, nil
}

// benchStores are the record stores the benchmarks run against: a real
// SQLite file, as the default deployment has (the record's commits are
// part of what a payment costs), and SQLite in memory, which leaves the
// disk out and so shows paymentsd's own overhead.
var benchStores = []struct{ name, url string }{
	{"file", ""},
	{"memory", "sqlite::memory:"},
}

// newBenchService opens the store at url, or a SQLite file in a temporary
// directory if url is empty.
func newBenchService(b testing.TB, url string) *Service {
	return newBenchServiceWith(b, url, replyTransport{})
}

// newBenchServiceWith is newBenchService with the provider's transport.
func newBenchServiceWith(b testing.TB, url string, provider http.RoundTripper) *Service {
	b.Helper()
	client, err := upstream.New(upstream.Config{
		BaseURL:    "http://provider.invalid/v1",
		APIKey:     "sk_bench",
		HTTPClient: &http.Client{Transport: provider},
		Metrics:    upstream.NewMetrics(prometheus.NewRegistry()),
	})
	if err != nil {
		b.Fatalf("upstream.New: %v", err)
	}
	if url == "" {
		url = "sqlite:" + filepath.Join(b.TempDir(), "bench.db")
	}
	st, err := store.Open(context.Background(), url, "sandbox", store.Options{})
	if err != nil {
		b.Fatalf("store.Open: %v", err)
	}
	b.Cleanup(func() { st.Close() })
	return New(Config{Client: client, Store: st, Environment: paymentsv1.Environment_ENVIRONMENT_SANDBOX})
}

var benchKeys atomic.Int64

// benchRequest is a new payment each time: a repeated key would be a
// replay.
func benchRequest() *paymentsv1.CreateMultiCardPaymentRequest {
	return &paymentsv1.CreateMultiCardPaymentRequest{
		AmountMoney:    &paymentsv1.Money{Currency: "USD", Amount: 1250},
		IdempotencyKey: fmt.Sprintf("order-%d", benchKeys.Add(1)),
	}
}

// BenchmarkCreateMultiCardPayment is the handler alone: request
// translation, the provider request and reply (in memory), and the
// response.
func BenchmarkCreateMultiCardPayment(b *testing.B) {
	for _, bs := range benchStores {
		b.Run(bs.name, func(b *testing.B) {
			svc := newBenchService(b, bs.url)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				req := benchRequest()
				if _, err := svc.CreateMultiCardPayment(ctx, req); err != nil {
					b.Fatalf("CreateMultiCardPayment(%v): %v", req, err)
				}
			}
		})
	}
}

// BenchmarkREST is a REST call through the whole HTTP handler: body
// limit, gateway, the interceptor chain with its info-level access log
// (to io.Discard), the handler, and the gateway's JSON response. Only the
// HTTP server and the network are left out.
func BenchmarkREST(b *testing.B) {
	for _, bs := range benchStores {
		b.Run(bs.name, func(b *testing.B) {
			registry := prometheus.NewRegistry()
			srv, err := NewServer(newBenchService(b, bs.url), Options{
				Logger:          slog.New(slog.NewJSONHandler(io.Discard, nil)),
				Registerer:      registry,
				Gatherer:        registry,
				MaxRequestBytes: 64 << 10,
			})
			if err != nil {
				b.Fatalf("NewServer: %v", err)
			}
			b.Cleanup(srv.GRPC.Stop)
			b.ReportAllocs()
			for b.Loop() {
				if err := restCreate(srv.HTTP, "rest-"+strconv.FormatInt(benchKeys.Add(1), 10)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMarshalResponse is the gateway's marshalling of a success reply:
// protojson, as JSONPb does, against the fast path NewServer installs.
func BenchmarkMarshalResponse(b *testing.B) {
	payment := &structpb.Struct{}
	if err := protojson.Unmarshal([]byte(benchReply), payment); err != nil {
		b.Fatalf("unmarshal benchReply: %v", err)
	}
	resp := &paymentsv1.CreateMultiCardPaymentResponse{
		Payment:            payment,
		ProviderHttpStatus: http.StatusOK,
		Environment:        paymentsv1.Environment_ENVIRONMENT_SANDBOX,
	}
	jsonpb := &runtime.JSONPb{MarshalOptions: protojson.MarshalOptions{EmitUnpopulated: true}}
	for _, m := range []struct {
		name string
		m    runtime.Marshaler
	}{{"protojson", jsonpb}, {"fast", restMarshaler{jsonpb}}} {
		b.Run(m.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := m.m.Marshal(resp); err != nil {
					b.Fatalf("Marshal: %v", err)
				}
			}
		})
	}
}

// BenchmarkGRPC is a CreateMultiCardPayment as grpc-go's server runs it,
// less its transport, as TestAllocationBudgets counts it: the request
// decoded from its wire bytes, the interceptor chain with its info-level
// access log (to io.Discard), the handler and the reply encoded.
func BenchmarkGRPC(b *testing.B) {
	for _, bs := range benchStores {
		b.Run(bs.name, func(b *testing.B) {
			registry := prometheus.NewRegistry()
			svc := newBenchService(b, bs.url)
			srv, err := NewServer(svc, Options{
				Logger:          slog.New(slog.NewJSONHandler(io.Discard, nil)),
				Registerer:      registry,
				Gatherer:        registry,
				MaxRequestBytes: 64 << 10,
			})
			if err != nil {
				b.Fatalf("NewServer: %v", err)
			}
			b.Cleanup(srv.GRPC.Stop)
			g := newGRPCCaller(b, svc, srv)
			b.ReportAllocs()
			for b.Loop() {
				key := "grpc-" + strconv.FormatInt(benchKeys.Add(1), 10)
				if _, err := g.create(key); err != nil {
					b.Fatalf("CreateMultiCardPayment(%q): %v", key, err)
				}
			}
		})
	}
}

// holdingTransport answers as replyTransport does, once release is
// closed; held counts the requests it holds.
type holdingTransport struct {
	held    atomic.Int64
	release chan struct{}
}

func (t *holdingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.held.Add(1)
	defer t.held.Add(-1)
	select {
	case <-t.release:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	return replyTransport{}.RoundTrip(req)
}

// BenchmarkInFlight is what a create holds while the provider has its
// request: inFlight calls at once, each on a goroutine of its own (as
// grpc-go runs a stream's handler, and net/http a request's), against a
// provider that holds every request until all are in. It reports the
// goroutines and the goroutine stacks held per call (stack-B/call) once
// they are all waiting, and again after three collections, which halve a
// stack less than a quarter used (stack-after-gc-B/call); and the heap
// they hold then (heap-B/call). The handler's goroutine here lacks the
// transport's own frames (grpc-go's stream, net/http's connection); the
// provider's transport is a fake's, without net/http's frames. So the
// figures are paymentsd's own part, to compare changes by, not a
// process's whole: paymentsbench's peak-RSS phase measures that.
//
//	go test -run '^$' -bench InFlight -benchtime 1x ./internal/service/
func BenchmarkInFlight(b *testing.B) {
	const inFlight = 500
	for _, path := range []string{"grpc", "rest"} {
		b.Run(path, func(b *testing.B) {
			provider := &holdingTransport{}
			registry := prometheus.NewRegistry()
			svc := newBenchServiceWith(b, "sqlite::memory:", provider)
			srv, err := NewServer(svc, Options{
				Logger:          slog.New(slog.NewJSONHandler(io.Discard, nil)),
				Registerer:      registry,
				Gatherer:        registry,
				MaxRequestBytes: 64 << 10,
				MaxInFlight:     2 * inFlight,
			})
			if err != nil {
				b.Fatalf("NewServer: %v", err)
			}
			b.Cleanup(srv.GRPC.Stop)
			call := func(key string) error {
				if path == "rest" {
					return restCreate(srv.HTTP, key)
				}
				g := newGRPCCaller(b, svc, srv)
				g.deadline = time.Minute
				_, err := g.create(key)
				return err
			}
			// Warm up, with the provider answering at once.
			provider.release = make(chan struct{})
			close(provider.release)
			for i := range 50 {
				if err := call(fmt.Sprintf("warm-%s-%d", path, i)); err != nil {
					b.Fatal(err)
				}
			}
			var stack, stackGC, heap, goroutines float64
			for b.Loop() {
				provider.release = make(chan struct{})
				var ms goruntime.MemStats
				goruntime.GC()
				goruntime.ReadMemStats(&ms)
				stack0, heap0, g0 := ms.StackInuse, ms.HeapAlloc, goruntime.NumGoroutine()
				errs := make(chan error, inFlight)
				for range inFlight {
					key := fmt.Sprintf("inflight-%s-%d", path, benchKeys.Add(1))
					go func() { errs <- call(key) }()
				}
				for provider.held.Load() < inFlight {
					time.Sleep(10 * time.Millisecond)
				}
				// Every handler on to its wait for the answer.
				time.Sleep(200 * time.Millisecond)
				goruntime.ReadMemStats(&ms)
				stack += float64(ms.StackInuse-stack0) / inFlight
				goroutines += float64(goruntime.NumGoroutine()-g0) / inFlight
				for range 3 {
					goruntime.GC()
				}
				goruntime.ReadMemStats(&ms)
				stackGC += float64(ms.StackInuse-stack0) / inFlight
				heap += (float64(ms.HeapAlloc) - float64(heap0)) / inFlight
				close(provider.release)
				for range inFlight {
					if err := <-errs; err != nil {
						b.Fatal(err)
					}
				}
			}
			n := float64(b.N)
			b.ReportMetric(goroutines/n, "goroutines/call")
			b.ReportMetric(stack/n, "stack-B/call")
			b.ReportMetric(stackGC/n, "stack-after-gc-B/call")
			b.ReportMetric(heap/n, "heap-B/call")
		})
	}
}
