package service_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"buf.build/go/protovalidate"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/service"
)

// accepting checks that every request reaching it is valid, and succeeds.
type accepting struct {
	paymentsv1.UnimplementedPaymentsServiceServer
	validator protovalidate.Validator
	t         *testing.T
}

func (a accepting) CreateMultiCardPayment(_ context.Context, req *paymentsv1.CreateMultiCardPaymentRequest) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	if err := a.validator.Validate(req); err != nil {
		a.t.Errorf("an invalid request reached the service: %v", err)
	}
	return &paymentsv1.CreateMultiCardPaymentResponse{Payment: &structpb.Struct{}}, nil
}

// FuzzRESTBody feeds arbitrary bodies to the REST gateway: it must never
// panic, must answer 200 only for valid requests, and must refuse the rest
// with 400 or 413.
func FuzzRESTBody(f *testing.F) {
	for _, seed := range []string{
		`{"amountMoney":{"currency":"USD","amount":1250},"idempotencyKey":"k"}`,
		`{"amountMoney":{"currency":"USD","amount":"9223372036854775807"},"idempotencyKey":"k"}`,
		`{"amountMoney":{"currency":"usd","amount":1},"idempotencyKey":""}`,
		`{"amount_money":{"currency":"EUR","amount":-5},"idempotency_key":"k"}`,
		`{"amountMoney":null,"idempotencyKey":"k"}`,
		`{"amountMoney":{"currency":"USD","amount":1e3},"idempotencyKey":"k","extra":1}`,
		`[]`, `null`, ``, `{`, `"x"`, "\xff\xfe",
	} {
		f.Add([]byte(seed))
	}
	validator, err := protovalidate.New()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		reg := prometheus.NewRegistry()
		srv, err := service.NewServer(accepting{validator: validator, t: t}, service.Options{
			Logger:          slog.New(slog.NewJSONHandler(io.Discard, nil)),
			Registerer:      reg,
			Gatherer:        reg,
			MaxRequestBytes: 4096,
		})
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest(http.MethodPost, "/v1/multi-card-payments", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		srv.HTTP.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Errorf("POST %q = %d, want 200, 400 or 413", body, rec.Code)
		}
		srv.GRPC.Stop()
	})
}
