package main

import (
	"context"
	"database/sql"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/store/storetest"
)

// grpcClient connects to a paymentsd process's gRPC port.
func grpcClient(t *testing.T, p *process) paymentsv1.PaymentsServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return paymentsv1.NewPaymentsServiceClient(conn)
}

// TestKilledMidCallSettlesOnRestart kills paymentsd with SIGKILL while the
// provider holds its reply, restarts it on the same database, and wants
// the record settled, with one payment at the provider.
func TestKilledMidCallSettlesOnRestart(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and kills the binary")
	}
	for _, tt := range []struct {
		name string
		db   func(t testing.TB) string
	}{
		{"sqlite", storetest.SQLiteURL},
		{"postgres", storetest.PostgresURL},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			testKilledMidCall(t, tt.db(t))
		})
	}
}

func testKilledMidCall(t *testing.T, db string) {
	p := idempotentProvider(t)
	arrived := make(chan struct{}, 1)
	never := make(chan struct{})
	p.SetScript(func(n int, _ simulator.Request) simulator.Reply {
		if n == 1 {
			arrived <- struct{}{}
			return simulator.Reply{Wait: never}
		}
		return simulator.Reply{}
	})
	env := with(sandboxEnv(p),
		"PAYMENTS_DATABASE_URL", db,
		"PAYMENTS_UPSTREAM_TIMEOUT", "2s", // the lease: 2s + 5s
		// The killed call's request is presumed at the provider until its
		// lease ends plus this.
		"PAYMENTS_PROVIDER_QUIET_PERIOD", "3s",
	)
	first := startProcess(t, env)
	firstClient := grpcClient(t, first)
	callErr := make(chan error, 1)
	go func() {
		_, err := firstClient.CreateMultiCardPayment(context.Background(), validRequest("k-kill"))
		callErr <- err
	}()
	<-arrived
	first.cmd.Process.Kill()
	first.cmd.Wait()
	if err := <-callErr; status.Code(err) != codes.Unavailable {
		t.Errorf("call to the killed process = %v, want Unavailable", err)
	}

	second := grpcClient(t, startProcess(t, env))
	deadline := time.Now().Add(40 * time.Second)
	for {
		got, err := second.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-kill"})
		if err == nil && got.GetState() == paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED {
			if !strings.Contains(string(got.GetPaymentJson()), `"pay_sim_1"`) {
				t.Errorf("settled record holds %s, want the payment the first attempt created", got.GetPaymentJson())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("record of k-kill = %v, %v; want SUCCEEDED after the lease expired", got.GetState(), err)
		}
		time.Sleep(50 * time.Millisecond) // polling the record: settlement has no other signal
	}
	if p.Created() != 1 || len(p.Requests()) != 2 {
		t.Errorf("provider created %d payments from %d requests, want 1 from 2", p.Created(), len(p.Requests()))
	}
}

// TestStoreDownFailsClosed cuts paymentsd off from its PostgreSQL
// database: calls fail with UNAVAILABLE and REQUEST_NOT_SENT (paymentsd
// can't read the key's record, so it can't say no payment exists), the
// provider sees nothing, readiness goes to 503, and all comes back when
// the database does.
func TestStoreDownFailsClosed(t *testing.T) {
	t.Parallel()
	dbURL := storetest.PostgresURL(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	dbName := strings.TrimPrefix(u.Path, "/")
	admin, err := sql.Open("pgx", os.Getenv("PAYMENTS_TEST_POSTGRES_URL"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })

	p := fakeProvider(t, "sandbox")
	in := start(t, with(sandboxEnv(p), "PAYMENTS_DATABASE_URL", dbURL))
	if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-up")); err != nil {
		t.Fatalf("CreateMultiCardPayment() with the store up = %v", err)
	}
	before := len(p.Requests())

	if _, err := admin.Exec(`ALTER DATABASE "` + dbName + `" ALLOW_CONNECTIONS false`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, dbName); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(`ALTER DATABASE "` + dbName + `" ALLOW_CONNECTIONS true`) })

	_, err = in.client.CreateMultiCardPayment(t.Context(), validRequest("k-down"))
	st := status.Convert(err)
	if st.Code() != codes.Unavailable {
		t.Fatalf("CreateMultiCardPayment() with the store down code = %v, want Unavailable", st.Code())
	}
	checkReason(t, st, "REQUEST_NOT_SENT")
	if r := in.rest(t, validBody("k-down-rest"), nil); r.status != http.StatusServiceUnavailable || restReason(r) != "REQUEST_NOT_SENT" {
		t.Errorf("REST with the store down = %d %q, want 503 REQUEST_NOT_SENT", r.status, restReason(r))
	}
	// A key whose payment exists is no different: nothing is known.
	_, err = in.client.CreateMultiCardPayment(t.Context(), validRequest("k-up"))
	if st := status.Convert(err); st.Code() != codes.Unavailable || reasonOf(st) != "REQUEST_NOT_SENT" {
		t.Errorf("CreateMultiCardPayment(a paid key) with the store down = %v (%s), want Unavailable REQUEST_NOT_SENT", st.Code(), reasonOf(st))
	}
	if got := len(p.Requests()); got != before {
		t.Errorf("provider received %d requests with the store down, want none", got-before)
	}
	waitReady(t, in, http.StatusServiceUnavailable)

	if _, err := admin.Exec(`ALTER DATABASE "` + dbName + `" ALLOW_CONNECTIONS true`); err != nil {
		t.Fatal(err)
	}
	waitReady(t, in, http.StatusOK)
	if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-back")); err != nil {
		t.Errorf("CreateMultiCardPayment() after the store came back = %v", err)
	}
}

// waitReady polls /readyz until it answers want.
func waitReady(t *testing.T, in *instance, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := in.http.Get("http://" + in.httpAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == want {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz did not become %d within 30s", want)
		}
		time.Sleep(50 * time.Millisecond) // readiness is polled by probes too
	}
}
