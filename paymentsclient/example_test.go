package paymentsclient_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/paymentsclient"
)

// startExample starts an in-process paymentsd in front of a fake provider,
// standing in for the deployment an example would call.
func startExample() (*paymentsd, func()) {
	dir, err := os.MkdirTemp("", "paymentsclient-example")
	if err != nil {
		log.Fatal(err)
	}
	p, stop, err := launch(dir, paymentsdOptions{})
	if err != nil {
		log.Fatal(err)
	}
	return p, func() {
		stop()
		os.RemoveAll(dir)
	}
}

func ExampleNewIdempotencyKey() {
	// Make the key when the customer decides to pay, and store it with the
	// order before the first call: every retry of this payment, in this
	// process or after a restart, uses it.
	key := paymentsclient.NewIdempotencyKey()
	fmt.Println(len(key), key != paymentsclient.NewIdempotencyKey())
	// Output: 26 true
}

func ExampleClient_Create() {
	paymentsd, stop := startExample()
	defer stop()
	// In production: conn, err := paymentsclient.DialTLS("dns:///paymentsd-grpc.payments-live.svc.cluster.local:9090", ca, cert, key)
	payments := paymentsclient.New(paymentsd.conn)

	order := struct{ PaymentKey string }{PaymentKey: paymentsclient.NewIdempotencyKey()}

	// The deadline is how long the caller can wait for the payment:
	// Create retries with the order's key until then.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := payments.Create(ctx, &paymentsv1.CreateMultiCardPaymentRequest{
		AmountMoney:    &paymentsv1.Money{Currency: "USD", Amount: 1250},
		IdempotencyKey: order.PaymentKey,
	})
	switch {
	case err == nil:
		fmt.Println("paid:", resp.GetProviderHttpStatus(), resp.GetEnvironment())
	case errors.Is(err, paymentsclient.ErrNotCreated):
		// Nothing was charged. Only now may the order be paid again, under
		// a new key (after fixing what the error says).
		fmt.Println("not charged:", err)
	case errors.Is(err, paymentsclient.ErrOutcomeUnknown), errors.Is(err, paymentsclient.ErrInProgress):
		// The customer may have been charged: keep the order's key, and
		// retry it or look it up later (payments.Get). Never a new key.
		fmt.Println("check later with the same key:", err)
	default:
		// ErrKeyReused, ErrKeyExpired, ErrInvalidRequest, ...: nothing was
		// sent now, but the key may have paid before; a person decides.
		fmt.Println("refused:", err)
	}
	// Output: paid: 200 ENVIRONMENT_SANDBOX
}

// A payment the provider refuses outright is ErrNotCreated: the only
// error after which the order may be paid under a new key.
func ExampleClient_Create_notCreated() {
	paymentsd, stop := startExample()
	defer stop()
	paymentsd.provider.SetScript(simulator.Always(simulator.Reply{Status: http.StatusForbidden}))
	payments := paymentsclient.New(paymentsd.conn)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := payments.Create(ctx, &paymentsv1.CreateMultiCardPaymentRequest{
		AmountMoney:    &paymentsv1.Money{Currency: "USD", Amount: 1250},
		IdempotencyKey: paymentsclient.NewIdempotencyKey(),
	})
	var perr *paymentsclient.Error
	if errors.As(err, &perr) {
		fmt.Println(errors.Is(err, paymentsclient.ErrNotCreated), perr.Code, perr.Reason, perr.Attempts)
	}
	// Output: true PermissionDenied PAYMENT_NOT_CREATED 1
}

func ExampleClient_Get() {
	paymentsd, stop := startExample()
	defer stop()
	payments := paymentsclient.New(paymentsd.conn)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := paymentsclient.NewIdempotencyKey()
	if _, err := payments.Create(ctx, &paymentsv1.CreateMultiCardPaymentRequest{
		AmountMoney:    &paymentsv1.Money{Currency: "USD", Amount: 1250},
		IdempotencyKey: key,
	}); err != nil {
		log.Fatal(err)
	}
	rec, err := payments.Get(ctx, key)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rec.GetState(), rec.GetRequest().GetAmountMoney().GetAmount())

	_, err = payments.Get(ctx, paymentsclient.NewIdempotencyKey())
	fmt.Println(errors.Is(err, paymentsclient.ErrNotFound))
	// Output:
	// PAYMENT_STATE_SUCCEEDED 1250
	// true
}

func ExampleDialTLS() {
	// paymentsd's headless Service: its name resolves to every ready
	// replica, and calls are spread over them all. The CA that signs
	// paymentsd's certificate (which must name that host), and this
	// service's own certificate, whose URI SAN is on paymentsd's allowlist.
	conn, err := paymentsclient.DialTLS("dns:///paymentsd-grpc.payments-live.svc.cluster.local:9090",
		"/etc/paymentsd-client/ca.crt", "/etc/paymentsd-client/tls.crt", "/etc/paymentsd-client/tls.key")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	payments := paymentsclient.New(conn)
	_ = payments
}
