package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
)

// caller makes one payment with the given idempotency key.
type caller func(ctx context.Context, key string) error

// load is the outcome of a batch of calls.
type load struct {
	latencies []time.Duration // of the calls that succeeded, sorted
	errors    int
	firstErr  error
	elapsed   time.Duration
}

// generate makes n calls, spread over concurrency workers that each make
// one call at a time, every call with its own idempotency key, keyPrefix
// followed by the call's number.
func generate(ctx context.Context, call caller, keyPrefix string, n, concurrency int) load {
	var (
		next      atomic.Int64
		wg        sync.WaitGroup
		l         load
		perWorker = make([][]time.Duration, concurrency)
		errCount  atomic.Int64
		firstErr  sync.Once
	)
	start := time.Now()
	for w := range concurrency {
		wg.Go(func() {
			mine := make([]time.Duration, 0, n/concurrency+1)
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(n) {
					break
				}
				t := time.Now()
				err := call(ctx, keyPrefix+strconv.FormatInt(i, 10))
				d := time.Since(t)
				if err != nil {
					errCount.Add(1)
					firstErr.Do(func() { l.firstErr = err })
					continue
				}
				mine = append(mine, d)
			}
			perWorker[w] = mine
		})
	}
	wg.Wait()
	l.elapsed = time.Since(start)
	l.errors = int(errCount.Load())
	l.latencies = slices.Concat(perWorker...)
	slices.Sort(l.latencies)
	if err := ctx.Err(); err != nil && l.firstErr == nil {
		l.firstErr = err
	}
	return l
}

// percentile is the nearest-rank p-th percentile of sorted latencies.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(float64(len(sorted))*p/100)) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// newLoadClient is the one HTTP client for the direct and REST paths, with
// a pool big enough to keep a connection per worker.
func newLoadClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        256,
			MaxIdleConnsPerHost: 128,
			IdleConnTimeout:     5 * time.Minute,
		},
		Timeout: time.Minute,
	}
}

// paymentBody is the provider's request body, which is also paymentsd's
// REST body.
func paymentBody(key string) []byte {
	b := make([]byte, 0, 96)
	b = append(b, `{"amountMoney":{"currency":"USD","amount":1250},"idempotencyKey":"`...)
	b = append(b, key...)
	return append(b, `"}`...)
}

// postPayment POSTs a payment to url, with apiKey as x-api-key if set, and
// wants 200 with the fake provider's payment in the body, as the provider
// itself or under paymentsd's "payment".
func postPayment(client *http.Client, url, apiKey string) caller {
	return func(ctx context.Context, key string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(paymentBody(key)))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		if apiKey != "" {
			req.Header.Set("X-Api-Key", apiKey)
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return fmt.Errorf("POST %s: reading reply: %w", url, err)
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("POST %s: %s: %.300s", url, resp.Status, b)
		}
		if !bytes.Contains(b, []byte(`"pay_bench"`)) {
			return fmt.Errorf("POST %s: reply without the fake provider's payment: %.300s", url, b)
		}
		return nil
	}
}

// grpcPayment calls CreateMultiCardPayment and wants the fake provider's
// payment back. It sets no deadline, as the REST calls set none.
func grpcPayment(client paymentsv1.PaymentsServiceClient) caller {
	return func(ctx context.Context, key string) error {
		resp, err := client.CreateMultiCardPayment(ctx, newPaymentRequest(key))
		if err != nil {
			return err
		}
		if id := resp.GetPayment().GetFields()["id"].GetStringValue(); id != "pay_bench" {
			return fmt.Errorf("CreateMultiCardPayment: payment id %q, want pay_bench", id)
		}
		return nil
	}
}

func newPaymentRequest(key string) *paymentsv1.CreateMultiCardPaymentRequest {
	return &paymentsv1.CreateMultiCardPaymentRequest{
		AmountMoney:    &paymentsv1.Money{Currency: "USD", Amount: 1250},
		IdempotencyKey: key,
	}
}
