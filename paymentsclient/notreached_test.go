package paymentsclient_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"example.com/paymentsd/paymentsclient"
)

// TestMisconfiguredClient: a client whose attempts never reach a paymentsd
// (it points at the REST port, at a gRPC server that is something else,
// speaks TLS to a plaintext port, or finds nothing at its address) says
// so, ErrNotReached, with time left on its deadline: it neither retries
// for the whole deadline nor says ErrOutcomeUnknown, which would send a
// person to reconcile a payment that was never sent.
func TestMisconfiguredClient(t *testing.T) {
	t.Parallel()
	p := startPaymentsd(t, paymentsdOptions{})

	restTLS := httptest.NewUnstartedServer(p.rest)
	restTLS.EnableHTTP2 = true
	restTLS.StartTLS()
	t.Cleanup(restTLS.Close)
	restCA := x509.NewCertPool()
	restCA.AddCert(restTLS.Certificate())

	other := grpc.NewServer() // a gRPC server, but not paymentsd
	otherLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go other.Serve(otherLn)
	t.Cleanup(other.Stop)

	nothing, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nothing.Close()

	plaintext := insecure.NewCredentials()
	tests := []struct {
		name   string
		target string
		creds  credentials.TransportCredentials
	}{
		{"the REST port", p.restAddr, plaintext},
		{"the REST port over TLS", restTLS.Listener.Addr().String(), credentials.NewTLS(&tls.Config{RootCAs: restCA, MinVersion: tls.VersionTLS12})},
		{"TLS to a plaintext paymentsd", p.addr, credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})},
		{"a gRPC server that is not paymentsd", otherLn.Addr().String(), plaintext},
		{"nothing listening", nothing.Addr().String(), plaintext},
		{"a host that does not exist", "dns:///paymentsd.invalid:9090", plaintext},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			conn, err := grpc.NewClient(tt.target, grpc.WithTransportCredentials(tt.creds))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			c := paymentsclient.New(conn, paymentsclient.WithBackoff(10*time.Millisecond, 200*time.Millisecond))
			key := paymentsclient.NewIdempotencyKey()

			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			_, err = c.Create(ctx, payment(key))
			checkNotReached(t, "Create", err)
			_, err = c.Get(ctx, key)
			checkNotReached(t, "Get", err)
		})
	}
	if n := len(p.provider.AllKeyStats()); n != 0 {
		t.Errorf("the provider saw %d keys, want none", n)
	}
}

func checkNotReached(t *testing.T, call string, err error) {
	t.Helper()
	var perr *paymentsclient.Error
	if !errors.As(err, &perr) || !errors.Is(err, paymentsclient.ErrNotReached) {
		t.Fatalf("%s = %v, want ErrNotReached", call, err)
	}
	for _, other := range []error{paymentsclient.ErrNotCreated, paymentsclient.ErrOutcomeUnknown, paymentsclient.ErrInProgress, paymentsclient.ErrNotFound, paymentsclient.ErrInvalidRequest} {
		if errors.Is(err, other) {
			t.Errorf("%s = %v, which also matches %v", call, err, other)
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%s = %v: it tried until its deadline, want an answer with time left", call, err)
	}
}

// TestReachedThenLost: once a client has reached paymentsd, an attempt
// lost on its way (held by the network until the deadline) may have
// created the payment, and a paymentsd that stops answering may be
// restarting: both are ErrOutcomeUnknown, never ErrNotReached.
func TestReachedThenLost(t *testing.T) {
	t.Parallel()
	t.Run("an attempt held on its way", func(t *testing.T) {
		t.Parallel()
		p := startPaymentsd(t, paymentsdOptions{})
		l := startLink(t, p.addr)
		c := paymentsclient.New(dialLink(t, l), paymentsclient.WithBackoff(10*time.Millisecond, 200*time.Millisecond))
		l.Hold()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		_, err := c.Create(ctx, payment(paymentsclient.NewIdempotencyKey()))
		if !errors.Is(err, paymentsclient.ErrOutcomeUnknown) || errors.Is(err, paymentsclient.ErrNotReached) {
			t.Errorf("Create held on its way = %v, want ErrOutcomeUnknown", err)
		}
	})
	t.Run("paymentsd gone after it was reached", func(t *testing.T) {
		t.Parallel()
		p, stop, err := launch(t.TempDir(), paymentsdOptions{})
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			stop()
			t.Fatal(err)
		}
		defer conn.Close()
		c := paymentsclient.New(conn, paymentsclient.WithBackoff(10*time.Millisecond, 200*time.Millisecond))
		if _, err := c.Create(t.Context(), payment(paymentsclient.NewIdempotencyKey())); err != nil {
			stop()
			t.Fatalf("Create = %v, want the payment", err)
		}
		stop()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		_, err = c.Create(ctx, payment(paymentsclient.NewIdempotencyKey()))
		if !errors.Is(err, paymentsclient.ErrOutcomeUnknown) || errors.Is(err, paymentsclient.ErrNotReached) {
			t.Errorf("Create once paymentsd is gone = %v, want ErrOutcomeUnknown", err)
		}
	})
}

// TestGetFailureSaysLookup: a lookup that fails says so in a lookup's
// words (look the key up again), still matching ErrOutcomeUnknown, rather
// than Create's advice about paying and new keys.
func TestGetFailureSaysLookup(t *testing.T) {
	t.Parallel()
	p, stop, err := launch(t.TempDir(), paymentsdOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		stop()
		t.Fatal(err)
	}
	defer conn.Close()
	c := paymentsclient.New(conn, paymentsclient.WithBackoff(10*time.Millisecond, 200*time.Millisecond))
	key := paymentsclient.NewIdempotencyKey()
	if _, err := c.Create(t.Context(), payment(key)); err != nil {
		stop()
		t.Fatalf("Create = %v, want the payment", err)
	}
	stop()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	_, err = c.Get(ctx, key)
	if !errors.Is(err, paymentsclient.ErrOutcomeUnknown) {
		t.Fatalf("Get once paymentsd is gone = %v, want ErrOutcomeUnknown", err)
	}
	for _, create := range []string{"new key", "retry with the same idempotency key"} {
		if strings.Contains(err.Error(), create) {
			t.Errorf("Get once paymentsd is gone = %q: Create's advice (%q), not a lookup's", err, create)
		}
	}
}
