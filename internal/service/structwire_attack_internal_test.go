package service

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/upstream"
)

// TestHostileRepliesReachGRPCCallersExactly: the provider pays with
// replies that are valid JSON objects but awkward (escapes, lone
// surrogates, NUL, duplicate keys, extreme numbers, deep nesting, long
// strings, whitespace everywhere). Over a real gRPC connection, the
// payment a caller decodes from the first answer, from a replay and from
// a lookup is the Struct upstream.DecodeReply makes of the reply (what
// paymentsd sent before it wrote the Struct from the JSON), and
// payment_json is the reply's bytes; over REST the payment is the reply's
// JSON. A 2xx reply that is not a JSON object paymentsd accepts is never
// answered as a payment, nor looked up as one.
func TestHostileRepliesReachGRPCCallersExactly(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 9000) // lengths past one and two varint bytes
	replies := map[string]string{
		"empty":      `{}`,
		"whitespace": " \r\n\t{ \"a\" :\n[ 1 ,\t-0 , true , false , null , \"x\" , { } , [ ] ] , \"b\" : { } }\n ",
		"escapes":    `{"s":"\u0000\ud83d\ude80\ud800x\udc00\ud83d\u0041\/\"\\\b\f\n\r\t","k\u00e9y\ud83d\ude80":"v"}`,
		"numbers":    `{"amount":9007199254740993,"big":12345678901234567890,"max":1.7976931348623157e308,"tiny":5e-324,"negzero":-0,"neg":-0.0e5,"exp":1E+2}`,
		"duplicates": `{"amount":1,"amount":2,"card":{"last4":"4242"},"card":{"brand":"visa","x":{"y":1,"y":[2]}}}`,
		"deep":       `{"d":` + strings.Repeat(`[{"a":`, 200) + `"` + long + `"` + strings.Repeat(`}]`, 200) + `}`,
		"long":       `{"note":"` + long + `","list":[` + strings.Repeat(`"`+long[:300]+`",`, 50) + `0]}`,
	}
	malformed := map[string]string{
		"overflow":  `{"amount":1e400}`,
		"array":     `[{"id":"pay_1"}]`,
		"truncated": `{"id":"pay_1"`,
	}
	f := newFixture(t, 10*time.Second, nil)
	f.p.SetScript(func(_ int, r simulator.Request) simulator.Reply {
		k := keyOf(r.Body)
		if b, ok := replies[k]; ok {
			return simulator.Reply{Status: http.StatusOK, Body: []byte(b)}
		}
		return simulator.Reply{Status: http.StatusOK, Body: []byte(malformed[k])}
	})
	reg := prometheus.NewRegistry()
	srv, err := NewServer(f.svc, Options{
		Logger:          slog.New(slog.NewJSONHandler(io.Discard, nil)),
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
	c := paymentsv1.NewPaymentsServiceClient(conn)
	ctx := t.Context()

	for key, reply := range replies {
		want, err := upstream.DecodeReply([]byte(reply))
		if err != nil {
			t.Fatalf("%s: the test's reply is not one paymentsd accepts: %v", key, err)
		}
		for _, call := range []string{"create", "replay"} {
			resp, err := c.CreateMultiCardPayment(ctx, payment(key))
			if err != nil {
				t.Errorf("%s: %s = %v, want OK", key, call, err)
				continue
			}
			if !proto.Equal(resp.GetPayment(), want) || string(resp.GetPaymentJson()) != reply {
				t.Errorf("%s: %s payment = %v, payment_json %q; want %v, %q", key, call, resp.GetPayment(), resp.GetPaymentJson(), want, reply)
			}
		}
		got, err := c.GetMultiCardPayment(ctx, &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
		if err != nil {
			t.Errorf("%s: Get = %v", key, err)
		} else if !proto.Equal(got.GetPayment(), want) || string(got.GetPaymentJson()) != reply {
			t.Errorf("%s: Get payment = %v, payment_json %q; want %v, %q", key, got.GetPayment(), got.GetPaymentJson(), want, reply)
		}
		resp, err := http.Get(hs.URL + "/v1/multi-card-payments/" + key)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// A lookup's payment over REST is the reply exactly, whitespace
		// and all, as the API says.
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"payment":`+reply) {
			t.Errorf("%s: REST Get = %d %.300s, want the reply's bytes as payment", key, resp.StatusCode, body)
		}
	}
	for key := range malformed {
		if _, err := c.CreateMultiCardPayment(ctx, payment(key)); status.Code(err) == codes.OK || reasonOf(err) == "" {
			t.Errorf("%s: create with a malformed 2xx reply = %v, want an error that says what happened to the money", key, err)
		}
		got, err := c.GetMultiCardPayment(ctx, &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: key})
		if err != nil {
			t.Errorf("%s: Get = %v", key, err)
		} else if got.GetPayment() != nil || got.GetState() == paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED {
			t.Errorf("%s: Get = state %v, payment %v; want no payment", key, got.GetState(), got.GetPayment())
		}
	}
}
