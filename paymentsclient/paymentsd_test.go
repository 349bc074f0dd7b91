package paymentsclient_test

import (
	"cmp"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/service"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/upstream"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// providerKey is the API key the fake provider accepts.
const providerKey = "test-provider-key"

// paymentsd is a real paymentsd (service.New and service.NewServer, an
// SQLite record store, the real upstream client) serving gRPC on
// 127.0.0.1:0, in front of a fake provider.
type paymentsd struct {
	provider *simulator.Server
	conn     *grpc.ClientConn
	addr     string
	// rest is its HTTP port's handler (REST, health, metrics), served
	// in plaintext at restAddr.
	rest     http.Handler
	restAddr string
}

type paymentsdOptions struct {
	allowedCallers []string
	grpcOptions    []grpc.ServerOption         // credentials, say
	interceptor    grpc.UnaryClientInterceptor // on the client connection
	// addr, if set, is the gRPC address to listen on; else a free port.
	addr string
	// listeners, if set, are the gRPC listeners to serve, as replicas
	// sharing one record store would; they win over addr.
	listeners []net.Listener
	// upstreamTimeout, if set, replaces the default upstreamTimeout.
	upstreamTimeout time.Duration
	// retention, if set, deletes (tombstones) records that much past
	// their last change, checked every settlement round.
	retention time.Duration
}

// upstreamTimeout bounds each of paymentsd's provider calls; the quiet
// period after one cut off is as short as paymentsd allows, so tests see
// retries after it within seconds.
const upstreamTimeout = time.Second

func startPaymentsd(t *testing.T, opts paymentsdOptions) *paymentsd {
	t.Helper()
	p, stop, err := launch(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return p
}

// launch starts a paymentsd with its record store in dir; stop ends it
// and everything it started.
func launch(dir string, opts paymentsdOptions) (_ *paymentsd, stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	timeout := cmp.Or(opts.upstreamTimeout, upstreamTimeout)
	provider := simulator.NewServer()
	stops = append(stops, provider.Close)
	provider.AllowKey(providerKey)
	// An idempotent provider counts charges per key: more than one is a
	// double charge.
	provider.Idempotent(true)

	up, err := upstream.New(upstream.Config{
		BaseURL:     provider.URL,
		APIKey:      providerKey,
		HTTPClient:  provider.Client(),
		Timeout:     timeout,
		BackoffBase: 10 * time.Millisecond,
		BackoffMax:  50 * time.Millisecond,
		// The breaker is not under test here.
		BreakerFailures: 1 << 20,
	})
	if err != nil {
		return nil, nil, err
	}
	records, err := store.Open(context.Background(), "sqlite:"+filepath.Join(dir, "paymentsd.db"), "sandbox", store.Options{})
	if err != nil {
		return nil, nil, err
	}
	stops = append(stops, func() { records.Close() })
	svc := service.New(service.Config{
		Client:             up,
		Store:              records,
		Environment:        paymentsv1.Environment_ENVIRONMENT_SANDBOX,
		LeaseTTL:           timeout + 3*time.Second,
		QuietPeriod:        timeout,
		SettleInterval:     100 * time.Millisecond,
		Retention:          opts.retention,
		TombstoneRetention: time.Hour,
		RetentionInterval:  100 * time.Millisecond,
	})
	var allowed []service.Identity
	for _, c := range opts.allowedCallers {
		id, err := service.ParseIdentity(c)
		if err != nil {
			return nil, nil, err
		}
		allowed = append(allowed, id)
	}
	reg := prometheus.NewRegistry()
	srv, err := service.NewServer(svc, service.Options{
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
		Registerer:      reg,
		Gatherer:        reg,
		MaxRequestBytes: 64 << 10,
		AllowedCallers:  allowed,
		GRPCOptions:     opts.grpcOptions,
	})
	if err != nil {
		return nil, nil, err
	}
	lns := opts.listeners
	if len(lns) == 0 {
		ln, err := net.Listen("tcp", cmp.Or(opts.addr, "127.0.0.1:0"))
		if err != nil {
			return nil, nil, err
		}
		lns = []net.Listener{ln}
	}
	restLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	rest := &http.Server{Handler: srv.HTTP, ReadHeaderTimeout: 5 * time.Second}
	restServed := make(chan struct{})
	go func() {
		defer close(restServed)
		rest.Serve(restLn)
	}()
	stops = append(stops, func() {
		rest.Close()
		<-restServed
	})
	var served sync.WaitGroup
	for _, ln := range lns {
		served.Add(1)
		go func() {
			defer served.Done()
			srv.GRPC.Serve(ln)
		}()
	}
	srv.SetServing(true)
	ctx, cancel := context.WithCancel(context.Background())
	settled := make(chan struct{})
	go func() {
		defer close(settled)
		svc.Run(ctx) // settlement, as in paymentsd
	}()
	stops = append(stops, func() {
		srv.GRPC.Stop()
		served.Wait()
		cancel()
		<-settled
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		svc.Shutdown(sctx)
	})

	dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if opts.interceptor != nil {
		dial = append(dial, grpc.WithUnaryInterceptor(opts.interceptor))
	}
	addr := lns[0].Addr().String()
	conn, err := grpc.NewClient(addr, dial...)
	if err != nil {
		return nil, nil, err
	}
	stops = append(stops, func() { conn.Close() })
	return &paymentsd{provider: provider, conn: conn, addr: addr, rest: srv.HTTP, restAddr: restLn.Addr().String()}, stop, nil
}

// ready waits until the client connection is up, so that a test's
// deadline is spent on calls, not on connecting.
func (p *paymentsd) ready(t *testing.T) {
	t.Helper()
	if _, err := paymentsv1.NewPaymentsServiceClient(p.conn).GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "warm-up"}, grpc.WaitForReady(true)); status.Code(err) != codes.NotFound {
		t.Fatalf("warm-up lookup = %v, want NotFound", err)
	}
}

// onlyKey fails t unless key is the only idempotency key the provider has
// seen, and it was charged at most once.
func (p *paymentsd) onlyKey(t *testing.T, key string) {
	t.Helper()
	for k, ks := range p.provider.AllKeyStats() {
		if k != key {
			t.Errorf("the provider saw idempotency key %q (%d requests); only the caller's %q may be sent", k, ks.Requests, key)
			continue
		}
		if ks.Charges > 1 || ks.Bodies > 1 {
			t.Errorf("key %q: %d charges, %d distinct bodies; want at most 1 of each", k, ks.Charges, ks.Bodies)
		}
	}
}

func payment(key string) *paymentsv1.CreateMultiCardPaymentRequest {
	return &paymentsv1.CreateMultiCardPaymentRequest{
		AmountMoney:    &paymentsv1.Money{Currency: "USD", Amount: 1250},
		IdempotencyKey: key,
	}
}
