package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/service"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/store/storetest"
)

const oncall = "spiffe://corp.example/ns/ops/sa/oncall"

// party is one caller of an mTLS deployment, over both transports.
type party struct {
	name   string
	conn   *grpc.ClientConn
	client paymentsv1.PaymentsServiceClient
	http   *http.Client
	base   string // https://host:port
}

// mtlsDeployment starts paymentsd with mTLS, checkout and billing on the
// allowlist, and oncall an admin (and not on the allowlist: admins need
// not be listed twice), and returns a party for each identity.
func mtlsDeployment(t *testing.T, env map[string]string) (in *instance, parties map[string]*party) {
	t.Helper()
	serverCA, clientCA := newTestCA(t, "server CA"), newTestCA(t, "client CA")
	certFile, keyFile := writePEMFiles(t, serverCA.issue(t, x509.ExtKeyUsageServerAuth))
	clientCAFile := filepath.Join(t.TempDir(), "client-ca.pem")
	os.WriteFile(clientCAFile, clientCA.pem, 0o600)
	in = start(t, with(env, "PAYMENTS_TLS_CERT_FILE", certFile, "PAYMENTS_TLS_KEY_FILE", keyFile,
		"PAYMENTS_TLS_CLIENT_CA_FILE", clientCAFile,
		"PAYMENTS_ALLOWED_CALLERS", checkout+","+billing,
		"PAYMENTS_ADMIN_CALLERS", oncall))
	parties = map[string]*party{}
	for name, id := range map[string][]string{"checkout": {checkout}, "oncall": {oncall}} {
		parties[name] = newParty(t, in, serverCA, clientCA.issueClient(t, id, nil), name)
	}
	parties["billing"] = newParty(t, in, serverCA, clientCA.issueClient(t, nil, []string{billingName}), "billing")
	return in, parties
}

func newParty(t *testing.T, in *instance, serverCA *testCA, cert tls.Certificate, name string) *party {
	t.Helper()
	tc := &tls.Config{RootCAs: serverCA.pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	conn, err := grpc.NewClient(in.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	transport := &http.Transport{TLSClientConfig: tc}
	t.Cleanup(transport.CloseIdleConnections)
	return &party{name: name, conn: conn, client: paymentsv1.NewPaymentsServiceClient(conn), http: &http.Client{Transport: transport}, base: "https://" + in.httpAddr}
}

func (p *party) do(t *testing.T, method, path, body string) restResult {
	t.Helper()
	req, err := http.NewRequest(method, p.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.http.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := restResult{status: resp.StatusCode, header: resp.Header, raw: raw}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	d.Decode(&r.body)
	return r
}

func (p *party) metric(t *testing.T, family string, labels map[string]string) float64 {
	t.Helper()
	r := p.do(t, http.MethodGet, "/metrics", "")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(r.raw))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	v, ok := sample(families, family, labels)
	if !ok {
		t.Fatalf("/metrics has no %s%v", family, labels)
	}
	return v
}

func listKeys(resp *paymentsv1.ListMultiCardPaymentsResponse) []string {
	var ks []string
	for _, p := range resp.GetPayments() {
		ks = append(ks, p.GetIdempotencyKey())
	}
	return ks
}

func restListKeys(r restResult) []string {
	var ks []string
	ps, _ := r.body["payments"].([]any)
	for _, p := range ps {
		m, _ := p.(map[string]any)
		k, _ := m["idempotencyKey"].(string)
		ks = append(ks, k)
	}
	return ks
}

func checkCode(t *testing.T, what string, err error, code codes.Code, reason string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code || reasonOf(st) != reason {
		t.Errorf("%s = %v (%s), reason %q; want %v, %q", what, st.Code(), st.Message(), reasonOf(st), code, reason)
	}
}

// TestResolveEndToEnd is the on-call path, on both backends: a payment
// whose outcome stays unknown past its settlement window is found by
// listing, resolved with evidence by an admin, shows its audit entry, no
// longer counts as unsettled, and replays the resolution; a second one
// resolved NOT_CREATED is tried again.
func TestResolveEndToEnd(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			p := idempotentProvider(t)
			p.SetScript(simulator.Always(simulator.Reply{Fault: simulator.Reset}))
			env := with(sandboxEnv(p),
				"PAYMENTS_UPSTREAM_MAX_ATTEMPTS", "1",
				"PAYMENTS_UPSTREAM_BREAKER_FAILURES", "1000",
				// Long enough for a send after a person's NOT_CREATED: the
				// attempt then is bounded by its new window (a person's
				// word is not the provider's), less the lease's margins.
				"PAYMENTS_SETTLEMENT_WINDOW", "3s",
				"PAYMENTS_UPSTREAM_TIMEOUT", "500ms",
				"PAYMENTS_PROVIDER_QUIET_PERIOD", "1s",
			)
			if backend == "postgres" {
				env["PAYMENTS_DATABASE_URL"] = storetest.PostgresURL(t)
			}
			in, ps := mtlsDeployment(t, env)
			co, admin := ps["checkout"], ps["oncall"]
			const gaveUp = "settlement window closed with the payment's outcome unknown; check the provider's dashboard"
			for _, key := range []string{"k-doubt-1", "k-doubt-2"} {
				_, err := co.client.CreateMultiCardPayment(t.Context(), validRequest(key))
				checkReason(t, status.Convert(err), "PAYMENT_OUTCOME_UNKNOWN")
			}
			for len(in.logs.lines(gaveUp)) < 2 {
				in.logs.waitFor(t, gaveUp, nil)
			}
			// The gauge is recounted just after the give-up is logged.
			for deadline := time.Now().Add(10 * time.Second); admin.metric(t, "paymentsd_records_unsettled", nil) != 2; {
				if time.Now().After(deadline) {
					t.Fatalf("paymentsd_records_unsettled = %v once settlement gave up, want 2", admin.metric(t, "paymentsd_records_unsettled", nil))
				}
				time.Sleep(20 * time.Millisecond) // polling the gauge: its recount has no other signal
			}

			// On call lists the payments in doubt, over gRPC and REST.
			unknown := []paymentsv1.PaymentState{paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN}
			list, err := admin.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{
				State: unknown, SettlementGaveUp: proto.Bool(true), PageSize: 1})
			if err != nil {
				t.Fatalf("ListMultiCardPayments(unknown, gave up) = %v", err)
			}
			if got := listKeys(list); len(got) != 1 || got[0] != "k-doubt-1" || list.GetNextPageToken() == "" {
				t.Fatalf("ListMultiCardPayments page 1 = %v, token %q; want [k-doubt-1] and a token", got, list.GetNextPageToken())
			}
			sum := list.GetPayments()[0]
			if sum.GetCaller() != checkout || !sum.GetSettlementGaveUp() || sum.GetAttempts() < 1 || sum.GetAmountMoney().GetAmount() == 0 || sum.GetPaymentJson() != nil {
				t.Errorf("summary = %v", sum)
			}
			r := admin.do(t, http.MethodGet, "/v1/multi-card-payments?state=PAYMENT_STATE_OUTCOME_UNKNOWN&settlementGaveUp=true&pageSize=1&pageToken="+url.QueryEscape(list.GetNextPageToken()), "")
			if got := restListKeys(r); r.status != http.StatusOK || len(got) != 1 || got[0] != "k-doubt-2" {
				t.Fatalf("REST list page 2 = %d %s; want k-doubt-2", r.status, r.raw)
			}
			// A token is only good with its filters.
			r = admin.do(t, http.MethodGet, "/v1/multi-card-payments?pageToken="+url.QueryEscape(list.GetNextPageToken()), "")
			if r.status != http.StatusBadRequest || restReason(r) != service.ReasonPageTokenInvalid {
				t.Errorf("REST list with another filter's token = %d %s, want 400 %s", r.status, r.raw, service.ReasonPageTokenInvalid)
			}

			// Only an admin resolves.
			resolve := `{"idempotencyKey":"k-doubt-1","outcome":"RESOLUTION_OUTCOME_SUCCEEDED","evidence":"provider dashboard: pay_123, captured","replyJson":"{\"id\":\"pay_123\",\"amount\":12345678901234567890}"}`
			if r := co.do(t, http.MethodPost, "/v1/multi-card-payments:resolve", resolve); r.status != http.StatusForbidden || restReason(r) != service.ReasonCallerNotAdmin {
				t.Errorf("REST resolve by checkout = %d %s, want 403 %s", r.status, r.raw, service.ReasonCallerNotAdmin)
			}
			_, err = co.client.ResolveMultiCardPayment(t.Context(), &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k-doubt-2",
				Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED, Evidence: "none"})
			checkCode(t, "ResolveMultiCardPayment by checkout", err, codes.PermissionDenied, service.ReasonCallerNotAdmin)

			sent := len(p.Requests())
			r = admin.do(t, http.MethodPost, "/v1/multi-card-payments:resolve", resolve)
			if r.status != http.StatusOK {
				t.Fatalf("REST resolve by on call = %d %s, want 200", r.status, r.raw)
			}
			// Over REST the record's payment is the recorded reply, exactly.
			if !strings.Contains(string(r.raw), `"payment":{"id":"pay_123","amount":12345678901234567890}`) || !strings.Contains(string(r.raw), `"auditEntry":{`) {
				t.Errorf("REST resolve reply = %s; want the exact payment and the audit entry", r.raw)
			}
			if v := admin.metric(t, "paymentsd_records_unsettled", nil); v != 1 {
				t.Errorf("paymentsd_records_unsettled = %v right after a resolution, want 1", v)
			}
			if v := admin.metric(t, "paymentsd_resolutions_total", map[string]string{"outcome": "succeeded"}); v != 1 {
				t.Errorf("paymentsd_resolutions_total{succeeded} = %v, want 1", v)
			}
			// Resolved once is resolved for good.
			r = admin.do(t, http.MethodPost, "/v1/multi-card-payments:resolve", resolve)
			if r.status != http.StatusUnprocessableEntity || restReason(r) != service.ReasonRecordNotUnknown {
				t.Errorf("REST resolve again = %d %s, want 422 %s", r.status, r.raw, service.ReasonRecordNotUnknown)
			}

			// The caller sees the audit trail, and its retry replays the
			// resolution without calling the provider.
			got, err := co.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-doubt-1"})
			if err != nil {
				t.Fatal(err)
			}
			if got.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED || len(got.GetAuditEntries()) != 1 {
				t.Fatalf("GetMultiCardPayment after resolving = %v with %d audit entries", got.GetState(), len(got.GetAuditEntries()))
			}
			e := got.GetAuditEntries()[0]
			if e.GetActor() != oncall || e.GetFromState() != paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN ||
				e.GetToState() != paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED || e.GetEvidence() != "provider dashboard: pay_123, captured" ||
				!e.GetReplyRecorded() || !e.GetSettlementGaveUp() || e.GetRequestId() == "" || e.GetCreateTime() == nil {
				t.Errorf("audit entry = %v", e)
			}
			resp, err := co.client.CreateMultiCardPayment(t.Context(), validRequest("k-doubt-1"))
			if err != nil || !resp.GetReplayed() || !resp.GetResolved() || resp.GetProviderHttpStatus() != 0 ||
				string(resp.GetPaymentJson()) != `{"id":"pay_123","amount":12345678901234567890}` {
				t.Errorf("CreateMultiCardPayment after SUCCEEDED = %v, %v; want the resolution replayed", resp, err)
			}
			if rr := postREST(t, co.http, co.base, validBody("k-doubt-1"), nil); rr.status != http.StatusOK ||
				!strings.Contains(string(rr.raw), `"payment":{"id":"pay_123","amount":12345678901234567890}`) || !strings.Contains(string(rr.raw), `"resolved":true`) {
				t.Errorf("REST replay after SUCCEEDED = %d %s", rr.status, rr.raw)
			}
			if n := len(p.Requests()); n != sent {
				t.Errorf("provider got %d requests after the resolution, want none", n-sent)
			}

			// NOT_CREATED: the next call makes a new attempt.
			res, err := admin.client.ResolveMultiCardPayment(t.Context(), &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k-doubt-2",
				Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED, Evidence: "no such payment on the provider's dashboard\nchecked by hand"})
			if err != nil || res.GetPayment().GetState() != paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED || res.GetAuditEntry().GetOutcome() != paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED {
				t.Fatalf("ResolveMultiCardPayment(NOT_CREATED) = %v, %v", res, err)
			}
			if v := admin.metric(t, "paymentsd_records_unsettled", nil); v != 0 {
				t.Errorf("paymentsd_records_unsettled = %v after both resolutions, want 0", v)
			}
			p.SetScript(simulator.Always(simulator.Reply{}))
			resp, err = co.client.CreateMultiCardPayment(t.Context(), validRequest("k-doubt-2"))
			if err != nil || resp.GetReplayed() || resp.GetResolved() {
				t.Errorf("CreateMultiCardPayment after NOT_CREATED = %v, %v; want a new attempt", resp, err)
			}
			if n := len(p.Requests()); n != sent+1 {
				t.Errorf("provider got %d requests after NOT_CREATED, want 1", n-sent)
			}
		})
	}
}

// TestCallersSeeOnlyTheirOwn: with identities, a caller sees and replays
// only the records it created; another's key reads as missing, and using
// it sends nothing and tells nothing of the record.
func TestCallersSeeOnlyTheirOwn(t *testing.T) {
	t.Parallel()
	p := idempotentProvider(t)
	_, ps := mtlsDeployment(t, sandboxEnv(p))
	co, bi, admin := ps["checkout"], ps["billing"], ps["oncall"]
	if _, err := co.client.CreateMultiCardPayment(t.Context(), validRequest("k-checkout")); err != nil {
		t.Fatal(err)
	}
	if _, err := bi.client.CreateMultiCardPayment(t.Context(), validRequest("k-billing")); err != nil {
		t.Fatal(err)
	}
	sent := len(p.Requests())

	// Get: another's key is NOT_FOUND, exactly as a missing key is.
	_, errOther := bi.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-checkout"})
	_, errMissing := bi.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-nobody"})
	stOther, stMissing := status.Convert(errOther), status.Convert(errMissing)
	if stOther.Code() != codes.NotFound || len(stOther.Details()) != len(stMissing.Details()) ||
		strings.ReplaceAll(stOther.Message(), "k-checkout", "K") != strings.ReplaceAll(stMissing.Message(), "k-nobody", "K") {
		t.Errorf("Get of another caller's key = %v %q; want it to read as a missing key's %v %q", stOther.Code(), stOther.Message(), stMissing.Code(), stMissing.Message())
	}
	if r := bi.do(t, http.MethodGet, "/v1/multi-card-payments/k-checkout", ""); r.status != http.StatusNotFound {
		t.Errorf("REST Get of another caller's key = %d, want 404", r.status)
	}
	if _, err := admin.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-checkout"}); err != nil {
		t.Errorf("admin Get = %v, want the record", err)
	}

	// Create: refused, and the refusal holds nothing of the record.
	for _, req := range []*paymentsv1.CreateMultiCardPaymentRequest{validRequest("k-checkout"),
		{IdempotencyKey: "k-checkout", AmountMoney: &paymentsv1.Money{Currency: "EUR", Amount: 999}}} {
		_, err := bi.client.CreateMultiCardPayment(t.Context(), req)
		checkCode(t, "CreateMultiCardPayment with another caller's key", err, codes.PermissionDenied, service.ReasonKeyNotOwned)
		st := status.Convert(err)
		text := st.Message()
		for _, d := range st.Details() {
			b, _ := json.Marshal(d)
			text += string(b)
		}
		for _, leak := range []string{checkout, "SUCCEEDED", "1234", "succeeded", "amount"} {
			if strings.Contains(text, leak) {
				t.Errorf("refusal %q leaks %q", text, leak)
			}
		}
	}
	if r := postREST(t, bi.http, bi.base, validBody("k-checkout"), nil); r.status != http.StatusForbidden || restReason(r) != service.ReasonKeyNotOwned {
		t.Errorf("REST Create with another caller's key = %d %s, want 403 %s", r.status, r.raw, service.ReasonKeyNotOwned)
	}
	if n := len(p.Requests()); n != sent {
		t.Errorf("provider got %d requests for another caller's key, want none", n-sent)
	}
	// The owner still replays its own.
	if resp, err := co.client.CreateMultiCardPayment(t.Context(), validRequest("k-checkout")); err != nil || !resp.GetReplayed() {
		t.Errorf("owner's replay = %v, %v", resp, err)
	}

	// List: a caller lists its own; another caller's records only an
	// admin lists.
	l, err := bi.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{})
	if got := listKeys(l); err != nil || len(got) != 1 || got[0] != "k-billing" {
		t.Errorf("billing's List = %v, %v; want [k-billing]", got, err)
	}
	_, err = bi.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{Caller: checkout})
	checkCode(t, "billing's List of checkout's", err, codes.PermissionDenied, service.ReasonCallerNotAdmin)
	if r := bi.do(t, http.MethodGet, "/v1/multi-card-payments?caller="+url.QueryEscape(checkout), ""); r.status != http.StatusForbidden || restReason(r) != service.ReasonCallerNotAdmin {
		t.Errorf("REST billing's List of checkout's = %d %s", r.status, r.raw)
	}
	l, err = admin.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{View: paymentsv1.ListView_LIST_VIEW_FULL})
	if got := listKeys(l); err != nil || len(got) != 2 {
		t.Errorf("admin's List = %v, %v; want both records", got, err)
	} else if len(l.GetPayments()[0].GetPaymentJson()) == 0 {
		t.Errorf("admin's full List has no payment_json")
	}
	l, err = admin.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{Caller: checkout})
	if got := listKeys(l); err != nil || len(got) != 1 || got[0] != "k-checkout" {
		t.Errorf("admin's List of checkout's = %v, %v", got, err)
	}
}

// TestAdminCallsWithoutMTLS: without identities the admin calls are
// refused, except under --simulate, where everyone may try them.
func TestAdminCallsWithoutMTLS(t *testing.T) {
	t.Parallel()
	in := start(t, sandboxEnv(idempotentProvider(t)))
	_, err := in.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{})
	checkCode(t, "ListMultiCardPayments without mTLS", err, codes.PermissionDenied, service.ReasonCallerNotAdmin)
	_, err = in.client.ResolveMultiCardPayment(t.Context(), &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k",
		Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED, Evidence: "seen"})
	checkCode(t, "ResolveMultiCardPayment without mTLS", err, codes.PermissionDenied, service.ReasonCallerNotAdmin)
	if r := in.get(t, "/v1/multi-card-payments"); r.status != http.StatusForbidden || restReason(r) != service.ReasonCallerNotAdmin {
		t.Errorf("REST list without mTLS = %d %s, want 403", r.status, r.raw)
	}

	sim := start(t, nil, "--simulate")
	if _, err := sim.client.CreateMultiCardPayment(t.Context(), validRequest("k-sim")); err != nil {
		t.Fatal(err)
	}
	l, err := sim.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{})
	if got := listKeys(l); err != nil || len(got) != 1 {
		t.Errorf("--simulate List = %v, %v; want the one record", got, err)
	}
	_, err = sim.client.ResolveMultiCardPayment(t.Context(), &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k-sim",
		Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED, Evidence: "trying it out"})
	checkCode(t, "--simulate Resolve of a succeeded payment", err, codes.FailedPrecondition, service.ReasonRecordNotUnknown)
	_, err = sim.client.ResolveMultiCardPayment(t.Context(), &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k-none",
		Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED, Evidence: "trying it out"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("--simulate Resolve of no record = %v, want NOT_FOUND", err)
	}
}

// TestResolveValidation: the request is checked before anything is read.
func TestResolveValidation(t *testing.T) {
	t.Parallel()
	sim := start(t, nil, "--simulate")
	for name, req := range map[string]*paymentsv1.ResolveMultiCardPaymentRequest{
		"no outcome":         {IdempotencyKey: "k", Evidence: "x"},
		"blank evidence":     {IdempotencyKey: "k", Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED, Evidence: " \n\t "},
		"no evidence":        {IdempotencyKey: "k", Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED},
		"control character":  {IdempotencyKey: "k", Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED, Evidence: "a\x1bb"},
		"evidence too long":  {IdempotencyKey: "k", Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED, Evidence: strings.Repeat("e", 4097)},
		"reply not object":   {IdempotencyKey: "k", Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED, Evidence: "x", ReplyJson: "[1]"},
		"reply with nothing": {IdempotencyKey: "k", Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED, Evidence: "x", ReplyJson: "{}"},
		// Blank by Unicode's categories, not only ASCII's: separators
		// (Z) and invisible characters (C) say nothing.
		"invisible evidence": {IdempotencyKey: "k", Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED, Evidence: "\u200b\u3000\u00a0\ufeff\u2060"},
		"C1 control":         {IdempotencyKey: "k", Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED, Evidence: "pay_1\u0085seen"},
	} {
		_, err := sim.client.ResolveMultiCardPayment(t.Context(), req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: ResolveMultiCardPayment = %v, want INVALID_ARGUMENT", name, err)
		}
	}
	// Evidence in any script, with tabs and newlines, passes validation
	// (there is no such record).
	_, err := sim.client.ResolveMultiCardPayment(t.Context(), &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k",
		Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED, Evidence: "\u3000支払い pay_1\tseen\non the dashboard"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("ResolveMultiCardPayment with readable evidence = %v, want NOT_FOUND (past validation)", err)
	}
}

// TestResolveRefusedWhileInFlight: a person never races paymentsd's own
// sender. While a request with the key is at the provider, a resolution is
// ABORTED with PAYMENT_IN_PROGRESS and changes nothing; once the provider
// has answered 2xx, there is nothing left to resolve.
func TestResolveRefusedWhileInFlight(t *testing.T) {
	t.Parallel()
	p := idempotentProvider(t)
	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.SetScript(func(int, simulator.Request) simulator.Reply {
		once.Do(func() { close(arrived) })
		return simulator.Reply{Wait: release}
	})
	_, ps := mtlsDeployment(t, sandboxEnv(p))
	co, admin := ps["checkout"], ps["oncall"]
	done := make(chan error, 1)
	go func() {
		_, err := co.client.CreateMultiCardPayment(t.Context(), validRequest("k-flight"))
		done <- err
	}()
	<-arrived
	// Refusals are the store answering: no store error is counted.
	storeErrorsBefore := storeErrors(t, admin)
	for _, outcome := range []paymentsv1.ResolutionOutcome{paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED, paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED} {
		_, err := admin.client.ResolveMultiCardPayment(t.Context(), &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k-flight",
			Outcome: outcome, Evidence: "not on the dashboard yet"})
		checkCode(t, "ResolveMultiCardPayment while the request is at the provider", err, codes.Aborted, service.ReasonInProgress)
		if d := retryDelay(status.Convert(err)); d <= 0 {
			t.Errorf("ResolveMultiCardPayment while in flight: RetryInfo %v, want a delay", d)
		}
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("CreateMultiCardPayment = %v, want the provider's answer", err)
	}
	_, err := admin.client.ResolveMultiCardPayment(t.Context(), &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k-flight",
		Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED, Evidence: "too late"})
	checkCode(t, "ResolveMultiCardPayment after a 2xx", err, codes.FailedPrecondition, service.ReasonRecordNotUnknown)
	if after := storeErrors(t, admin); !maps.Equal(after, storeErrorsBefore) {
		t.Errorf("paymentsd_store_errors_total after refused resolves = %v, want unchanged %v", after, storeErrorsBefore)
	}
	got, err := admin.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-flight"})
	if err != nil || got.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED || len(got.GetAuditEntries()) != 0 {
		t.Errorf("GetMultiCardPayment = %v with %d audit entries, %v; want SUCCEEDED and none", got.GetState(), len(got.GetAuditEntries()), err)
	}
	if n := len(p.Requests()); n != 1 {
		t.Errorf("provider got %d requests, want 1", n)
	}
}

// TestListPageTokens: tokens are opaque, bound to their filters, and a
// tampered one is refused rather than misread.
func TestListPageTokens(t *testing.T) {
	t.Parallel()
	sim := start(t, nil, "--simulate")
	for _, k := range []string{"k-a", "k-b", "k-c"} {
		if _, err := sim.client.CreateMultiCardPayment(t.Context(), validRequest(k)); err != nil {
			t.Fatal(err)
		}
	}
	var keys []string
	req := &paymentsv1.ListMultiCardPaymentsRequest{PageSize: 2}
	for pages := 0; ; pages++ {
		resp, err := sim.client.ListMultiCardPayments(t.Context(), req)
		if err != nil {
			t.Fatalf("ListMultiCardPayments(%v) = %v", req, err)
		}
		keys = append(keys, listKeys(resp)...)
		if resp.GetNextPageToken() == "" {
			break
		}
		if pages > 3 {
			t.Fatal("no end to the pages")
		}
		req.PageToken = resp.GetNextPageToken()
	}
	if strings.Join(keys, ",") != "k-a,k-b,k-c" {
		t.Errorf("pages = %v, want k-a,k-b,k-c", keys)
	}
	first, err := sim.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	tok := first.GetNextPageToken()
	for name, req := range map[string]*paymentsv1.ListMultiCardPaymentsRequest{
		"other view":   {PageSize: 1, PageToken: tok, View: paymentsv1.ListView_LIST_VIEW_FULL},
		"other state":  {PageSize: 1, PageToken: tok, State: []paymentsv1.PaymentState{paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED}},
		"other caller": {PageSize: 1, PageToken: tok, Caller: "someone"},
		"not base64":   {PageSize: 1, PageToken: "!!!"},
		"truncated":    {PageSize: 1, PageToken: tok[:10]},
	} {
		_, err := sim.client.ListMultiCardPayments(t.Context(), req)
		checkCode(t, "ListMultiCardPayments with "+name+" token", err, codes.InvalidArgument, service.ReasonPageTokenInvalid)
	}
	// Another page size is the same filter.
	if _, err := sim.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{PageSize: 5, PageToken: tok}); err != nil {
		t.Errorf("ListMultiCardPayments with another page size = %v", err)
	}
	for name, req := range map[string]*paymentsv1.ListMultiCardPaymentsRequest{
		"page size over 1000": {PageSize: 1001},
		"unspecified state":   {State: []paymentsv1.PaymentState{paymentsv1.PaymentState_PAYMENT_STATE_UNSPECIFIED}},
		"empty time range":    {CreatedAfter: timestamppb.Now(), CreatedBefore: timestamppb.New(time.Now().Add(-time.Hour))},
	} {
		_, err := sim.client.ListMultiCardPayments(t.Context(), req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("ListMultiCardPayments(%s) = %v, want INVALID_ARGUMENT", name, err)
		}
	}
}

func TestAdminCallersNeedClientCA(t *testing.T) {
	t.Parallel()
	for name, v := range map[string]string{"set": oncall, "only commas": " , ,"} {
		env := with(map[string]string{"PAYMENTS_SANDBOX_BASE_URL": "http://127.0.0.1:1/v1", "PAYMENTS_SANDBOX_API_KEY": sandboxKey},
			"PAYMENTS_ADMIN_CALLERS", v)
		_, err := loadConfig([]string{"paymentsd"}, envList(env))
		if err == nil || !strings.Contains(err.Error(), "PAYMENTS_ADMIN_CALLERS") {
			t.Errorf("%s: loadConfig(PAYMENTS_ADMIN_CALLERS without PAYMENTS_TLS_CLIENT_CA_FILE) = %v, want an error naming it", name, err)
		}
	}
}

// resolveWhenQuiet resolves req, first waiting out the quiet period of
// settlement's last request (ABORTED, PAYMENT_IN_PROGRESS, with a
// RetryInfo), which may outlast the "gave up" log line.
func resolveWhenQuiet(t *testing.T, c paymentsv1.PaymentsServiceClient, req *paymentsv1.ResolveMultiCardPaymentRequest) (*paymentsv1.ResolveMultiCardPaymentResponse, error) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; {
		res, err := c.ResolveMultiCardPayment(t.Context(), req)
		st := status.Convert(err)
		if st.Code() != codes.Aborted || time.Now().After(end) {
			return res, err
		}
		wait := 100 * time.Millisecond
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				wait = ri.GetRetryDelay().AsDuration()
			}
		}
		time.Sleep(wait) // the RetryInfo's delay, as a caller would
	}
}

// TestAuditActorIsTheAdminIdentity: a certificate names one identity, so
// one whose URI SAN is an ordinary caller's and whose DNS SAN is an
// admin's is that ordinary caller, and no admin; an admin's resolution is
// recorded under its identity exactly.
func TestAuditActorIsTheAdminIdentity(t *testing.T) {
	t.Parallel()
	const adminDNS = "oncall.ops.corp.example"
	p := idempotentProvider(t)
	p.SetScript(simulator.Always(simulator.Reply{Fault: simulator.Reset}))
	env := with(sandboxEnv(p),
		"PAYMENTS_UPSTREAM_MAX_ATTEMPTS", "1",
		"PAYMENTS_UPSTREAM_BREAKER_FAILURES", "1000",
		"PAYMENTS_SETTLEMENT_WINDOW", "1500ms",
		"PAYMENTS_UPSTREAM_TIMEOUT", "500ms",
		"PAYMENTS_PROVIDER_QUIET_PERIOD", "1s",
	)
	serverCA, clientCA := newTestCA(t, "server CA"), newTestCA(t, "client CA")
	certFile, keyFile := writePEMFiles(t, serverCA.issue(t, x509.ExtKeyUsageServerAuth))
	clientCAFile := filepath.Join(t.TempDir(), "client-ca.pem")
	os.WriteFile(clientCAFile, clientCA.pem, 0o600)
	in := start(t, with(env, "PAYMENTS_TLS_CERT_FILE", certFile, "PAYMENTS_TLS_KEY_FILE", keyFile,
		"PAYMENTS_TLS_CLIENT_CA_FILE", clientCAFile,
		"PAYMENTS_ALLOWED_CALLERS", checkout,
		"PAYMENTS_ADMIN_CALLERS", "dns:"+adminDNS))
	co := newParty(t, in, serverCA, clientCA.issueClient(t, []string{checkout}, nil), "checkout")
	// A certificate naming checkout first and the admin DNS name after it.
	both := newParty(t, in, serverCA, clientCA.issueClient(t, []string{checkout}, []string{adminDNS}), "both")
	admin := newParty(t, in, serverCA, clientCA.issueClient(t, nil, []string{adminDNS}), "admin")

	const gaveUp = "settlement window closed with the payment's outcome unknown; check the provider's dashboard"
	_, err := co.client.CreateMultiCardPayment(t.Context(), validRequest("k-actor"))
	checkReason(t, status.Convert(err), "PAYMENT_OUTCOME_UNKNOWN")
	in.logs.waitFor(t, gaveUp, nil)

	req := &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k-actor",
		Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED, Evidence: "not on the provider's dashboard"}
	_, err = both.client.ResolveMultiCardPayment(t.Context(), req)
	checkCode(t, "ResolveMultiCardPayment by a certificate whose URI SAN is checkout's and DNS SAN an admin's", err, codes.PermissionDenied, service.ReasonCallerNotAdmin)
	res, err := resolveWhenQuiet(t, admin.client, req)
	if err != nil {
		t.Fatalf("ResolveMultiCardPayment by a DNS-name admin = %v", err)
	}
	if actor := res.GetAuditEntry().GetActor(); actor != "dns:"+adminDNS {
		t.Errorf("audit entry actor = %q; want the admin's identity, %q", actor, "dns:"+adminDNS)
	}
	got, err := co.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-actor"})
	if err != nil || len(got.GetAuditEntries()) != 1 || got.GetAuditEntries()[0].GetActor() != "dns:"+adminDNS {
		t.Errorf("GetMultiCardPayment = %v, %v; want the one audit entry, actor %q", got.GetAuditEntries(), err, "dns:"+adminDNS)
	}
}

// TestListTimesOutOfRange: a creation bound, or a page token's position,
// outside protobuf's timestamps (years 1 to 9999) is INVALID_ARGUMENT on
// both backends: SQLite's microseconds would overflow and answer the
// wrong records, and PostgreSQL would refuse it as a store failure.
func TestListTimesOutOfRange(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{}
			if backend == "postgres" {
				env["PAYMENTS_DATABASE_URL"] = storetest.PostgresURL(t)
			}
			sim := start(t, env, "--simulate")
			for _, k := range []string{"k-a", "k-b"} {
				if _, err := sim.client.CreateMultiCardPayment(t.Context(), validRequest(k)); err != nil {
					t.Fatal(err)
				}
			}
			for _, ts := range []*timestamppb.Timestamp{{Seconds: 1 << 62}, {Seconds: -1 << 40}, {Seconds: 1, Nanos: -5}} {
				for name, req := range map[string]*paymentsv1.ListMultiCardPaymentsRequest{
					"created_after":  {CreatedAfter: ts},
					"created_before": {CreatedBefore: ts},
				} {
					l, err := sim.client.ListMultiCardPayments(t.Context(), req)
					if status.Code(err) != codes.InvalidArgument {
						t.Errorf("ListMultiCardPayments(%s %v) = %v, %v; want INVALID_ARGUMENT", name, ts, listKeys(l), err)
					}
				}
			}
			first, err := sim.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{PageSize: 1})
			if err != nil {
				t.Fatal(err)
			}
			b, err := base64.RawURLEncoding.DecodeString(first.GetNextPageToken())
			if err != nil || len(b) < 17 {
				t.Fatalf("page token %q: %v", first.GetNextPageToken(), err)
			}
			for _, micros := range []int64{-1 << 62, 1 << 62} {
				binary.BigEndian.PutUint64(b[9:17], uint64(micros))
				_, err := sim.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{PageSize: 1,
					PageToken: base64.RawURLEncoding.EncodeToString(b)})
				checkCode(t, "ListMultiCardPayments with a token positioned out of range", err, codes.InvalidArgument, service.ReasonPageTokenInvalid)
			}
		})
	}
}

// TestResolvedOnlyUntilTheNextAttempt: a payment resolved NOT_CREATED
// whose next attempt leaves it in doubt again is not "resolved" in the
// list (nor in the CLI's notes or the export), so on call does not pass it
// over; its audit trail still shows the earlier resolution.
func TestResolvedOnlyUntilTheNextAttempt(t *testing.T) {
	t.Parallel()
	p := idempotentProvider(t)
	p.SetScript(simulator.Always(simulator.Reply{Fault: simulator.Reset}))
	env := with(sandboxEnv(p),
		"PAYMENTS_UPSTREAM_MAX_ATTEMPTS", "1",
		"PAYMENTS_UPSTREAM_BREAKER_FAILURES", "1000",
		"PAYMENTS_SETTLEMENT_WINDOW", "1500ms",
		"PAYMENTS_UPSTREAM_TIMEOUT", "500ms",
		"PAYMENTS_PROVIDER_QUIET_PERIOD", "1s",
	)
	in, ps := mtlsDeployment(t, env)
	co, admin := ps["checkout"], ps["oncall"]
	const gaveUp = "settlement window closed with the payment's outcome unknown; check the provider's dashboard"
	_, err := co.client.CreateMultiCardPayment(t.Context(), validRequest("k-again"))
	checkReason(t, status.Convert(err), "PAYMENT_OUTCOME_UNKNOWN")
	in.logs.waitFor(t, gaveUp, nil)
	if _, err := resolveWhenQuiet(t, admin.client, &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k-again",
		Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED, Evidence: "not on the provider's dashboard"}); err != nil {
		t.Fatal(err)
	}
	list := func() *paymentsv1.MultiCardPaymentSummary {
		t.Helper()
		l, err := admin.client.ListMultiCardPayments(t.Context(), &paymentsv1.ListMultiCardPaymentsRequest{})
		if err != nil || len(l.GetPayments()) != 1 {
			t.Fatalf("ListMultiCardPayments = %v, %v; want the one payment", l, err)
		}
		return l.GetPayments()[0]
	}
	if s := list(); !s.GetResolved() || s.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED {
		t.Errorf("summary after NOT_CREATED = %v; want resolved and NOT_CREATED", s)
	}

	// The caller tries again; the provider still resets: in doubt again.
	_, err = co.client.CreateMultiCardPayment(t.Context(), validRequest("k-again"))
	checkReason(t, status.Convert(err), "PAYMENT_OUTCOME_UNKNOWN")
	// An unknown outcome is answered before its record commits: wait for
	// the record to leave IN_PROGRESS.
	s := list()
	for end := time.Now().Add(10 * time.Second); s.GetState() == paymentsv1.PaymentState_PAYMENT_STATE_IN_PROGRESS && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond) // polling the record, as waitForState does: its commit has no other signal
		s = list()
	}
	if s.GetResolved() || s.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN {
		t.Errorf("summary after a new attempt left it unknown = %v; want OUTCOME_UNKNOWN and not resolved", s)
	}
	got, err := admin.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-again"})
	if err != nil || len(got.GetAuditEntries()) != 1 {
		t.Errorf("GetMultiCardPayment = %d audit entries, %v; want the earlier resolution", len(got.GetAuditEntries()), err)
	}
}

// TestResolveRefusedIfChangedSinceLookedUp: a resolution made with the
// record's update_time as the person saw it changes nothing if the record
// has changed since (a retry or settlement sent the key: the dashboard
// they checked may be out of date), over gRPC and REST; with the current
// one it goes through.
func TestResolveRefusedIfChangedSinceLookedUp(t *testing.T) {
	t.Parallel()
	p := idempotentProvider(t)
	p.SetScript(simulator.Always(simulator.Reply{Fault: simulator.Reset}))
	env := with(sandboxEnv(p),
		"PAYMENTS_UPSTREAM_MAX_ATTEMPTS", "1",
		"PAYMENTS_UPSTREAM_BREAKER_FAILURES", "1000",
		"PAYMENTS_SETTLEMENT_WINDOW", "1500ms",
		"PAYMENTS_UPSTREAM_TIMEOUT", "500ms",
		"PAYMENTS_PROVIDER_QUIET_PERIOD", "1s",
	)
	in, ps := mtlsDeployment(t, env)
	co, admin := ps["checkout"], ps["oncall"]
	const gaveUp = "settlement window closed with the payment's outcome unknown; check the provider's dashboard"
	_, err := co.client.CreateMultiCardPayment(t.Context(), validRequest("k-stale"))
	checkReason(t, status.Convert(err), "PAYMENT_OUTCOME_UNKNOWN")
	in.logs.waitFor(t, gaveUp, nil)
	seen, err := admin.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-stale"})
	if err != nil {
		t.Fatal(err)
	}
	// An earlier look: the record has been updated since.
	earlier := timestamppb.New(seen.GetUpdateTime().AsTime().Add(-time.Millisecond))
	req := &paymentsv1.ResolveMultiCardPaymentRequest{IdempotencyKey: "k-stale",
		Outcome: paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_NOT_CREATED, Evidence: "not on the dashboard", ExpectedUpdateTime: earlier}
	_, err = resolveWhenQuiet(t, admin.client, req)
	checkCode(t, "ResolveMultiCardPayment after the record changed", err, codes.FailedPrecondition, service.ReasonRecordChanged)
	body := `{"idempotencyKey":"k-stale","outcome":"RESOLUTION_OUTCOME_NOT_CREATED","evidence":"not on the dashboard","expectedUpdateTime":"` +
		earlier.AsTime().Format(time.RFC3339Nano) + `"}`
	if r := admin.do(t, http.MethodPost, "/v1/multi-card-payments:resolve", body); r.status != http.StatusUnprocessableEntity || restReason(r) != service.ReasonRecordChanged {
		t.Errorf("REST resolve after the record changed = %d %s, want 422 %s", r.status, r.raw, service.ReasonRecordChanged)
	}
	got, err := admin.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-stale"})
	if err != nil || got.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN || len(got.GetAuditEntries()) != 0 {
		t.Fatalf("GetMultiCardPayment after refusals = %v, %d audit entries, %v; want unchanged", got.GetState(), len(got.GetAuditEntries()), err)
	}
	req.ExpectedUpdateTime = seen.GetUpdateTime()
	if res, err := admin.client.ResolveMultiCardPayment(t.Context(), req); err != nil || res.GetPayment().GetState() != paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED {
		t.Errorf("ResolveMultiCardPayment with the update time seen = %v, %v; want NOT_CREATED", res, err)
	}
}
