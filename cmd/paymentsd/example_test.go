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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// Example shows an internal Go service taking a payment through the
// generated client: a deadline, an idempotency key chosen once per payment
// and reused on every retry, and handling by status code and ErrorInfo.
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
	for attempt := 1; attempt <= 3; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := payments.CreateMultiCardPayment(ctx, req)
		cancel()
		if err == nil {
			fmt.Println("payment created in", resp.GetEnvironment())
			return
		}
		st := status.Convert(err)
		switch st.Code() {
		case codes.InvalidArgument, codes.Unauthenticated, codes.PermissionDenied:
			fmt.Println("not created; fix the request or the deployment:", st.Code())
			return
		case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Unknown, codes.Internal:
			// PAYMENT_OUTCOME_UNKNOWN means a payment may exist: only a
			// retry with the same idempotency key may settle it.
			fmt.Println("retrying with the same key; reason:", reason(st))
		default:
			fmt.Println("not created:", st.Code())
			return
		}
	}
	// Output: payment created in ENVIRONMENT_SANDBOX
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
