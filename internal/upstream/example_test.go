package upstream_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/upstream"
)

func ExampleClient_CreateMultiCardPayment() {
	provider := simulator.NewServer()
	defer provider.Close()
	provider.AllowKey("sk_sandbox_example")

	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	client, err := upstream.New(upstream.Config{
		BaseURL: provider.URL,
		APIKey:  "sk_sandbox_example",
		HTTPClient: &http.Client{
			Transport: transport,
			// The provider is not known to redirect; following one would
			// send the key elsewhere.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		Timeout: 10 * time.Second,
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	reply, err := client.CreateMultiCardPayment(context.Background(), upstream.Payment{
		Currency:       "USD",
		Amount:         1234,
		IdempotencyKey: "order-42",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(reply.Status, reply.Requests, reply.Payment().GetFields()["simulated"].GetBoolValue())
	// Output: 200 1 true
}

func ExampleError() {
	provider := simulator.NewServer()
	defer provider.Close()
	provider.SetScript(simulator.Always(simulator.Reply{Status: http.StatusServiceUnavailable}))

	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	client, err := upstream.New(upstream.Config{
		BaseURL:     provider.URL,
		APIKey:      "sk_sandbox_example",
		HTTPClient:  &http.Client{Transport: transport},
		MaxRequests: 2,
		BackoffBase: time.Millisecond,
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	_, err = client.CreateMultiCardPayment(context.Background(), upstream.Payment{
		Currency:       "USD",
		Amount:         1234,
		IdempotencyKey: "order-42",
	})
	var failure *upstream.Error
	var status *upstream.StatusError
	if errors.As(err, &failure) && errors.As(err, &status) {
		// A 5xx may come after the payment was made, or while the
		// provider still works on it: it is not retried at once, and a
		// retry later with the same idempotency key finds out.
		fmt.Println(failure.Requests, failure.MaybeCreated, status.Status)
	}
	// Output: 1 true 503
}
