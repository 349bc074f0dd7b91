package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
)

// nestedReply is a provider reply with every JSON kind in it.
const nestedReply = `{"id":"pay_1","status":"COMPLETED","amountMoney":{"currency":"EUR","amount":1250},` +
	`"cards":[{"last4":"4242","split":{"amount":1000}},{"last4":"0005","split":{"amount":250}}],` +
	`"note":"Grüße, 支払い ✓","flags":[true,false,null],"empty":{},"none":null,"ratio":0.25}`

func TestCreatePaymentReachesProviderExactly(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	in := start(t, sandboxEnv(p))

	const bigAmount = int64(1)<<53 + 1 // 9007199254740993: not exact as a float64
	tests := []struct {
		name string
		call func(t *testing.T, key string)
	}{
		{"gRPC", func(t *testing.T, key string) {
			req := &paymentsv1.CreateMultiCardPaymentRequest{
				AmountMoney:    &paymentsv1.Money{Currency: "USD", Amount: bigAmount},
				IdempotencyKey: key,
			}
			if _, err := in.client.CreateMultiCardPayment(t.Context(), req); err != nil {
				t.Fatalf("CreateMultiCardPayment(%v) = %v, want OK", req, err)
			}
		}},
		{"REST", func(t *testing.T, key string) {
			body := `{"amountMoney":{"currency":"USD","amount":"9007199254740993"},"idempotencyKey":"` + key + `"}`
			if r := in.rest(t, body, nil); r.status != http.StatusOK {
				t.Fatalf("POST %s = %d %s, want 200", body, r.status, r.raw)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "idem-" + tt.name
			before := len(p.Requests())
			tt.call(t, key)
			reqs := p.Requests()[before:]
			if len(reqs) != 1 {
				t.Fatalf("provider saw %d requests, want 1", len(reqs))
			}
			got := reqs[0]
			if got.Method != http.MethodPost || got.Path != "/v1/multi-card-payments" {
				t.Errorf("provider saw %s %s, want POST /v1/multi-card-payments", got.Method, got.Path)
			}
			for h, want := range map[string]string{
				"X-Api-Key":    sandboxKey,
				"Content-Type": "application/json",
				"Accept":       "application/json",
			} {
				if v := got.Header.Values(h); len(v) != 1 || v[0] != want {
					t.Errorf("provider saw header %s = %q, want %q", h, v, want)
				}
			}
			want := `{"amountMoney":{"currency":"USD","amount":9007199254740993},"idempotencyKey":"` + key + `"}`
			if string(got.Body) != want {
				t.Errorf("provider saw body\n%s\nwant\n%s", got.Body, want)
			}
		})
	}
}

func TestReplyPassesThrough(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	p.SetScript(simulator.Always(simulator.Reply{Status: http.StatusCreated, Body: []byte(nestedReply)}))
	in := start(t, sandboxEnv(p))

	want := &structpb.Struct{}
	if err := protojson.Unmarshal([]byte(nestedReply), want); err != nil {
		t.Fatal(err)
	}

	resp, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-pass"))
	if err != nil {
		t.Fatalf("CreateMultiCardPayment() = %v, want OK", err)
	}
	if diff := cmp.Diff(want, resp.GetPayment(), protocmp.Transform()); diff != "" {
		t.Errorf("gRPC payment differs from the provider's reply (-want +got):\n%s", diff)
	}
	if resp.GetProviderHttpStatus() != http.StatusCreated || resp.GetEnvironment() != paymentsv1.Environment_ENVIRONMENT_SANDBOX {
		t.Errorf("gRPC reply status, environment = %d, %v, want 201, SANDBOX", resp.GetProviderHttpStatus(), resp.GetEnvironment())
	}

	r := in.rest(t, validBody("k-pass-rest"), nil)
	if r.status != http.StatusOK {
		t.Fatalf("REST status = %d %s, want 200", r.status, r.raw)
	}
	var restReply struct {
		Payment json.RawMessage `json:"payment"`
	}
	if err := json.Unmarshal(r.raw, &restReply); err != nil {
		t.Fatalf("REST reply is not JSON: %v", err)
	}
	var gotJSON, wantJSON any
	json.Unmarshal(restReply.Payment, &gotJSON)
	json.Unmarshal([]byte(nestedReply), &wantJSON)
	if diff := cmp.Diff(wantJSON, gotJSON); diff != "" {
		t.Errorf("REST payment differs from the provider's reply (-want +got):\n%s", diff)
	}
}

func TestEnvironmentSelection(t *testing.T) {
	t.Parallel()
	tests := []struct {
		env     string
		wantKey string
		wantEnv paymentsv1.Environment
	}{
		{"sandbox", sandboxKey, paymentsv1.Environment_ENVIRONMENT_SANDBOX},
		{"live", liveKey, paymentsv1.Environment_ENVIRONMENT_LIVE},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			t.Parallel()
			sandbox, live := fakeProvider(t, "sandbox"), fakeProvider(t, "live")
			// Both environments are configured; only the selected one may
			// be used.
			env := with(liveEnv(t, live),
				"PAYMENTS_ENVIRONMENT", tt.env,
				"PAYMENTS_SANDBOX_BASE_URL", sandbox.URL,
				"PAYMENTS_SANDBOX_API_KEY", sandboxKey,
			)
			in := start(t, env)
			resp, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-env"))
			if err != nil {
				t.Fatalf("CreateMultiCardPayment() = %v, want OK", err)
			}
			if resp.GetEnvironment() != tt.wantEnv {
				t.Errorf("environment = %v, want %v", resp.GetEnvironment(), tt.wantEnv)
			}
			selected, other := sandbox, live
			if tt.env == "live" {
				selected, other = live, sandbox
			}
			if n := len(other.Requests()); n != 0 {
				t.Errorf("the other environment's provider saw %d requests, want 0", n)
			}
			reqs := selected.Requests()
			if len(reqs) != 1 || reqs[0].Header.Get("X-Api-Key") != tt.wantKey {
				t.Errorf("selected provider saw %d requests with key %q, want 1 with the %s key", len(reqs), keyOf(reqs), tt.env)
			}
		})
	}
}

func keyOf(reqs []simulator.Request) string {
	if len(reqs) == 0 {
		return ""
	}
	return reqs[0].Header.Get("X-Api-Key")
}

func TestProviderAuthErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		key        string
		wantCode   codes.Code
		wantStatus int
	}{
		{"unknown key", "sk_sandbox_revoked_or_unknown", codes.Unauthenticated, http.StatusUnauthorized},
		{"other environment's key", liveKey, codes.PermissionDenied, http.StatusForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := fakeProvider(t, "sandbox")
			in := start(t, with(sandboxEnv(p), "PAYMENTS_SANDBOX_API_KEY", tt.key))

			_, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-auth"))
			st := status.Convert(err)
			if st.Code() != tt.wantCode {
				t.Errorf("CreateMultiCardPayment() code = %v, want %v (%v)", st.Code(), tt.wantCode, err)
			}
			checkProviderError(t, st, tt.wantStatus)
			checkReason(t, st, "PAYMENT_NOT_CREATED")

			r := in.rest(t, validBody("k-auth-rest"), nil)
			if r.status != tt.wantStatus {
				t.Errorf("REST status = %d, want %d (%s)", r.status, tt.wantStatus, r.raw)
			}
			if got := len(p.Requests()); got != 2 {
				t.Errorf("provider saw %d requests, want 2: 401 and 403 are not retried", got)
			}
		})
	}
}

// checkProviderError checks that st carries the provider's HTTP status and
// body as a ProviderError detail.
func checkProviderError(t *testing.T, st *status.Status, wantHTTP int) {
	t.Helper()
	for _, d := range st.Details() {
		if pe, ok := d.(*paymentsv1.ProviderError); ok {
			if int(pe.GetHttpStatus()) != wantHTTP || pe.GetBody() == "" {
				t.Errorf("ProviderError = %v, want http_status %d and the provider's body", pe, wantHTTP)
			}
			return
		}
	}
	t.Errorf("status %v has no ProviderError detail", st.Proto())
}

func checkReason(t *testing.T, st *status.Status, want string) {
	t.Helper()
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			if info.GetReason() != want || info.GetDomain() != "paymentsd.example.com" {
				t.Errorf("ErrorInfo = %v, want reason %s", info, want)
			}
			return
		}
	}
	t.Errorf("status %v has no ErrorInfo detail", st.Proto())
}

func TestValidation(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	in := start(t, sandboxEnv(p))

	tests := []struct {
		name      string
		req       *paymentsv1.CreateMultiCardPaymentRequest
		body      string // the same request over REST
		wantField string // the violation's field path
	}{
		{
			name:      "amountMoney missing",
			req:       &paymentsv1.CreateMultiCardPaymentRequest{IdempotencyKey: "k"},
			body:      `{"idempotencyKey":"k"}`,
			wantField: "amount_money",
		},
		{
			name:      "currency empty",
			req:       &paymentsv1.CreateMultiCardPaymentRequest{AmountMoney: &paymentsv1.Money{Amount: 1}, IdempotencyKey: "k"},
			body:      `{"amountMoney":{"currency":"","amount":1},"idempotencyKey":"k"}`,
			wantField: "amount_money.currency",
		},
		{
			name:      "currency lower case",
			req:       &paymentsv1.CreateMultiCardPaymentRequest{AmountMoney: &paymentsv1.Money{Currency: "usd", Amount: 1}, IdempotencyKey: "k"},
			body:      `{"amountMoney":{"currency":"usd","amount":1},"idempotencyKey":"k"}`,
			wantField: "amount_money.currency",
		},
		{
			name:      "currency with a digit",
			req:       &paymentsv1.CreateMultiCardPaymentRequest{AmountMoney: &paymentsv1.Money{Currency: "US1", Amount: 1}, IdempotencyKey: "k"},
			body:      `{"amountMoney":{"currency":"US1","amount":1},"idempotencyKey":"k"}`,
			wantField: "amount_money.currency",
		},
		{
			name:      "currency with a non-ASCII letter",
			req:       &paymentsv1.CreateMultiCardPaymentRequest{AmountMoney: &paymentsv1.Money{Currency: "ÜSD", Amount: 1}, IdempotencyKey: "k"},
			body:      `{"amountMoney":{"currency":"ÜSD","amount":1},"idempotencyKey":"k"}`,
			wantField: "amount_money.currency",
		},
		{
			name:      "idempotency key missing",
			req:       &paymentsv1.CreateMultiCardPaymentRequest{AmountMoney: &paymentsv1.Money{Currency: "USD", Amount: 1}},
			body:      `{"amountMoney":{"currency":"USD","amount":1}}`,
			wantField: "idempotency_key",
		},
		{
			name:      "idempotency key empty",
			req:       &paymentsv1.CreateMultiCardPaymentRequest{AmountMoney: &paymentsv1.Money{Currency: "USD", Amount: 1}, IdempotencyKey: ""},
			body:      `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":""}`,
			wantField: "idempotency_key",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name+"/gRPC", func(t *testing.T) {
			_, err := in.client.CreateMultiCardPayment(t.Context(), tt.req)
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument {
				t.Fatalf("CreateMultiCardPayment(%v) code = %v, want InvalidArgument", tt.req, st.Code())
			}
			if got := violatedFields(st); !contains(got, tt.wantField) {
				t.Errorf("CreateMultiCardPayment(%v) violations name %q, want %q", tt.req, got, tt.wantField)
			}
			// Validation reads no record: this call sent nothing, and
			// that is all it can say.
			checkReason(t, st, "REQUEST_NOT_SENT")
		})
		t.Run(tt.name+"/REST", func(t *testing.T) {
			r := in.rest(t, tt.body, nil)
			if r.status != http.StatusBadRequest {
				t.Fatalf("POST %s = %d, want 400", tt.body, r.status)
			}
			if !bytes.Contains(r.raw, []byte(`"field":"`+tt.wantField+`"`)) {
				t.Errorf("POST %s reply %s does not name the field %s", tt.body, r.raw, tt.wantField)
			}
			if got := restReason(r); got != "REQUEST_NOT_SENT" {
				t.Errorf("POST %s reason = %q, want REQUEST_NOT_SENT", tt.body, got)
			}
		})
	}
	if n := len(p.Requests()); n != 0 {
		t.Errorf("provider saw %d requests for invalid payments, want 0", n)
	}
}

// violatedFields returns the field paths of st's google.rpc.BadRequest
// field violations.
func violatedFields(st *status.Status) []string {
	var out []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				out = append(out, v.GetField())
			}
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func TestRESTRejectsBadBodies(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	in := start(t, with(sandboxEnv(p), "PAYMENTS_MAX_REQUEST_BYTES", "2048"))

	tests := []struct {
		name       string
		body       string
		wantStatus int
		wantInBody string
	}{
		{"not JSON", `amountMoney=USD`, http.StatusBadRequest, ""},
		{"JSON array", `[1,2]`, http.StatusBadRequest, ""},
		{"truncated", `{"amountMoney":{"currency":"USD"`, http.StatusBadRequest, ""},
		{"unknown field", `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"k","amountMony":1}`, http.StatusBadRequest, "amountMony"},
		{"unknown nested field", `{"amountMoney":{"currency":"USD","amount":1,"cents":5},"idempotencyKey":"k"}`, http.StatusBadRequest, "cents"},
		{"amount not a whole number", `{"amountMoney":{"currency":"USD","amount":1.5},"idempotencyKey":"k"}`, http.StatusBadRequest, ""},
		{"over the size limit", `{"amountMoney":{"currency":"USD","amount":1},"idempotencyKey":"` + strings.Repeat("k", 4096) + `"}`, http.StatusRequestEntityTooLarge, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := in.rest(t, tt.body, nil)
			if r.status != tt.wantStatus {
				t.Errorf("POST %.60s = %d, want %d", tt.body, r.status, tt.wantStatus)
			}
			if tt.wantInBody != "" && !bytes.Contains(r.raw, []byte(tt.wantInBody)) {
				t.Errorf("POST %.60s reply %s does not name %q", tt.body, r.raw, tt.wantInBody)
			}
		})
	}
	if n := len(p.Requests()); n != 0 {
		t.Errorf("provider saw %d requests, want 0", n)
	}
}

func TestProviderStatusMapping(t *testing.T) {
	t.Parallel()
	tests := []struct {
		provider   int
		wantCode   codes.Code
		wantStatus int
	}{
		{400, codes.InvalidArgument, 400},
		{401, codes.Unauthenticated, 401},
		{403, codes.PermissionDenied, 403},
		{404, codes.NotFound, 404},
		{405, codes.InvalidArgument, 400},
		{409, codes.Aborted, 409},
		{418, codes.InvalidArgument, 400}, // unlisted 4xx: by class
		{422, codes.InvalidArgument, 400},
		{429, codes.ResourceExhausted, 429},
		{302, codes.Unknown, 500}, // never followed
		{307, codes.Unknown, 500},
		{500, codes.Internal, 500},
		{501, codes.Unimplemented, 501},
		{502, codes.Unavailable, 503},
		{503, codes.Unavailable, 503},
		{504, codes.DeadlineExceeded, 504},
		{599, codes.Internal, 500}, // unlisted 5xx: by class
	}
	p := fakeProvider(t, "sandbox")
	in := start(t, with(sandboxEnv(p),
		"PAYMENTS_UPSTREAM_MAX_ATTEMPTS", "1",
		"PAYMENTS_UPSTREAM_BREAKER_FAILURES", "1000", // every 5xx here is scripted
	))
	for _, tt := range tests {
		t.Run(http.StatusText(tt.provider), func(t *testing.T) {
			reply := simulator.Reply{Status: tt.provider, Body: []byte(`{"error":"scripted"}`)}
			p.SetScript(simulator.Always(reply))

			_, err := in.client.CreateMultiCardPayment(t.Context(), validRequest(fmt.Sprint("k-map-", tt.provider)))
			st := status.Convert(err)
			if st.Code() != tt.wantCode {
				t.Errorf("provider %d: code = %v, want %v", tt.provider, st.Code(), tt.wantCode)
			}
			checkProviderError(t, st, tt.provider)
			// Only refusals that prove the request was not acted on
			// say not created; 409 (same key in flight), 422, unknown
			// 4xx, 3xx and 5xx may have created a payment.
			wantReason := "PAYMENT_OUTCOME_UNKNOWN"
			switch tt.provider {
			case 400, 401, 403, 404, 405, 429:
				wantReason = "PAYMENT_NOT_CREATED"
			}
			checkReason(t, st, wantReason)

			r := in.rest(t, validBody(fmt.Sprint("k-map-rest-", tt.provider)), nil)
			if r.status != tt.wantStatus {
				t.Errorf("provider %d: REST status = %d, want %d", tt.provider, r.status, tt.wantStatus)
			}
		})
	}
}

func TestKeyFromFile(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	keyFile := filepath.Join(t.TempDir(), "api-key")
	// A byte-order mark and CRLF, as some editors write.
	if err := os.WriteFile(keyFile, []byte("\uFEFF\r\n  "+sandboxKey+"\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	in := start(t, map[string]string{
		"PAYMENTS_SANDBOX_BASE_URL":     p.URL,
		"PAYMENTS_SANDBOX_API_KEY_FILE": keyFile,
	})
	if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-file")); err != nil {
		t.Fatalf("CreateMultiCardPayment() = %v, want OK with the key from the file", err)
	}
	if got := keyOf(p.Requests()); got != sandboxKey {
		t.Errorf("provider saw key %q, want the file's key with the BOM and whitespace trimmed", got)
	}
}

func TestStartupLogRedactsKey(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	in := start(t, sandboxEnv(p))
	in.client.CreateMultiCardPayment(t.Context(), validRequest("k-log"))
	if err := in.stop(); err != nil {
		t.Fatalf("run() = %v, want nil", err)
	}

	starting := in.logs.lines("starting")
	if len(starting) != 1 {
		t.Fatalf("logged %d starting lines, want 1", len(starting))
	}
	cfg, _ := starting[0]["config"].(map[string]any)
	if cfg["api_key"] != "[REDACTED]" || cfg["base_url"] != p.URL || cfg["environment"] != "sandbox" {
		t.Errorf("starting line config = %v, want the effective config with api_key [REDACTED]", cfg)
	}
	if len(in.logs.lines("stopped")) != 1 {
		t.Errorf("no stopped line at shutdown")
	}
	if strings.Contains(in.logs.String(), sandboxKey) {
		t.Errorf("logs contain the API key")
	}
}

func TestSimulate(t *testing.T) {
	t.Parallel()
	in := start(t, nil, "--simulate")

	resp, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-sim"))
	if err != nil {
		t.Fatalf("CreateMultiCardPayment() = %v, want OK from the simulator", err)
	}
	if resp.GetPayment().GetFields()["simulated"].GetBoolValue() != true {
		t.Errorf("simulated reply = %v, want it marked simulated", resp.GetPayment())
	}
	r := in.rest(t, validBody("k-sim-rest"), nil)
	payment, _ := r.body["payment"].(map[string]any)
	if r.status != http.StatusOK || payment["simulated"] != true {
		t.Errorf("REST simulated reply = %d %s, want 200 marked simulated", r.status, r.raw)
	}
}

func TestRequestID(t *testing.T) {
	t.Parallel()
	p := fakeProvider(t, "sandbox")
	in := start(t, sandboxEnv(p))

	var header metadata.MD
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-request-id", "caller-req-1")
	if _, err := in.client.CreateMultiCardPayment(ctx, validRequest("k-rid"), grpc.Header(&header)); err != nil {
		t.Fatal(err)
	}
	if got := header.Get("x-request-id"); len(got) != 1 || got[0] != "caller-req-1" {
		t.Errorf("gRPC x-request-id = %q, want the caller's", got)
	}
	r := in.rest(t, validBody("k-rid-rest"), http.Header{"X-Request-Id": {"caller-req-2"}})
	if got := r.header.Get("X-Request-Id"); got != "caller-req-2" {
		t.Errorf("REST X-Request-Id = %q, want the caller's", got)
	}
	r = in.rest(t, `{}`, nil)
	if got := r.header.Get("X-Request-Id"); len(got) < 16 {
		t.Errorf("REST X-Request-Id = %q on an error without one from the caller, want a generated ID", got)
	}
	// The log names the callers' IDs beside paymentsd's own, which every
	// call has.
	callers := map[string]bool{}
	for _, line := range in.logs.lines("call") {
		if id, _ := line["request_id"].(string); len(id) != 32 {
			t.Errorf("call line request_id = %q, want paymentsd's own", id)
		}
		if id, ok := line["caller_request_id"].(string); ok {
			callers[id] = true
		}
	}
	if !callers["caller-req-1"] || !callers["caller-req-2"] {
		t.Errorf("call log lines have caller request IDs %v, want the callers'", callers)
	}
	if len(callers) != 2 {
		t.Errorf("call log lines have caller request IDs %v, want only the two the callers sent", callers)
	}

	// A REST call that sends none is answered with paymentsd's own ID,
	// the one its call line and record carry; nothing is the caller's.
	r = in.rest(t, validBody("k-rid-own"), nil)
	own := r.header.Get("X-Request-Id")
	rec, err := in.client.GetMultiCardPayment(t.Context(), &paymentsv1.GetMultiCardPaymentRequest{IdempotencyKey: "k-rid-own"})
	if err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusOK || own == "" || rec.GetRequestId() != own {
		t.Errorf("REST without X-Request-Id: %d, header %q, record's request_id %q; want 200 and the same ID", r.status, own, rec.GetRequestId())
	}
	for _, line := range in.logs.lines("call") {
		if line["request_id"] == own {
			if id, ok := line["caller_request_id"]; ok {
				t.Errorf("call line of a REST call without X-Request-Id has caller_request_id %v", id)
			}
		}
	}
}

func TestReflection(t *testing.T) {
	t.Parallel()
	in := start(t, nil, "--simulate")
	stream, err := reflectionpb.NewServerReflectionClient(in.conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("reflection: %v", err)
	}
	stream.CloseSend()
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !contains(names, "payments.v1.PaymentsService") {
		t.Errorf("reflection lists %v, want payments.v1.PaymentsService", names)
	}
}

func TestConfigRefusals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "empty-key")
	os.WriteFile(keyFile, []byte(" \n"), 0o600)
	// A key file holds one key, or two while rotating; three lines, or
	// one key twice, is a mistake.
	threeLines := filepath.Join(dir, "three-lines")
	os.WriteFile(threeLines, []byte(sandboxKey+"\nsk_sandbox_other\nsk_sandbox_third\n"), 0o600)
	sameTwice := filepath.Join(dir, "same-twice")
	os.WriteFile(sameTwice, []byte(sandboxKey+"\n"+sandboxKey+"\n"), 0o600)
	spaceInside := filepath.Join(dir, "space-inside")
	os.WriteFile(spaceInside, []byte(sandboxKey+"\nsk_sandbox other\n"), 0o600)
	bomInside := filepath.Join(dir, "bom-inside")
	os.WriteFile(bomInside, []byte("sk_sandbox\uFEFF_x"), 0o600)
	sandbox := map[string]string{
		"PAYMENTS_SANDBOX_BASE_URL": "https://sandbox.provider.test/v1",
		"PAYMENTS_SANDBOX_API_KEY":  sandboxKey,
	}
	live := map[string]string{
		"PAYMENTS_ENVIRONMENT":   "live",
		"PAYMENTS_LIVE_BASE_URL": "https://live.provider.test/v1",
		"PAYMENTS_LIVE_API_KEY":  liveKey,
	}
	tests := []struct {
		name    string
		env     map[string]string
		args    []string
		wantVar string // the setting the error must name
	}{
		{"unknown environment", with(sandbox, "PAYMENTS_ENVIRONMENT", "production"), nil, "PAYMENTS_ENVIRONMENT"},
		{"sandbox base URL missing", with(sandbox, "PAYMENTS_SANDBOX_BASE_URL", ""), nil, "PAYMENTS_SANDBOX_BASE_URL"},
		{"sandbox key missing", with(sandbox, "PAYMENTS_SANDBOX_API_KEY", ""), nil, "PAYMENTS_SANDBOX_API_KEY"},
		{"live base URL missing", with(live, "PAYMENTS_LIVE_BASE_URL", ""), nil, "PAYMENTS_LIVE_BASE_URL"},
		{"live key missing", with(live, "PAYMENTS_LIVE_API_KEY", ""), nil, "PAYMENTS_LIVE_API_KEY"},
		{"live key only in sandbox", with(live, "PAYMENTS_LIVE_API_KEY", "", "PAYMENTS_SANDBOX_API_KEY", liveKey), nil, "PAYMENTS_LIVE_API_KEY"},
		{"base URL without /v1", with(sandbox, "PAYMENTS_SANDBOX_BASE_URL", "https://sandbox.provider.test/v2"), nil, "PAYMENTS_SANDBOX_BASE_URL"},
		{"base URL with a trailing path", with(sandbox, "PAYMENTS_SANDBOX_BASE_URL", "https://sandbox.provider.test/v1/x"), nil, "PAYMENTS_SANDBOX_BASE_URL"},
		{"base URL not a URL", with(sandbox, "PAYMENTS_SANDBOX_BASE_URL", "sandbox.provider.test/v1"), nil, "PAYMENTS_SANDBOX_BASE_URL"},
		{"base URL with credentials", with(sandbox, "PAYMENTS_SANDBOX_BASE_URL", "https://user:"+sandboxKey+"@sandbox.provider.test/v1"), nil, "PAYMENTS_SANDBOX_BASE_URL"},
		{"live over http", with(live, "PAYMENTS_LIVE_BASE_URL", "http://live.provider.test/v1"), nil, "PAYMENTS_LIVE_BASE_URL"},
		{"key and key file both set", with(sandbox, "PAYMENTS_SANDBOX_API_KEY_FILE", keyFile), nil, "PAYMENTS_SANDBOX_API_KEY_FILE"},
		{"key file missing", with(sandbox, "PAYMENTS_SANDBOX_API_KEY", "", "PAYMENTS_SANDBOX_API_KEY_FILE", "/nonexistent/key"), nil, "PAYMENTS_SANDBOX_API_KEY_FILE"},
		{"key file empty", with(sandbox, "PAYMENTS_SANDBOX_API_KEY", "", "PAYMENTS_SANDBOX_API_KEY_FILE", keyFile), nil, "PAYMENTS_SANDBOX_API_KEY_FILE"},
		{"simulate in live", live, []string{"--simulate"}, "--simulate"},
		{"secret files re-read continuously", with(sandbox, "PAYMENTS_SECRET_RELOAD_INTERVAL", "1ns"), nil, "PAYMENTS_SECRET_RELOAD_INTERVAL"},
		{"max attempts zero", with(sandbox, "PAYMENTS_UPSTREAM_MAX_ATTEMPTS", "0"), nil, "PAYMENTS_UPSTREAM_MAX_ATTEMPTS"},
		{"timeout not a duration", with(sandbox, "PAYMENTS_UPSTREAM_TIMEOUT", "15"), nil, "PAYMENTS_UPSTREAM_TIMEOUT"},
		{"TLS key without cert", with(sandbox, "PAYMENTS_TLS_KEY_FILE", "/tmp/key.pem"), nil, "PAYMENTS_TLS_CERT_FILE"},
		{"unknown log level", with(sandbox, "PAYMENTS_LOG_LEVEL", "loud"), nil, "PAYMENTS_LOG_LEVEL"},
		{"key with a newline inside", with(sandbox, "PAYMENTS_SANDBOX_API_KEY", sandboxKey+"\nsecond"), nil, "PAYMENTS_SANDBOX_API_KEY"},
		{"key with a space inside", with(sandbox, "PAYMENTS_SANDBOX_API_KEY", "sk_sandbox "+sandboxKey), nil, "PAYMENTS_SANDBOX_API_KEY"},
		{"key with a tab inside", with(sandbox, "PAYMENTS_SANDBOX_API_KEY", sandboxKey+"\tx"), nil, "PAYMENTS_SANDBOX_API_KEY"},
		{"key with a control character", with(sandbox, "PAYMENTS_SANDBOX_API_KEY", sandboxKey+"\x00"), nil, "PAYMENTS_SANDBOX_API_KEY"},
		{"key with a zero-width space", with(sandbox, "PAYMENTS_SANDBOX_API_KEY", sandboxKey+"\u200b"), nil, "PAYMENTS_SANDBOX_API_KEY"},
		{"key not UTF-8", with(sandbox, "PAYMENTS_SANDBOX_API_KEY", sandboxKey+"\xff"), nil, "PAYMENTS_SANDBOX_API_KEY"},
		{"live key with a newline inside", with(live, "PAYMENTS_LIVE_API_KEY", liveKey+"\r\nx"), nil, "PAYMENTS_LIVE_API_KEY"},
		{"key file with three lines", with(sandbox, "PAYMENTS_SANDBOX_API_KEY", "", "PAYMENTS_SANDBOX_API_KEY_FILE", threeLines), nil, "PAYMENTS_SANDBOX_API_KEY_FILE"},
		{"key file with one key twice", with(sandbox, "PAYMENTS_SANDBOX_API_KEY", "", "PAYMENTS_SANDBOX_API_KEY_FILE", sameTwice), nil, "PAYMENTS_SANDBOX_API_KEY_FILE"},
		{"key file with a space inside its second key", with(sandbox, "PAYMENTS_SANDBOX_API_KEY", "", "PAYMENTS_SANDBOX_API_KEY_FILE", spaceInside), nil, "PAYMENTS_SANDBOX_API_KEY_FILE"},
		{"key file with a BOM inside", with(sandbox, "PAYMENTS_SANDBOX_API_KEY", "", "PAYMENTS_SANDBOX_API_KEY_FILE", bomInside), nil, "PAYMENTS_SANDBOX_API_KEY_FILE"},
		{"key file a directory", with(sandbox, "PAYMENTS_SANDBOX_API_KEY", "", "PAYMENTS_SANDBOX_API_KEY_FILE", dir), nil, "PAYMENTS_SANDBOX_API_KEY_FILE"},
		{"base URL with a query", with(sandbox, "PAYMENTS_SANDBOX_BASE_URL", "https://sandbox.provider.test/v1?env=x"), nil, "PAYMENTS_SANDBOX_BASE_URL"},
		{"base URL with a bare ?", with(sandbox, "PAYMENTS_SANDBOX_BASE_URL", "https://sandbox.provider.test/v1?"), nil, "PAYMENTS_SANDBOX_BASE_URL"},
		{"base URL with a fragment", with(sandbox, "PAYMENTS_SANDBOX_BASE_URL", "https://sandbox.provider.test/v1#x"), nil, "PAYMENTS_SANDBOX_BASE_URL"},
		{"base URL with a bare #", with(sandbox, "PAYMENTS_SANDBOX_BASE_URL", "https://sandbox.provider.test/v1#"), nil, "PAYMENTS_SANDBOX_BASE_URL"},
		{"base URL with no host", with(sandbox, "PAYMENTS_SANDBOX_BASE_URL", "https://:8443/v1"), nil, "PAYMENTS_SANDBOX_BASE_URL"},
		{"base URL with port 0", with(sandbox, "PAYMENTS_SANDBOX_BASE_URL", "https://sandbox.provider.test:0/v1"), nil, "PAYMENTS_SANDBOX_BASE_URL"},
		{"base URL with port 65536", with(sandbox, "PAYMENTS_SANDBOX_BASE_URL", "https://sandbox.provider.test:65536/v1"), nil, "PAYMENTS_SANDBOX_BASE_URL"},
		{"base URL with a named port", with(sandbox, "PAYMENTS_SANDBOX_BASE_URL", "https://sandbox.provider.test:https/v1"), nil, "PAYMENTS_SANDBOX_BASE_URL"},
		{"upstream timeout past the shutdown timeout", with(sandbox, "PAYMENTS_UPSTREAM_TIMEOUT", "30s"), nil, "PAYMENTS_SHUTDOWN_TIMEOUT"},
		{"shutdown timeout under the upstream timeout", with(sandbox, "PAYMENTS_SHUTDOWN_TIMEOUT", "5s"), nil, "PAYMENTS_UPSTREAM_TIMEOUT"},
		// A list with no identity in it used to turn the allowlist off.
		{"allowed callers only a comma", with(sandbox, "PAYMENTS_ALLOWED_CALLERS", ","), nil, "PAYMENTS_ALLOWED_CALLERS"},
		{"allowed callers only separators and spaces", with(sandbox, "PAYMENTS_ALLOWED_CALLERS", " , \t,, "), nil, "PAYMENTS_ALLOWED_CALLERS"},
		{"allowed callers only a space", with(sandbox, "PAYMENTS_ALLOWED_CALLERS", " "), nil, "PAYMENTS_ALLOWED_CALLERS"},
		{"database password with an unescaped #", with(sandbox, "PAYMENTS_DATABASE_URL", "postgres://app:1234#pw@127.0.0.1:1/payments"), nil, "PAYMENTS_DATABASE_URL"},
		{"database password with an unescaped /", with(sandbox, "PAYMENTS_DATABASE_URL", "postgres://app:12/pw@127.0.0.1:1/payments"), nil, "PAYMENTS_DATABASE_URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := with(tt.env, "PAYMENTS_GRPC_ADDR", "127.0.0.1:0", "PAYMENTS_HTTP_ADDR", "127.0.0.1:0")
			if env["PAYMENTS_DATABASE_URL"] == "" {
				env["PAYMENTS_DATABASE_URL"] = "sqlite:" + filepath.Join(t.TempDir(), "records.db")
			}
			stdout, stderr, err := runRefused(t, env, tt.args...)
			if err == nil {
				t.Fatalf("run() = nil, want a refusal naming %s", tt.wantVar)
			}
			if !strings.Contains(err.Error(), tt.wantVar) {
				t.Errorf("run() = %q, want it to name %s", err, tt.wantVar)
			}
			for _, out := range []string{err.Error(), stdout, stderr} {
				if strings.Contains(out, sandboxKey) || strings.Contains(out, liveKey) {
					t.Errorf("refusal output contains an API key: %q", out)
				}
			}
		})
	}
}

// TestOtherEnvironmentIgnored checks that the unselected environment's
// settings are not read: broken live settings don't stop a sandbox
// deployment, and the reverse.
func TestOtherEnvironmentIgnored(t *testing.T) {
	t.Parallel()
	sandbox := fakeProvider(t, "sandbox")
	in := start(t, with(sandboxEnv(sandbox),
		"PAYMENTS_LIVE_BASE_URL", "http://not-https/v9",
		"PAYMENTS_LIVE_API_KEY", liveKey,
		"PAYMENTS_LIVE_API_KEY_FILE", "/nonexistent",
	))
	if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-ign")); err != nil {
		t.Fatalf("CreateMultiCardPayment() = %v, want OK", err)
	}
	if strings.Contains(in.logs.String(), "not-https") {
		t.Errorf("a sandbox deployment logged live settings")
	}
}

func TestHealthEndpoints(t *testing.T) {
	t.Parallel()
	in := start(t, nil, "--simulate")
	for _, path := range []string{"/healthz", "/readyz", "/openapi.json", "/metrics"} {
		resp, err := in.http.Get("http://" + in.httpAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s = %d, want 200", path, resp.StatusCode)
		}
		if path == "/openapi.json" && !json.Valid(body) {
			t.Errorf("GET /openapi.json is not JSON")
		}
	}
}

// TestRefusalsNeverEchoValues pastes a key into each variable where it
// doesn't belong: paymentsd must refuse to start, name the variable, and
// print the value nowhere.
func TestRefusalsNeverEchoValues(t *testing.T) {
	t.Parallel()
	sandbox := map[string]string{
		"PAYMENTS_SANDBOX_BASE_URL": "https://sandbox.provider.test/v1",
		"PAYMENTS_SANDBOX_API_KEY":  sandboxKey,
	}
	live := map[string]string{
		"PAYMENTS_ENVIRONMENT":   "live",
		"PAYMENTS_LIVE_BASE_URL": "https://live.provider.test/v1",
		"PAYMENTS_LIVE_API_KEY":  liveKey,
	}
	tests := []struct {
		name string
		env  map[string]string
		vr   string
	}{
		{"environment", sandbox, "PAYMENTS_ENVIRONMENT"},
		{"base URL", sandbox, "PAYMENTS_SANDBOX_BASE_URL"},
		{"base URL path", sandbox, "PAYMENTS_SANDBOX_BASE_URL"},
		{"base URL port", sandbox, "PAYMENTS_SANDBOX_BASE_URL"},
		{"base URL query", sandbox, "PAYMENTS_SANDBOX_BASE_URL"},
		{"live base URL over http", live, "PAYMENTS_LIVE_BASE_URL"},
		{"key file path", with(sandbox, "PAYMENTS_SANDBOX_API_KEY", ""), "PAYMENTS_SANDBOX_API_KEY_FILE"},
		{"key with a second line", sandbox, "PAYMENTS_SANDBOX_API_KEY"},
		{"log level", sandbox, "PAYMENTS_LOG_LEVEL"},
		{"upstream timeout", sandbox, "PAYMENTS_UPSTREAM_TIMEOUT"},
		{"breaker cooldown", sandbox, "PAYMENTS_UPSTREAM_BREAKER_COOLDOWN"},
		{"shutdown timeout", sandbox, "PAYMENTS_SHUTDOWN_TIMEOUT"},
		{"shutdown delay", sandbox, "PAYMENTS_SHUTDOWN_DELAY"},
		{"max attempts", sandbox, "PAYMENTS_UPSTREAM_MAX_ATTEMPTS"},
		{"max response bytes", sandbox, "PAYMENTS_UPSTREAM_MAX_RESPONSE_BYTES"},
		{"breaker failures", sandbox, "PAYMENTS_UPSTREAM_BREAKER_FAILURES"},
		{"max request bytes", sandbox, "PAYMENTS_MAX_REQUEST_BYTES"},
		{"gRPC address", sandbox, "PAYMENTS_GRPC_ADDR"},
		{"gRPC address port", sandbox, "PAYMENTS_GRPC_ADDR"},
		{"HTTP address", sandbox, "PAYMENTS_HTTP_ADDR"},
		{"webhook address", with(sandbox, "PAYMENTS_SANDBOX_WEBHOOK_TOKEN", webhookToken), "PAYMENTS_WEBHOOK_ADDR"},
		{"webhook max bytes", sandbox, "PAYMENTS_WEBHOOK_MAX_BYTES"},
		{"upstream CA file", sandbox, "PAYMENTS_UPSTREAM_CA_FILE"},
		{"TLS cert file", with(sandbox, "PAYMENTS_TLS_KEY_FILE", "testdata/none.key"), "PAYMENTS_TLS_CERT_FILE"},
		{"TLS key file", with(sandbox, "PAYMENTS_TLS_CERT_FILE", "testdata/none.crt"), "PAYMENTS_TLS_KEY_FILE"},
		{"TLS client CA file", sandbox, "PAYMENTS_TLS_CLIENT_CA_FILE"},
		{"allowed callers", sandbox, "PAYMENTS_ALLOWED_CALLERS"},
		{"settlement window", sandbox, "PAYMENTS_SETTLEMENT_WINDOW"},
		{"record retention", sandbox, "PAYMENTS_RECORD_RETENTION"},
		{"max in flight", sandbox, "PAYMENTS_MAX_IN_FLIGHT"},
		{"max connections", sandbox, "PAYMENTS_MAX_CONNECTIONS"},
		{"HTTP read timeout", sandbox, "PAYMENTS_HTTP_READ_TIMEOUT"},
		{"database URL", sandbox, "PAYMENTS_DATABASE_URL"},
		{"database URL file", sandbox, "PAYMENTS_DATABASE_URL_FILE"},
		{"webhook token file", with(sandbox, "PAYMENTS_WEBHOOK_ADDR", "127.0.0.1:0"), "PAYMENTS_SANDBOX_WEBHOOK_TOKEN_FILE"},
		{"traces exporter", sandbox, "OTEL_TRACES_EXPORTER"},
		{"OTLP protocol", with(sandbox, "OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"), "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{"OTLP traces protocol", with(sandbox, "OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"), "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"},
		{"OTLP headers", with(sandbox, "OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"), "OTEL_EXPORTER_OTLP_HEADERS"},
		{"OTLP traces headers", with(sandbox, "OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"), "OTEL_EXPORTER_OTLP_TRACES_HEADERS"},
		// Flags: the key goes into the arguments, not the environment.
		{"simulate flag value", sandbox, "--simulate"},
		{"simulate flag value, one dash", sandbox, "--simulate"},
		{"unknown flag", sandbox, "--simulate"},
		{"malformed flag", sandbox, "--simulate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := map[string][]string{
				"simulate flag value":           {"--simulate=" + sandboxKey},
				"simulate flag value, one dash": {"-simulate=" + sandboxKey},
				"unknown flag":                  {"--" + sandboxKey},
				"malformed flag":                {"---" + sandboxKey},
			}[tt.name]
			pasted := map[string]string{
				"OTLP headers":            "x-team=payments," + sandboxKey,
				"OTLP traces headers":     "Authorization=Bearer%ZZ" + sandboxKey,
				"gRPC address":            "127.0.0.1:" + sandboxKey,
				"allowed callers":         "spiffe://corp.example/ns/shop/sa/checkout, " + sandboxKey + " x",
				"TLS cert file":           "/run/secrets/" + sandboxKey,
				"TLS key file":            "/run/secrets/" + sandboxKey,
				"TLS client CA file":      "/run/secrets/" + sandboxKey,
				"upstream CA file":        "/run/secrets/" + sandboxKey,
				"database URL file":       "/run/secrets/" + sandboxKey,
				"webhook token file":      "/run/secrets/" + sandboxKey,
				"base URL":                "https://sandbox.provider.test/" + sandboxKey,
				"base URL path":           "https://sandbox.provider.test/v2/" + sandboxKey,
				"base URL port":           "https://sandbox.provider.test:" + sandboxKey + "/v1",
				"base URL query":          "https://sandbox.provider.test/v1?key=" + sandboxKey,
				"live base URL over http": "http://live.provider.test/" + sandboxKey + "/v1",
				"key file path":           "/run/secrets/" + sandboxKey,
				"key with a second line":  sandboxKey + "\n" + sandboxKey,
			}[tt.name]
			if pasted == "" {
				pasted = sandboxKey
			}
			env := with(tt.env,
				"PAYMENTS_GRPC_ADDR", "127.0.0.1:0",
				"PAYMENTS_HTTP_ADDR", "127.0.0.1:0",
				"PAYMENTS_DATABASE_URL", "sqlite:"+filepath.Join(t.TempDir(), "records.db"))
			if args == nil {
				env[tt.vr] = pasted
			}
			if tt.vr == "PAYMENTS_DATABASE_URL_FILE" {
				delete(env, "PAYMENTS_DATABASE_URL")
			}
			stdout, stderr, err := runRefused(t, env, args...)
			if err == nil {
				t.Fatalf("run() with a key in %s = nil, want a refusal", tt.vr)
			}
			if !strings.Contains(err.Error(), tt.vr) {
				t.Errorf("run() = %q, want it to name %s", err, tt.vr)
			}
			for _, out := range []string{err.Error(), fmt.Sprintf("%+v", err), stdout, stderr} {
				// Any 10 bytes of the key would be a leak.
				for i := 0; i+10 <= len(sandboxKey); i++ {
					if strings.Contains(out, sandboxKey[i:i+10]) {
						t.Fatalf("refusal output contains the key: %q", out)
					}
				}
			}
		})
	}
}
