// Command checkout is the smallest Go caller of paymentsd, in a module of
// its own: TestGoCallerModule builds it as README "Calling it from Go"
// says, and checks what it links in.
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

func main() {
	conn, err := grpc.NewClient("localhost:9090", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := paymentsv1.NewPaymentsServiceClient(conn).CreateMultiCardPayment(ctx, &paymentsv1.CreateMultiCardPaymentRequest{
		AmountMoney:    &paymentsv1.Money{Currency: "USD", Amount: 1250},
		IdempotencyKey: "order-1234-attempt-1",
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.GetEnvironment(), resp.GetProviderHttpStatus())
}
