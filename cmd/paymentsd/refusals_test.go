package main

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/service"
	"example.com/paymentsd/internal/simulator"
)

// restCall is one REST request of a test and what it was answered.
type restCall struct {
	method, path, contentType, body string
	header                          http.Header
}

// do sends c to in's HTTP port and returns the status and the body.
func (c restCall) do(t *testing.T, client *http.Client, base string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), c.method, base+c.path, strings.NewReader(c.body))
	if err != nil {
		t.Fatal(err)
	}
	if c.contentType != "" {
		req.Header.Set("Content-Type", c.contentType)
	}
	for k, vs := range c.header {
		req.Header[k] = vs
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", c.method, c.path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// restErrorInfos are the ErrorInfo details of a REST error body.
func restErrorInfos(t *testing.T, body []byte) []map[string]any {
	t.Helper()
	var st struct {
		Details []map[string]any `json:"details"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("error body %s: %v", body, err)
	}
	var infos []map[string]any
	for _, d := range st.Details {
		if d["@type"] == "type.googleapis.com/google.rpc.ErrorInfo" {
			infos = append(infos, d)
		}
	}
	return infos
}

// TestEveryReasonNamesItsEnvironment: every ErrorInfo paymentsd sends
// says which environment answered, refusals made before the service (the
// REST port's, validation, the in-flight cap, the allowlist) included; and
// a 405 carries REQUEST_NOT_SENT like the REST port's other refusals.
func TestEveryReasonNamesItsEnvironment(t *testing.T) {
	t.Parallel()
	// The provider holds k-hold's request until the test ends.
	p := idempotentProvider(t)
	hold, arrived := make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.SetScript(func(_ int, r simulator.Request) simulator.Reply {
		if idempotencyKey(r.Body) == "k-hold" {
			once.Do(func() { close(arrived) })
			return simulator.Reply{Wait: hold}
		}
		return simulator.Reply{}
	})
	d := newCLIDeployment(t, with(sandboxEnv(p),
		"PAYMENTS_MAX_IN_FLIGHT", "1",
	))
	in := start(t, d.env)
	shop := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: d.serverCA.pool, Certificates: []tls.Certificate{d.checkoutTLS}, MinVersion: tls.VersionTLS12,
	}}}
	t.Cleanup(shop.CloseIdleConnections)
	base := "https://" + in.httpAddr
	checkInfos := func(what string, infos []map[string]any, wantReason string) {
		t.Helper()
		if len(infos) != 1 {
			t.Errorf("%s: %d ErrorInfos, want 1 (%s)", what, len(infos), wantReason)
			return
		}
		md, _ := infos[0]["metadata"].(map[string]any)
		if infos[0]["reason"] != wantReason || md["environment"] != "sandbox" {
			t.Errorf("%s: ErrorInfo %v, want reason %s and metadata environment sandbox", what, infos[0], wantReason)
		}
	}
	checkStatus := func(what string, err error, wantReason string) {
		t.Helper()
		var infos []map[string]any
		for _, dt := range status.Convert(err).Details() {
			if info, ok := dt.(*errdetails.ErrorInfo); ok {
				md := map[string]any{}
				for k, v := range info.GetMetadata() {
					md[k] = v
				}
				infos = append(infos, map[string]any{"reason": info.GetReason(), "metadata": md})
			}
		}
		checkInfos(what, infos, wantReason)
	}

	valid := `{"amountMoney":{"currency":"USD","amount":1250},"idempotencyKey":"k-env"}`
	for _, tt := range []struct {
		name string
		call restCall
		code int
	}{
		{"invalid request", restCall{"POST", "/v1/multi-card-payments", "application/json", `{"amountMoney":{"amount":1250},"idempotencyKey":"k-env"}`, nil}, 400},
		{"not JSON", restCall{"POST", "/v1/multi-card-payments", "application/json", `{`, nil}, 400},
		{"unknown field", restCall{"POST", "/v1/multi-card-payments", "application/json", `{"amountMoney":{"currency":"USD","amount":1250},"idempotencyKey":"k-env","bogus":1}`, nil}, 400},
		{"not declared JSON", restCall{"POST", "/v1/multi-card-payments", "text/plain", valid, nil}, 415},
		{"too large", restCall{"POST", "/v1/multi-card-payments", "application/json", `{"idempotencyKey":"` + strings.Repeat("k", 70<<10) + `"}`, nil}, 413},
		{"two keys", restCall{"POST", "/v1/multi-card-payments", "application/json", valid, http.Header{"Idempotency-Key": {"k-other"}}}, 400},
		{"a method the path doesn't serve", restCall{"PUT", "/v1/multi-card-payments", "application/json", valid, nil}, 405},
		{"a create to a lookup's path", restCall{"POST", "/v1/multi-card-payments/k-env", "application/json", valid, nil}, 405},
	} {
		code, body := tt.call.do(t, shop, base)
		if code != tt.code {
			t.Errorf("%s: %s %s = %d %s, want %d", tt.name, tt.call.method, tt.call.path, code, body, tt.code)
			continue
		}
		checkInfos(tt.name+" (REST)", restErrorInfos(t, body), service.ReasonNotSent)
	}

	// gRPC: validation, and a caller not on the allowlist.
	grpcShop := d.checkoutClient(t, in)
	_, err := grpcShop.CreateMultiCardPayment(t.Context(), &paymentsv1.CreateMultiCardPaymentRequest{IdempotencyKey: "k-env"})
	checkStatus("invalid request (gRPC)", err, service.ReasonNotSent)
	stranger := d.clientCA.issueClient(t, []string{"spiffe://corp.example/ns/shop/sa/stranger"}, nil)
	conn, err := grpc.NewClient(in.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: d.serverCA.pool, Certificates: []tls.Certificate{stranger}, MinVersion: tls.VersionTLS12,
	})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = paymentsv1.NewPaymentsServiceClient(conn).CreateMultiCardPayment(t.Context(), validRequest("k-stranger"))
	checkStatus("a caller not allowed (gRPC)", err, service.ReasonCallerNotAllowed)

	// The in-flight cap: one call holds the only slot, at a provider
	// that holds its request, while the others are refused.
	held := make(chan struct{})
	go func() {
		defer close(held)
		grpcShop.CreateMultiCardPayment(t.Context(), validRequest("k-hold"))
	}()
	defer func() {
		close(hold)
		<-held
	}()
	<-arrived
	_, err = grpcShop.CreateMultiCardPayment(t.Context(), validRequest("k-capped"))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("CreateMultiCardPayment while another call holds the only slot = %v, want RESOURCE_EXHAUSTED", err)
	}
	checkStatus("the in-flight cap (gRPC)", err, service.ReasonNotSent)
	code, body := restCall{"POST", "/v1/multi-card-payments", "application/json", valid, nil}.do(t, shop, base)
	if code != http.StatusTooManyRequests {
		t.Fatalf("POST while another call holds the only slot = %d %s, want 429", code, body)
	}
	checkInfos("the in-flight cap (REST)", restErrorInfos(t, body), service.ReasonNotSent)
}
