package service

import (
	"bufio"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/store"
)

// TestUnidentifiedCallerRefusedOnEveryMethod: with client identities
// required, a caller that presents none is refused on every unary method
// of PaymentsService, before validation (an invalid request is refused
// for who sent it, not for what it holds) and before anything is sent or
// recorded; each refusal is counted in grpc_server_handled_total and has
// its call line.
func TestUnidentifiedCallerRefusedOnEveryMethod(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 30*time.Second, nil)
	reg := prometheus.NewRegistry()
	logs := &logBuffer{}
	srv, err := NewServer(f.svc, Options{
		Logger:          slog.New(slog.NewJSONHandler(logs, nil)),
		Registerer:      reg,
		Gatherer:        reg,
		MaxRequestBytes: 64 << 10,
		RequireIdentity: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.GRPC.Serve(ln)
	t.Cleanup(srv.GRPC.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := paymentsv1.NewPaymentsServiceClient(conn)
	ctx := t.Context()

	calls := []struct {
		method string
		call   func() error
	}{
		{paymentsv1.PaymentsService_CreateMultiCardPayment_FullMethodName, func() error {
			_, err := c.CreateMultiCardPayment(ctx, payment("k-unidentified"))
			return err
		}},
		{paymentsv1.PaymentsService_CreateMultiCardPayment_FullMethodName, func() error {
			_, err := c.CreateMultiCardPayment(ctx, &paymentsv1.CreateMultiCardPaymentRequest{IdempotencyKey: "k-invalid"})
			return err
		}},
		{paymentsv1.PaymentsService_GetMultiCardPayment_FullMethodName, func() error {
			_, err := c.GetMultiCardPayment(ctx, &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-unidentified"})
			return err
		}},
		{paymentsv1.PaymentsService_ListMultiCardPayments_FullMethodName, func() error {
			_, err := c.ListMultiCardPayments(ctx, &paymentsv1.ListMultiCardPaymentsRequest{})
			return err
		}},
		{paymentsv1.PaymentsService_ResolveMultiCardPayment_FullMethodName, func() error {
			_, err := c.ResolveMultiCardPayment(ctx, &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k-unidentified"})
			return err
		}},
	}
	want := map[string]int{}
	for _, tc := range calls {
		err := tc.call()
		if st := status.Convert(err); st.Code() != codes.PermissionDenied || reasonOf(err) != ReasonCallerNotAllowed {
			t.Errorf("%s from an unidentified caller = %v, reason %q; want PermissionDenied, %s", tc.method, st.Code(), reasonOf(err), ReasonCallerNotAllowed)
		}
		want[tc.method]++
	}

	if n := len(f.p.Requests()); n != 0 {
		t.Errorf("provider saw %d requests, want 0", n)
	}
	for _, key := range []string{"k-unidentified", "k-invalid"} {
		if _, err := f.store.Get(ctx, key); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("store.Get(%s) after refusals = %v, want ErrNotFound", key, err)
		}
	}

	got := map[string]int{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "grpc_server_handled_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["grpc_code"] == codes.PermissionDenied.String() {
				got["/"+labels["grpc_service"]+"/"+labels["grpc_method"]] += int(m.GetCounter().GetValue())
			}
		}
	}
	for method, n := range want {
		if got[method] != n {
			t.Errorf("grpc_server_handled_total{%s, PermissionDenied} = %d, want %d", method, got[method], n)
		}
	}

	lines := map[string]int{}
	logs.mu.Lock()
	sc := bufio.NewScanner(strings.NewReader(logs.buf.String()))
	logs.mu.Unlock()
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) != nil || line["msg"] != "call" {
			continue
		}
		if line["code"] == codes.PermissionDenied.String() {
			lines[line["method"].(string)]++
		}
	}
	for method, n := range want {
		if lines[method] != n {
			t.Errorf("%d PermissionDenied call lines for %s, want %d", lines[method], method, n)
		}
	}
}
