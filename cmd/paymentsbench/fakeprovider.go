package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// fakeProviderFlag, as the first argument, makes this binary the fake
// provider. It is not in -help: only the benchmark starts it.
const fakeProviderFlag = "-fake-provider"

// fakeReply is the reply to every payment: small and fixed, so that the
// fake spends as little CPU per request as any provider could.
var fakeReply = []byte(`{"id":"pay_bench","status":"COMPLETED","amountMoney":{"currency":"USD","amount":1250}}`)

// fakeStats is what GET /stats reports.
type fakeStats struct {
	// Connections counts connections accepted on the payments listener.
	Connections int64 `json:"connections"`
	Requests    int64 `json:"requests"`
	// MaxInFlight is the most payment requests handled at once.
	MaxInFlight int64 `json:"max_in_flight"`
}

// fakeProvider answers POST /v1/multi-card-payments for one key.
type fakeProvider struct {
	key   string
	delay time.Duration

	connections, requests, inFlight, maxInFlight atomic.Int64
}

func (f *fakeProvider) pay(w http.ResponseWriter, r *http.Request) {
	f.requests.Add(1)
	n := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for {
		m := f.maxInFlight.Load()
		if n <= m || f.maxInFlight.CompareAndSwap(m, n) {
			break
		}
	}

	if r.Header.Get("X-Api-Key") != f.key {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"errors":[{"category":"AUTHENTICATION_ERROR","code":"UNAUTHORIZED"}]}`)
		return
	}
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		return
	}
	if f.delay > 0 {
		t := time.NewTimer(f.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(fakeReply)
}

func (f *fakeProvider) stats(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(fakeStats{
		Connections: f.connections.Load(),
		Requests:    f.requests.Load(),
		MaxInFlight: f.maxInFlight.Load(),
	})
}

// runFakeProvider serves the fake provider until ctx ends. Statistics are
// served on a listener of their own, so that reading them opens no
// connection that would be counted.
func runFakeProvider(ctx context.Context, args []string, logw io.Writer) error {
	fs := flag.NewFlagSet("paymentsbench "+fakeProviderFlag, flag.ContinueOnError)
	fs.SetOutput(logw)
	addr := fs.String("addr", "127.0.0.1:0", "payments listen address")
	statsAddr := fs.String("stats-addr", "127.0.0.1:0", "GET /stats listen address")
	delay := fs.Duration("delay", 0, "how long to hold each reply")
	key := fs.String("key", "", "the API key to accept")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *key == "" {
		return errors.New("-key is required")
	}
	f := &fakeProvider{key: *key, delay: *delay}

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	statsLn, err := net.Listen("tcp", *statsAddr)
	if err != nil {
		ln.Close()
		return err
	}
	payments := http.NewServeMux()
	payments.HandleFunc("POST /v1/multi-card-payments", f.pay)
	srv := &http.Server{
		Handler:           payments,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       10 * time.Minute,
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				f.connections.Add(1)
			}
		},
	}
	statsSrv := &http.Server{Handler: http.HandlerFunc(f.stats), ReadHeaderTimeout: 10 * time.Second}

	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	go func() { errc <- statsSrv.Serve(statsLn) }()
	slog.New(slog.NewJSONHandler(logw, nil)).Info("serving",
		"addr", ln.Addr().String(), "stats_addr", statsLn.Addr().String(), "delay", delay.String())

	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	srv.Close()
	statsSrv.Close()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("fake provider: %w", err)
	}
	return nil
}

// readStats asks the fake provider for its counts.
func (f *fakeProcess) readStats(ctx context.Context, client *http.Client) (fakeStats, error) {
	var s fakeStats
	err := getJSON(ctx, client, "http://"+f.statsAddr+"/stats", &s)
	return s, err
}

func getJSON(ctx context.Context, client *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
