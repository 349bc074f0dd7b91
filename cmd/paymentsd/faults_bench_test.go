package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"example.com/paymentsd/internal/simulator"
)

// BenchmarkFaults times how long a caller waits to hear about each of
// TestFaults' provider failures, end to end through run over gRPC and
// REST (the figure TestFaults used to bound), and the failures answered
// without a request at all: a provider that refuses connections, and an
// open circuit. Cases whose answer waits for something they set up (a
// caller's deadline, a Retry-After, a slow provider) are left out: that
// wait is their figure, and TestFaults checks what ends it.
//
//	go test -run '^$' -bench Faults -benchtime 100x ./cmd/paymentsd/
func BenchmarkFaults(b *testing.B) {
	for _, tt := range faultCases() {
		if tt.deadline > 0 || waits(tt.replies) {
			continue
		}
		b.Run(tt.name, func(b *testing.B) {
			p := fakeProvider(b, "sandbox")
			p.KeepRequests(false)
			script := perKey(tt.replies...)
			p.SetScript(func(n int, r simulator.Request) simulator.Reply {
				if strings.HasPrefix(idempotencyKey(r.Body), closeCircuitKey) {
					return simulator.Reply{}
				}
				return script(n, r)
			})
			in := start(b, with(sandboxEnv(p), append([]string{"PAYMENTS_UPSTREAM_BREAKER_FAILURES", strconv.Itoa(breakerFailures)}, tt.env...)...))
			benchmarkAnswers(b, in, tt.name, tt.wantCode)
		})
	}
	b.Run("connection refused", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		closed := "http://" + ln.Addr().String() + "/v1"
		ln.Close()
		in := start(b, map[string]string{
			"PAYMENTS_SANDBOX_BASE_URL":          closed,
			"PAYMENTS_SANDBOX_API_KEY":           sandboxKey,
			"PAYMENTS_UPSTREAM_BREAKER_FAILURES": strconv.Itoa(breakerFailures),
		})
		benchmarkAnswers(b, in, "refused", codes.Unavailable)
	})
	b.Run("circuit open", func(b *testing.B) {
		p := fakeProvider(b, "sandbox")
		p.SetScript(simulator.Always(simulator.Reply{Status: 503}))
		in := start(b, with(sandboxEnv(p),
			"PAYMENTS_UPSTREAM_MAX_ATTEMPTS", "1",
			"PAYMENTS_UPSTREAM_BREAKER_FAILURES", "3",
			"PAYMENTS_UPSTREAM_BREAKER_COOLDOWN", "1h",
		))
		for i := range 3 {
			in.client.CreateMultiCardPayment(b.Context(), validRequest(fmt.Sprint("open-the-circuit-", i)))
		}
		benchmarkAnswers(b, in, "open", codes.Unavailable)
	})
}

// breakerFailures is as many failures in a row as paymentsd allows before
// its circuit opens; closeCircuitKey starts the keys of the payments that
// the provider lets through, to close it again before it opens.
const (
	breakerFailures = 1000
	closeCircuitKey = "close-the-circuit-"
)

// benchmarkAnswers makes payments through in, each under a key of its own,
// over gRPC and over REST, and fails if one is not answered with want.
// Every so often, untimed, it makes a payment the provider lets through,
// so that the failures never open the circuit.
func benchmarkAnswers(b *testing.B, in *instance, name string, want codes.Code) {
	i := 0 // keys are never reused: a replay is answered from the record
	closeCircuit := func(b *testing.B) {
		if i%(breakerFailures/4) != 0 {
			return
		}
		b.StopTimer()
		in.client.CreateMultiCardPayment(context.Background(), validRequest(fmt.Sprintf("%s%s-%d", closeCircuitKey, name, i)))
		b.StartTimer()
	}
	b.Run("gRPC", func(b *testing.B) {
		for b.Loop() {
			i++
			closeCircuit(b)
			_, err := in.client.CreateMultiCardPayment(context.Background(), validRequest(fmt.Sprintf("bench-%s-%d", name, i)))
			if got := status.Code(err); got != want {
				b.Fatalf("CreateMultiCardPayment() code = %v, want %v", got, want)
			}
		}
	})
	b.Run("REST", func(b *testing.B) {
		for b.Loop() {
			i++
			closeCircuit(b)
			r := postRESTNoFatal(in, validBody(fmt.Sprintf("bench-%s-%d", name, i)))
			if r.err != nil {
				b.Fatal(r.err)
			}
			got := codes.OK
			if r.status != http.StatusOK {
				got = restCode(r.restResult)
			}
			if got != want {
				b.Fatalf("POST /v1/multi-card-payments = %d, code %v, want %v", r.status, got, want)
			}
		}
	})
}

// waits reports whether a reply in replies makes paymentsd wait for it: a
// delay, a dribbled body, or a Retry-After.
func waits(replies []simulator.Reply) bool {
	for _, r := range replies {
		if r.Delay > 0 || r.Fault == simulator.Dribble || r.Header.Get("Retry-After") != "" {
			return true
		}
	}
	return false
}
