package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"buf.build/go/protovalidate"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/service"
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

// FuzzRESTBody feeds arbitrary bodies and content types to the REST
// gateway: it must never panic, must answer 200 only for valid requests
// sent as application/json with nothing but whitespace after the JSON
// value, and must refuse the rest with 400, 413 or (for a non-JSON content
// type) 415.
func FuzzRESTBody(f *testing.F) {
	valid := `{"amountMoney":{"currency":"USD","amount":1250},"idempotencyKey":"k"}`
	for _, seed := range []struct{ body, contentType string }{
		{valid, "text/plain"},
		{valid, ""},
		{valid, "application/json; charset=UTF-8"},
		{valid, "APPLICATION/JSON"},
		{valid, "application/json; charset=latin1"},
		{valid + valid, "application/json"},
		{valid + " x", "application/json"},
		{valid + "\n\t ", "application/json"},
		{valid + "}", "application/json"},
		{`{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k\u0000"}`, "application/json"},
		{`{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k\r\n"}`, "application/json"},
		{`{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"\u007f"}`, "application/json"},
		{`{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"a\tb"}`, "application/json"},
	} {
		f.Add([]byte(seed.body), seed.contentType)
	}
	for _, seed := range []string{
		`{"amountMoney":{"currency":"USD","amount":1250},"idempotencyKey":"k"}`,
		`{"amountMoney":{"currency":"USD","amount":"9223372036854775807"},"idempotencyKey":"k"}`,
		`{"amountMoney":{"currency":"usd","amount":1},"idempotencyKey":""}`,
		`{"amount_money":{"currency":"EUR","amount":-5},"idempotency_key":"k"}`,
		`{"amountMoney":null,"idempotencyKey":"k"}`,
		`{"amountMoney":{"currency":"USD","amount":1e3},"idempotencyKey":"k","extra":1}`,
		`[]`, `null`, ``, `{`, `"x"`, "\xff\xfe",
	} {
		f.Add([]byte(seed), "application/json")
	}
	validator, err := protovalidate.New()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte, contentType string) {
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
		req.Header.Set("Content-Type", contentType)
		rec := httptest.NewRecorder()
		srv.HTTP.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
		default:
			t.Errorf("POST %q (%q) = %d, want 200, 400, 413 or 415", body, contentType, rec.Code)
		}
		mt, params, err := mime.ParseMediaType(contentType)
		jsonType := err == nil && mt == "application/json" && (len(params) == 0 || len(params) == 1 && strings.EqualFold(params["charset"], "utf-8"))
		if rec.Code == http.StatusOK && !jsonType {
			t.Errorf("POST %q with Content-Type %q = 200, want 415", body, contentType)
		}
		if rec.Code == http.StatusUnsupportedMediaType && (jsonType || len(body) == 0) {
			t.Errorf("POST %q with Content-Type %q = 415", body, contentType)
		}
		if rec.Code == http.StatusOK {
			// Exactly one JSON value, then only whitespace.
			d := json.NewDecoder(bytes.NewReader(body))
			var v json.RawMessage
			if d.Decode(&v) != nil || len(bytes.TrimLeft(body[d.InputOffset():], " \t\r\n")) > 0 {
				t.Errorf("POST %q = 200 with data after the JSON value", body)
			}
		}
		srv.GRPC.Stop()
	})
}
