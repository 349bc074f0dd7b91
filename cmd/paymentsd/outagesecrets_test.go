package main

import (
	"context"
	"encoding/base64"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/store/storetest"
)

// TestSecretsNeverShownDuringOutages: two replicas, one on a URL with the
// database password in its user info, one on a multi-host URL whose first
// host never answers and with the password in its query, log at debug
// level while PostgreSQL is killed under a payment whose 2xx comes back
// during the outage, while calls and lookups fail, and as it comes back.
// Neither the password nor the provider's API key appears in any form in
// what they log.
func TestSecretsNeverShownDuringOutages(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs two replicas as binaries through a PostgreSQL outage")
	}
	const password = "PGPASS_SENTINEL_outage_5e0c"
	c := storetest.StartCluster(t)
	u, err := url.Parse(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	direct := *u
	direct.User = url.UserPassword(u.User.Username(), password)
	multi := *u
	multi.Host = "127.0.0.1:1," + u.Host
	q := multi.Query()
	q.Set("password", password)
	q.Set("target_session_attrs", "read-write")
	q.Set("connect_timeout", "2")
	multi.RawQuery = q.Encode()

	arrived, release := make(chan struct{}), make(chan struct{})
	p := fakeProvider(t, "sandbox")
	p.SetScript(func(n int, req simulator.Request) simulator.Reply {
		if idempotencyKey(req.Body) == "held" {
			close(arrived)
			return simulator.Reply{Wait: release}
		}
		return simulator.Reply{}
	})
	env := with(sandboxEnv(p), "PAYMENTS_LOG_LEVEL", "debug", "PAYMENTS_UPSTREAM_TIMEOUT", "20s", "PAYMENTS_PROVIDER_QUIET_PERIOD", "20s")
	a := startProcess(t, with(env, "PAYMENTS_DATABASE_URL", direct.String()))
	b := startProcess(t, with(env, "PAYMENTS_DATABASE_URL", multi.String()))
	clientA, clientB := grpcClient(t, a), grpcClient(t, b)

	paid := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := clientA.CreateMultiCardPayment(ctx, validRequest("held"))
		paid <- err
	}()
	<-arrived
	c.Kill()
	close(release)
	// Calls and lookups on both while the database is away.
	for i := range 3 {
		for _, client := range []paymentsv1.PaymentsServiceClient{clientA, clientB} {
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			client.CreateMultiCardPayment(ctx, validRequest("during-"+strconv.Itoa(i)))
			client.GetMultiCardPayment(ctx, &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "held"})
			cancel()
		}
	}
	a.logs.waitFor(t, "could not record a payment's outcome; retrying until the record store takes it (the key is held meanwhile: no replica sends it)", nil)
	c.Start()
	if err := <-paid; err != nil {
		t.Errorf("the held payment = %v, want OK once the database is back", err)
	}
	for _, client := range []paymentsv1.PaymentsServiceClient{clientA, clientB} {
		if _, err := client.CreateMultiCardPayment(t.Context(), validRequest("after")); err != nil {
			t.Errorf("a payment after the outage = %v, want OK", err)
		}
	}

	forms := func(secret string) []string {
		out := []string{secret, strings.ToLower(secret), url.QueryEscape(secret)}
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawURLEncoding} {
			// Any 12 bytes of it, in base64, at each alignment.
			for i := range 3 {
				if e := enc.EncodeToString([]byte(secret[i : i+12])); len(e) > 4 {
					out = append(out, e[:len(e)-4])
				}
			}
		}
		return out
	}
	for name, proc := range map[string]*process{"a": a, "b": b} {
		logs := proc.logs.String()
		if !strings.Contains(logs, "record store failed") {
			t.Errorf("replica %s logged no store failure: the outage was not seen", name)
		}
		for what, secret := range map[string]string{"database password": password, "API key": sandboxKey} {
			for _, form := range forms(secret) {
				if strings.Contains(logs, form) {
					t.Errorf("replica %s logged the %s (as %q)", name, what, form)
				}
			}
		}
	}
}
