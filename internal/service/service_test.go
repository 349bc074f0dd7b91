package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/service"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startServer serves svc through service.NewServer on loopback listeners
// and returns a gRPC client and the HTTP base URL.
func startServer(t *testing.T, svc paymentsv1.PaymentsServiceServer, logs io.Writer) (paymentsv1.PaymentsServiceClient, string) {
	t.Helper()
	reg := prometheus.NewRegistry()
	srv, err := service.NewServer(svc, service.Options{
		Logger:          slog.New(slog.NewJSONHandler(logs, nil)),
		Registerer:      reg,
		Gatherer:        reg,
		MaxRequestBytes: 64 << 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.GRPC.Serve(ln)
	t.Cleanup(srv.GRPC.Stop)
	hs := httptest.NewServer(srv.HTTP)
	t.Cleanup(hs.Close)
	srv.SetServing(true)

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return paymentsv1.NewPaymentsServiceClient(conn), hs.URL
}

// panicky panics for one idempotency key and succeeds for others.
type panicky struct {
	paymentsv1.UnimplementedPaymentsServiceServer
}

func (panicky) CreateMultiCardPayment(_ context.Context, req *paymentsv1.CreateMultiCardPaymentRequest) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	if req.GetIdempotencyKey() == "boom" {
		var m map[string]int
		m["boom"]++ // a nil-map write: a real bug, not a staged panic value
	}
	return &paymentsv1.CreateMultiCardPaymentResponse{Payment: &structpb.Struct{}}, nil
}

func request(key string) *paymentsv1.CreateMultiCardPaymentRequest {
	return &paymentsv1.CreateMultiCardPaymentRequest{
		AmountMoney:    &paymentsv1.Money{Currency: "USD", Amount: 1},
		IdempotencyKey: key,
	}
}

func TestPanicBecomesInternal(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	client, baseURL := startServer(t, panicky{}, logs)

	// Only the reason tells a panic, which may have come after the
	// provider call, from a provider 500: both are INTERNAL.
	_, err := client.CreateMultiCardPayment(t.Context(), request("boom"))
	if st := status.Convert(err); st.Code() != codes.Internal || reasonOf(st) != service.ReasonOutcomeUnknown {
		t.Errorf("CreateMultiCardPayment(boom) = %v, reason %q; want Internal, %s", st.Code(), reasonOf(st), service.ReasonOutcomeUnknown)
	}
	resp, err := http.Post(baseURL+"/v1/multi-card-payments", "application/json",
		strings.NewReader(`{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"boom"}`))
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Code    codes.Code
		Details []struct {
			Type   string `json:"@type"`
			Reason string
		}
	}
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("REST panic body: %v", err)
	}
	restReason := ""
	for _, d := range body.Details {
		if strings.HasSuffix(d.Type, "google.rpc.ErrorInfo") {
			restReason = d.Reason
		}
	}
	if resp.StatusCode != http.StatusInternalServerError || body.Code != codes.Internal || restReason != service.ReasonOutcomeUnknown {
		t.Errorf("REST panic = %d, code %v, reason %q; want 500, Internal, %s", resp.StatusCode, body.Code, restReason, service.ReasonOutcomeUnknown)
	}
	if n := strings.Count(logs.String(), `"msg":"panic in handler"`); n != 2 {
		t.Errorf("logged %d panics, want 2", n)
	}

	// The service keeps serving.
	if _, err := client.CreateMultiCardPayment(t.Context(), request("fine")); err != nil {
		t.Errorf("CreateMultiCardPayment(fine) after a panic = %v, want OK", err)
	}
	http.DefaultClient.CloseIdleConnections()
}

// reasonOf returns the reason of st's ErrorInfo, or "".
func reasonOf(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

func TestGRPCMaxReceiveSize(t *testing.T) {
	t.Parallel()
	client, _ := startServer(t, panicky{}, io.Discard)
	_, err := client.CreateMultiCardPayment(t.Context(), request(strings.Repeat("k", 128<<10)))
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("CreateMultiCardPayment(128 KiB key) code = %v, want ResourceExhausted", status.Code(err))
	}
}
