// Command checkout is the smallest Go caller of paymentsd, in a module of
// its own: TestGoCallerModule builds it as README "Calling it from Go"
// says, and checks what it links in.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/paymentsclient"
)

func main() {
	conn, err := paymentsclient.DialTLS("dns:///paymentsd:9090", "ca.crt", "tls.crt", "tls.key")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	payments := paymentsclient.New(conn)

	key := paymentsclient.NewIdempotencyKey() // store it with the order first
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := payments.Create(ctx, &paymentsv1.CreateMultiCardPaymentRequest{
		AmountMoney:    &paymentsv1.Money{Currency: "USD", Amount: 1250},
		IdempotencyKey: key,
	})
	switch {
	case err == nil:
		fmt.Println(resp.GetEnvironment(), resp.GetProviderHttpStatus())
	case errors.Is(err, paymentsclient.ErrNotCreated):
		log.Fatal("not charged; the order may be paid again under a new key: ", err)
	default:
		log.Fatal("keep the key and check later: ", err)
	}
}
