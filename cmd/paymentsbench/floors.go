package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"

	"example.com/paymentsd/internal/proc"
)

// The floors are the least a Go service can do on each of paymentsd's
// paths, each run as its own process against the same fake provider:
//
//   - proxyFloorFlag: an httputil.ReverseProxy with a small pooled buffer
//     that adds x-api-key, the floor of the REST path;
//   - grpcFloorFlag: a bare grpc-go server, built from gen/, whose
//     CreateMultiCardPayment makes one net/http POST to the provider and
//     decodes the reply, with no interceptors: the floor of the gRPC path.
//
// Neither keeps a record, validates, logs, retries or counts anything. Like
// the fake provider they are this binary re-executed with a hidden flag.
const (
	proxyFloorFlag = "-floor-proxy"
	grpcFloorFlag  = "-floor-grpc"
)

// floorDatabaseEnv, if set in a floor's environment, makes it the record
// floor (see recordFloor), recording every payment in that database: a
// PAYMENTS_DATABASE_URL, kept off the command line since it may hold a
// password.
const floorDatabaseEnv = "PAYMENTSBENCH_FLOOR_DATABASE_URL"

// floorTransport is the floors' provider client transport, tuned as
// paymentsd's is (a pool per host big enough for every call in flight,
// small buffers, no gzip), so that the floors are the best net/http can do.
func floorTransport() *http.Transport {
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     90 * time.Second,
		WriteBufferSize:     1 << 10,
		ReadBufferSize:      2 << 10,
		DisableCompression:  true,
	}
}

// bufferPool is the ReverseProxy's pool of copy buffers.
type bufferPool struct{ p sync.Pool }

func newBufferPool(size int) *bufferPool {
	return &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, size); return &b }}}
}

func (b *bufferPool) Get() []byte  { return *b.p.Get().(*[]byte) }
func (b *bufferPool) Put(p []byte) { b.p.Put(&p) }

// runFloor serves one of the floors until ctx ends.
func runFloor(ctx context.Context, mode string, args []string, logw io.Writer) error {
	fs := flag.NewFlagSet("paymentsbench "+mode, flag.ContinueOnError)
	fs.SetOutput(logw)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	provider := fs.String("provider", "", "the provider's payment URL")
	key := fs.String("key", "", "the provider API key to send")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *provider == "" || *key == "" {
		return errors.New("-provider and -key are required")
	}
	target, err := url.Parse(*provider)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	var rec *recordFloor
	if db := os.Getenv(floorDatabaseEnv); db != "" {
		if rec, err = openRecordFloor(ctx, db); err != nil {
			ln.Close()
			return err
		}
		defer rec.close()
	}
	transport := floorTransport()
	serving := func() {
		slog.New(slog.NewJSONHandler(logw, nil)).Info("serving", "addr", ln.Addr().String(), "mode", mode)
	}

	if mode == proxyFloorFlag {
		proxy := &httputil.ReverseProxy{
			Rewrite: func(r *httputil.ProxyRequest) {
				r.Out.URL.Scheme, r.Out.URL.Host, r.Out.Host = target.Scheme, target.Host, target.Host
				r.Out.Header.Set("X-Api-Key", *key)
			},
			Transport:  transport,
			BufferPool: newBufferPool(2 << 10),
		}
		var h http.Handler = proxy
		if rec != nil {
			proxy.ModifyResponse = rec.recordResponse
			h = rec.recordingHandler(proxy)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		errc := make(chan error, 1)
		go func() { errc <- srv.Serve(ln) }()
		serving()
		select {
		case <-ctx.Done():
		case err = <-errc:
		}
		srv.Close()
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}

	srv := grpc.NewServer()
	paymentsv1.RegisterPaymentsServiceServer(srv, &grpcFloor{
		url: *provider, key: *key, rec: rec,
		client: &http.Client{Transport: transport, Timeout: time.Minute},
	})
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	serving()
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	srv.Stop()
	return err
}

// grpcFloor is CreateMultiCardPayment with nothing but the call itself.
type grpcFloor struct {
	paymentsv1.UnimplementedPaymentsServiceServer
	url, key string
	client   *http.Client
	rec      *recordFloor // nil but in the record floor
}

func (g *grpcFloor) CreateMultiCardPayment(ctx context.Context, req *paymentsv1.CreateMultiCardPaymentRequest) (*paymentsv1.CreateMultiCardPaymentResponse, error) {
	var body struct {
		AmountMoney struct {
			Currency string `json:"currency"`
			Amount   int64  `json:"amount"`
		} `json:"amountMoney"`
		IdempotencyKey string `json:"idempotencyKey"`
	}
	body.AmountMoney.Currency = req.GetAmountMoney().GetCurrency()
	body.AmountMoney.Amount = req.GetAmountMoney().GetAmount()
	body.IdempotencyKey = req.GetIdempotencyKey()
	b, err := json.Marshal(&body)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if g.rec != nil {
		if err := g.rec.begin(ctx, body.IdempotencyKey, b); err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url, bytes.NewReader(b))
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("X-Api-Key", g.key)
	resp, err := g.client.Do(hreq)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if g.rec != nil {
		g.rec.finish(body.IdempotencyKey, resp.StatusCode, reply)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, status.Errorf(codes.Unknown, "provider answered %s", resp.Status)
	}
	var m map[string]any
	if err := json.Unmarshal(reply, &m); err != nil {
		return nil, status.Error(codes.Unknown, err.Error())
	}
	payment, err := structpb.NewStruct(m)
	if err != nil {
		return nil, status.Error(codes.Unknown, err.Error())
	}
	return &paymentsv1.CreateMultiCardPaymentResponse{
		Payment:            payment,
		PaymentJson:        reply,
		ProviderHttpStatus: int32(resp.StatusCode),
		Environment:        paymentsv1.Environment_ENVIRONMENT_SANDBOX,
	}, nil
}

// fsyncResult is the durable-write floor: what one fsync of 4 KiB costs on
// the filesystem that holds the benchmark's SQLite databases.
type fsyncResult struct {
	Dir          string  `json:"dir"`
	Samples      int     `json:"samples"`
	MedianMicros float64 `json:"median_us"`
	P90Micros    float64 `json:"p90_us"`
}

// fsyncFloor writes 4 KiB into a file in dir and fsyncs it, n times, and
// returns the median time of the pair.
func fsyncFloor(dir string, n int) (fsyncResult, error) {
	r := fsyncResult{Dir: dir, Samples: n}
	f, err := os.CreateTemp(dir, "fsync-")
	if err != nil {
		return r, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	page := bytes.Repeat([]byte{'x'}, 4<<10)
	// Fill the file first, so that the timed writes change no size (as
	// SQLite's WAL, once grown, is rewritten in place).
	for i := range 16 {
		if _, err := f.WriteAt(page, int64(i)*int64(len(page))); err != nil {
			return r, err
		}
	}
	if err := f.Sync(); err != nil {
		return r, err
	}
	times := make([]time.Duration, 0, n)
	for i := range n {
		start := time.Now()
		if _, err := f.WriteAt(page, int64(i%16)*int64(len(page))); err != nil {
			return r, err
		}
		if err := f.Sync(); err != nil {
			return r, err
		}
		times = append(times, time.Since(start))
	}
	slices.Sort(times)
	r.Dir = filepath.Clean(dir)
	r.MedianMicros = micros(percentile(times, 50))
	r.P90Micros = micros(percentile(times, 90))
	return r, nil
}

// floorProcess is a running floor.
type floorProcess struct {
	*proc.Process
	addr string
}

// startFloor starts a floor of mode against fake; with a record store
// (storeSQLite or storePostgres, in a database of its own), its record
// floor.
func (e *environment) startFloor(ctx context.Context, name, mode string, fake *fakeProcess, records string) (*floorProcess, error) {
	var env []string
	if records != "" {
		dbURL, err := e.dbs.url(ctx, records, name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		env = append(env, floorDatabaseEnv+"="+dbURL)
	}
	c, ready, err := proc.Start(ctx, proc.Command{Name: name, Path: e.self, Env: env, Args: []string{
		mode, "-addr=127.0.0.1:0", "-provider=" + fake.paymentURL(), "-key=" + e.providerKey}})
	if err != nil {
		return nil, err
	}
	if ready.Addr == "" {
		c.Stop()
		return nil, fmt.Errorf("%s reported no address", name)
	}
	return &floorProcess{Process: c, addr: ready.Addr}, nil
}
