package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// Example shows an internal Go service taking a payment through the
// generated client: a deadline, an idempotency key chosen once per payment
// and reused on every retry, and handling by the ErrorInfo reason, which
// says what happened to the money. A new key is safe only after
// PAYMENT_NOT_CREATED.
func Example() {
	addr, stop := startSimulated() // paymentsd --simulate, for the example
	defer stop()

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	payments := paymentsv1.NewPaymentsServiceClient(conn)

	req := &paymentsv1.CreateMultiCardPaymentRequest{
		AmountMoney:    &paymentsv1.Money{Currency: "USD", Amount: 1250},
		IdempotencyKey: "order-1234", // one key per payment, kept for its retries
	}
	for attempt := 1; attempt <= 5; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := payments.CreateMultiCardPayment(ctx, req)
		cancel()
		if err == nil {
			fmt.Println("payment created in", resp.GetEnvironment())
			return
		}
		st := status.Convert(err)
		switch reason(st) {
		case "PAYMENT_NOT_CREATED":
			// No payment exists for the key: fix the request or the
			// deployment (st.Code() says which), and only then pay again,
			// under a new key if the request changed.
			fmt.Println("not created:", st.Code())
			return
		case "IDEMPOTENCY_KEY_REUSED", "IDEMPOTENCY_KEY_EXPIRED", "CALLER_NOT_ALLOWED":
			// Nothing was sent now, but the key may have paid before:
			// look it up (GetMultiCardPayment) before doing anything else.
			fmt.Println("refused:", reason(st))
			return
		default:
			// PAYMENT_OUTCOME_UNKNOWN, PAYMENT_IN_PROGRESS, REQUEST_NOT_SENT,
			// or no reason at all (the call never reached paymentsd): a
			// payment may exist, and only a retry with the same key learns
			// the outcome. Wait as the RetryInfo says.
			time.Sleep(retryAfter(st))
		}
	}
	fmt.Println("outcome still unknown: look the key up later, and never pay again under a new key")
	// Output: payment created in ENVIRONMENT_SANDBOX
}

// retryAfter is the RetryInfo's delay, or a second.
func retryAfter(st *status.Status) time.Duration {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return time.Second
}

// reason returns the ErrorInfo reason paymentsd attaches to its errors.
func reason(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// startSimulated runs paymentsd --simulate on loopback and returns its gRPC
// address and a function that stops it.
func startSimulated() (string, func()) {
	env := map[string]string{"PAYMENTS_GRPC_ADDR": "127.0.0.1:0", "PAYMENTS_HTTP_ADDR": "127.0.0.1:0", "PAYMENTS_LOG_LEVEL": "warn"}
	logs, w := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"paymentsd", "--simulate"}, envList(env), io.Discard, w)
		w.Close()
	}()
	dec := json.NewDecoder(logs)
	for {
		var line struct {
			Msg      string `json:"msg"`
			GRPCAddr string `json:"grpc_addr"`
		}
		if err := dec.Decode(&line); err != nil {
			log.Fatalf("paymentsd did not start: %v", errors.Join(err, <-done))
		}
		if strings.EqualFold(line.Msg, "serving") {
			go io.Copy(io.Discard, logs)
			return line.GRPCAddr, func() { cancel(); <-done }
		}
	}
}
