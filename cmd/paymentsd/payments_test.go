package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	_ "modernc.org/sqlite"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/cli"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/internal/store/storetest"
)

// gaveUpLine is the log line of a settlement give-up.
const gaveUpLine = "settlement window closed with the payment's outcome unknown; check the provider's dashboard"

// cliDeployment is a paymentsd serving mTLS, with the files its callers
// use: one identity that is an admin (oncall) and one that is not
// (checkout).
type cliDeployment struct {
	serverCA, clientCA        *testCA
	env                       map[string]string
	caFile                    string
	adminCert, adminKey       string
	checkoutCert, checkoutKey string
	checkoutTLS               tls.Certificate
}

func newCLIDeployment(t testing.TB, base map[string]string) *cliDeployment {
	t.Helper()
	d := &cliDeployment{serverCA: newTestCA(t, "server CA"), clientCA: newTestCA(t, "client CA")}
	certFile, keyFile := writePEMFiles(t, d.serverCA.issue(t, x509.ExtKeyUsageServerAuth))
	clientCAFile := filepath.Join(t.TempDir(), "client-ca.pem")
	os.WriteFile(clientCAFile, d.clientCA.pem, 0o600)
	d.caFile = filepath.Join(t.TempDir(), "server-ca.pem")
	os.WriteFile(d.caFile, d.serverCA.pem, 0o600)
	d.adminCert, d.adminKey = writePEMFiles(t, d.clientCA.issueClient(t, []string{oncall}, nil))
	d.checkoutTLS = d.clientCA.issueClient(t, []string{checkout}, nil)
	d.checkoutCert, d.checkoutKey = writePEMFiles(t, d.checkoutTLS)
	d.env = with(base,
		"PAYMENTS_TLS_CERT_FILE", certFile, "PAYMENTS_TLS_KEY_FILE", keyFile, "PAYMENTS_TLS_CLIENT_CA_FILE", clientCAFile,
		"PAYMENTS_ALLOWED_CALLERS", checkout+","+oncall,
		"PAYMENTS_ADMIN_CALLERS", oncall,
	)
	return d
}

// checkoutClient is the calling service's gRPC client.
func (d *cliDeployment) checkoutClient(t *testing.T, in *instance) paymentsv1.PaymentsServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(in.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: d.serverCA.pool, Certificates: []tls.Certificate{d.checkoutTLS}, MinVersion: tls.VersionTLS12,
	})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return paymentsv1.NewPaymentsServiceClient(conn)
}

// admin and notAdmin are the CLI's connection flags for each identity.
func (d *cliDeployment) admin(in *instance) []string {
	return []string{"--addr", in.grpcAddr, "--tls-ca", d.caFile, "--tls-cert", d.adminCert, "--tls-key", d.adminKey}
}

func (d *cliDeployment) notAdmin(in *instance) []string {
	return []string{"--addr", in.grpcAddr, "--tls-ca", d.caFile, "--tls-cert", d.checkoutCert, "--tls-key", d.checkoutKey}
}

// cliResult is what one CLI run printed and its exit status.
type cliResult struct {
	stdout, stderr string
	code           int
}

// runCLI runs 'paymentsd payments <command> <conn> <args>' with stdin.
func runCLI(t *testing.T, stdin string, command string, conn []string, args ...string) cliResult {
	t.Helper()
	var out, errb bytes.Buffer
	argv := append(append([]string{command}, conn...), args...)
	err := cli.Run(t.Context(), argv, nil, strings.NewReader(stdin), &out, &errb)
	r := cliResult{stdout: out.String(), stderr: errb.String()}
	if err != nil {
		r.code = cli.ExitCode(err)
		r.stderr += "paymentsd: " + err.Error() + "\n"
	}
	return r
}

func (r cliResult) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// jsonLines decodes -o json's output, one message a line.
func jsonLines[M any, P interface {
	*M
	proto.Message
}](t *testing.T, out string) []P {
	t.Helper()
	var ms []P
	for line := range strings.Lines(out) {
		m := P(new(M))
		if err := protojson.Unmarshal([]byte(line), m); err != nil {
			t.Fatalf("-o json line %q: %v", line, err)
		}
		ms = append(ms, m)
	}
	return ms
}

// waitGaveUp waits until settlement has given up on n records.
func waitGaveUp(t *testing.T, in *instance, n int) {
	t.Helper()
	for {
		in.logs.mu.Lock()
		changed := in.logs.changed
		in.logs.mu.Unlock()
		if len(in.logs.lines(gaveUpLine)) >= n {
			return
		}
		select {
		case <-changed:
		case <-time.After(time.Minute):
			t.Fatalf("settlement gave up on %d records in a minute, want %d", len(in.logs.lines(gaveUpLine)), n)
		}
	}
}

// unsettled reads paymentsd_records_unsettled from /metrics, over mTLS.
func (d *cliDeployment) unsettled(t *testing.T, in *instance) float64 {
	t.Helper()
	transport := &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: d.serverCA.pool, Certificates: []tls.Certificate{d.checkoutTLS}, MinVersion: tls.VersionTLS12,
	}}
	defer transport.CloseIdleConnections()
	resp, err := (&http.Client{Transport: transport}).Get("https://" + in.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics is not Prometheus text: %v", err)
	}
	v, _ := sample(families, "paymentsd_records_unsettled", nil)
	return v
}

// waitUnsettled waits until paymentsd_records_unsettled reads want. The
// gauge is a periodic count, so this polls /metrics until a deadline.
func (d *cliDeployment) waitUnsettled(t *testing.T, in *instance, want float64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		got := d.unsettled(t, in)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("paymentsd_records_unsettled = %v after a minute, want %v", got, want)
		}
		<-tick.C
	}
}

// TestPaymentsCLIOnCall is the on-call story with the CLI alone, over mTLS:
// find every payment in doubt, resolve one with evidence, see its audit
// trail, and watch the unsettled gauge drop; a caller that is not an admin
// is refused, and nothing is changed without evidence and confirmation.
func TestPaymentsCLIOnCall(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		db   func(t testing.TB) string
	}{
		{"sqlite", storetest.SQLiteURL},
		{"postgres", storetest.PostgresURL},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			testPaymentsCLIOnCall(t, tt.db(t))
		})
	}
}

func testPaymentsCLIOnCall(t *testing.T, db string) {
	p := idempotentProvider(t)
	p.SetScript(func(_ int, r simulator.Request) simulator.Reply {
		if strings.HasPrefix(idempotencyKey(r.Body), "k-doubt") {
			return simulator.Reply{Fault: simulator.Reset}
		}
		return simulator.Reply{}
	})
	d := newCLIDeployment(t, with(sandboxEnv(p),
		"PAYMENTS_UPSTREAM_MAX_ATTEMPTS", "1",
		"PAYMENTS_UPSTREAM_BREAKER_FAILURES", "1000",
		"PAYMENTS_SETTLEMENT_WINDOW", "1500ms",
		"PAYMENTS_UPSTREAM_TIMEOUT", "500ms",
		"PAYMENTS_PROVIDER_QUIET_PERIOD", "1s",
		"PAYMENTS_DATABASE_URL", db,
	))
	in := start(t, d.env)
	shop := d.checkoutClient(t, in)
	for _, key := range []string{"k-ok", "k-doubt-1", "k-doubt-2"} {
		shop.CreateMultiCardPayment(t.Context(), validRequest(key))
	}
	waitGaveUp(t, in, 2)
	d.waitUnsettled(t, in, 2)
	admin, notAdmin := d.admin(in), d.notAdmin(in)

	// Find every payment in doubt.
	r := runCLI(t, "", "list", admin, "--in-doubt")
	if r.code != 0 || !strings.Contains(r.stdout, "k-doubt-1") || !strings.Contains(r.stdout, "k-doubt-2") || strings.Contains(r.stdout, "k-ok") {
		t.Fatalf("list --in-doubt:\n%v\nwant a table of k-doubt-1 and k-doubt-2 only", r)
	}
	r = runCLI(t, "", "list", admin, "--gave-up", "-o", "json")
	listed := jsonLines[paymentsv1.MultiCardPaymentSummary](t, r.stdout)
	var keys []string
	for _, s := range listed {
		keys = append(keys, s.GetIdempotencyKey())
		if s.GetState() != paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN || !s.GetSettlementGaveUp() || s.GetCaller() != checkout {
			t.Errorf("list --gave-up -o json: %v, want OUTCOME_UNKNOWN, gave up, caller %s", s, checkout)
		}
	}
	if r.code != 0 || !slices.Equal(keys, []string{"k-doubt-1", "k-doubt-2"}) {
		t.Fatalf("list --gave-up -o json = keys %q:\n%v\nwant [k-doubt-1 k-doubt-2]", keys, r)
	}

	// Nothing changes without evidence, or without a yes.
	if r := runCLI(t, "\n", "resolve", admin, "k-doubt-2", "--outcome", "not-created"); r.code != cli.ExitUsage {
		t.Errorf("resolve with blank evidence:\n%v\nwant exit %d", r, cli.ExitUsage)
	}
	if r := runCLI(t, "saw nothing\n\nn\n", "resolve", admin, "k-doubt-2", "--outcome", "not-created"); r.code != cli.ExitDeclined {
		t.Errorf("resolve answered no:\n%v\nwant exit %d", r, cli.ExitDeclined)
	}
	if r := runCLI(t, "", "resolve", admin, "k-doubt-2", "--outcome", "not-created", "--evidence", "seen"); r.code != cli.ExitDeclined {
		t.Errorf("resolve with no answer to the question:\n%v\nwant exit %d", r, cli.ExitDeclined)
	}
	// A caller that is not an admin sees only its own payments, and is
	// refused anything else.
	if r := runCLI(t, "", "list", notAdmin, "--in-doubt"); r.code != 0 || !strings.Contains(r.stdout, "k-doubt-1") {
		t.Errorf("list of its own payments as a non-admin:\n%v\nwant exit 0 and its payments", r)
	}
	if r := runCLI(t, "", "list", notAdmin, "--in-doubt", "--caller", oncall); r.code != cli.ExitDenied || !strings.Contains(r.stderr, "CALLER_NOT_ADMIN") {
		t.Errorf("list of another caller's payments as a non-admin:\n%v\nwant exit %d, CALLER_NOT_ADMIN", r, cli.ExitDenied)
	}
	if r := runCLI(t, "", "resolve", notAdmin, "k-doubt-2", "--outcome", "not-created", "--evidence", "x", "--yes"); r.code != cli.ExitDenied || !strings.Contains(r.stderr, "CALLER_NOT_ADMIN") {
		t.Errorf("resolve as a non-admin:\n%v\nwant exit %d, CALLER_NOT_ADMIN", r, cli.ExitDenied)
	}
	// No client certificate at all: no identity, so not allowed (3), not
	// unreachable (1).
	noCert := []string{"--addr", in.grpcAddr, "--tls-ca", d.caFile}
	if r := runCLI(t, "", "list", noCert, "--in-doubt"); r.code != cli.ExitDenied {
		t.Errorf("list without a client certificate:\n%v\nwant exit %d", r, cli.ExitDenied)
	}
	r = runCLI(t, "", "get", admin, "k-doubt-2", "-o", "json")
	if got := jsonLines[paymentsv1.GetMultiCardPaymentResponse](t, r.stdout); r.code != 0 || len(got) != 1 ||
		got[0].GetState() != paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN || len(got[0].GetAuditEntries()) != 0 {
		t.Fatalf("get k-doubt-2 after the refusals:\n%v\nwant OUTCOME_UNKNOWN, no audit entries", r)
	}

	// Resolve one, typing the evidence when asked.
	const evidence = "provider dashboard: pay_7Hq2 captured 2026-11-24 02:58 UTC\nchecked by the on-call"
	r = runCLI(t, evidence+"\n\ny\n", "resolve", admin, "k-doubt-1", "--outcome", "succeeded")
	if r.code != 0 || !strings.Contains(r.stdout, "Audit trail") {
		t.Fatalf("resolve k-doubt-1:\n%v\nwant exit 0 and the payment with its audit trail", r)
	}
	r = runCLI(t, "", "get", admin, "k-doubt-1", "-o", "json")
	got := jsonLines[paymentsv1.GetMultiCardPaymentResponse](t, r.stdout)
	if r.code != 0 || len(got) != 1 || got[0].GetState() != paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED || len(got[0].GetAuditEntries()) != 1 {
		t.Fatalf("get k-doubt-1:\n%v\nwant SUCCEEDED with one audit entry", r)
	}
	e := got[0].GetAuditEntries()[0]
	if e.GetActor() != oncall || e.GetEvidence() != evidence || e.GetFromState() != paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN ||
		e.GetToState() != paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED || e.GetOutcome() != paymentsv1.ResolutionOutcome_RESOLUTION_OUTCOME_SUCCEEDED ||
		!e.GetSettlementGaveUp() || e.GetRequestId() == "" || e.GetCreateTime() == nil {
		t.Errorf("audit entry = %v, want by %s, OUTCOME_UNKNOWN (gave up) -> SUCCEEDED, the evidence exactly, a request ID and a time", e, oncall)
	}
	if r := runCLI(t, "", "get", admin, "k-doubt-1"); r.code != 0 || !strings.Contains(r.stdout, oncall) || !strings.Contains(r.stdout, "pay_7Hq2") ||
		!strings.Contains(r.stdout, "\nAttempts:\n") || !strings.Contains(r.stdout, "  1  call  ") {
		t.Errorf("get k-doubt-1 (table):\n%v\nwant the attempts, and the audit trail with the actor and the evidence", r)
	}
	d.waitUnsettled(t, in, 1)

	// A resolved payment is not resolved again; the calling service now
	// gets the replay.
	if r := runCLI(t, "", "resolve", admin, "k-doubt-1", "--outcome", "not-created", "--evidence", "x", "--yes"); r.code != cli.ExitRefused {
		t.Errorf("resolve k-doubt-1 again:\n%v\nwant exit %d", r, cli.ExitRefused)
	}
	if resp, err := shop.CreateMultiCardPayment(t.Context(), validRequest("k-doubt-1")); err != nil || !resp.GetReplayed() || !resp.GetResolved() {
		t.Errorf("CreateMultiCardPayment(k-doubt-1) after resolving = %v, %v; want a resolved replay", resp, err)
	}
	if r := runCLI(t, "", "get", admin, "k-nothing"); r.code != cli.ExitNotFound {
		t.Errorf("get k-nothing:\n%v\nwant exit %d", r, cli.ExitNotFound)
	}
	if r := runCLI(t, "", "list", admin, "--state", "bogus"); r.code != cli.ExitUsage {
		t.Errorf("list --state bogus:\n%v\nwant exit %d", r, cli.ExitUsage)
	}
}

// seedRecord is a succeeded record written straight into a SQLite record
// store, at a time of the test's choosing.
type seedRecord struct {
	key     string
	amount  int64
	created time.Time
	reply   string
	// inDoubt seeds an OUTCOME_UNKNOWN record whose settlement gave up,
	// with no reply, instead of a succeeded one.
	inDoubt bool
	// caller is the record's caller; "" for checkout.
	caller string
}

// seedRecords writes records into the record store of a running
// paymentsd (SQLite or PostgreSQL), as the store's own list benchmark does:
// the API can only create records now.
func seedRecords(tb testing.TB, dbURL string, rs []seedRecord) {
	tb.Helper()
	driver, dsn, insert := "pgx", dbURL, `INSERT INTO records (key, key_hash, body, body_sha256, currency, amount, state,
		provider_status, reply, request_id, trace_id, caller, created_at, updated_at, settle_by, next_settle_at,
		lease_expires_at, gave_up)
		VALUES ($1::text, sha256(convert_to($1::text, 'UTF8')), NULL, sha256(''::bytea), 'EUR', $2, $6, $7, $3, '', '', $4,
		$5::timestamptz, $5::timestamptz, $9::timestamptz, $5::timestamptz, $5::timestamptz, $8)`
	if path, ok := strings.CutPrefix(dbURL, "sqlite:"); ok {
		driver, dsn, insert = "sqlite", "file:"+path+"?_pragma=busy_timeout(10000)", `INSERT INTO records (key, body, body_sha256,
		currency, amount, state, provider_status, reply, request_id, trace_id, caller, created_at, updated_at, settle_by,
		next_settle_at, lease_expires_at, gave_up)
		VALUES (?1, NULL, zeroblob(32), 'EUR', ?2, ?6, ?7, ?3, '', '', ?4, ?5, ?5, ?9, 0, 0, ?8)`
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	tx, err := db.Begin()
	if err != nil {
		tb.Fatal(err)
	}
	defer tx.Rollback()
	for _, r := range rs {
		var created any = r.created
		if driver == "sqlite" {
			created = r.created.UnixMicro()
		}
		state, providerStatus, reply, gaveUp, caller := 2, 201, []byte(r.reply), false, cmp.Or(r.caller, checkout)
		settleBy := r.created.Add(24 * time.Hour)
		if r.inDoubt {
			// Settlement gave up: its window closed a minute after the
			// payment was made.
			state, providerStatus, reply, gaveUp = 4, 0, nil, true
			settleBy = r.created.Add(time.Minute)
		}
		var settle any = settleBy
		if driver == "sqlite" {
			settle = settleBy.UnixMicro()
		}
		var gave any = gaveUp
		if driver == "sqlite" && gaveUp {
			gave = 1
		} else if driver == "sqlite" {
			gave = 0
		}
		if _, err := tx.Exec(insert, r.key, r.amount, reply, caller, created, state, providerStatus, gave, settle); err != nil {
			tb.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		tb.Fatal(err)
	}
}

// TestPaymentsExportYesterdayCSV exports yesterday's payments (UTC) to
// CSV, as finance asks for them, and reads the file back: exactly the
// payments created yesterday, oldest first, with the provider's replies.
func TestPaymentsExportYesterdayCSV(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		db   func(t testing.TB) string
	}{
		{"sqlite", storetest.SQLiteURL},
		{"postgres", storetest.PostgresURL},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			testPaymentsExportYesterdayCSV(t, tt.db(t))
		})
	}
}

func testPaymentsExportYesterdayCSV(t *testing.T, db string) {
	today := time.Now().UTC().Truncate(24 * time.Hour)
	yesterday := today.AddDate(0, 0, -1)
	d := newCLIDeployment(t, with(sandboxEnv(fakeProvider(t, "sandbox")), "PAYMENTS_DATABASE_URL", db))
	in := start(t, d.env)
	seeds := []seedRecord{
		{key: "k-day-before", amount: 1, created: yesterday.Add(-time.Microsecond), reply: `{"id":"pay_0"}`},
		{key: "k-midnight", amount: 2, created: yesterday, reply: `{"id":"pay_1"}`},
		{key: "k-noon, \"quoted\"\nkey", amount: 3, created: yesterday.Add(12 * time.Hour), reply: `{"id":"pay_2","note":"a, b"}`},
		{key: "k-last", amount: 4, created: today.Add(-time.Microsecond), reply: `{"id":"pay_3"}`},
		{key: "k-today", amount: 5, created: today, reply: `{"id":"pay_4"}`},
	}
	seedRecords(t, db, seeds)
	want := seeds[1:4]
	// And one made through the API, now (today).
	if _, err := d.checkoutClient(t, in).CreateMultiCardPayment(t.Context(), validRequest("k-now")); err != nil {
		t.Fatalf("CreateMultiCardPayment() = %v", err)
	}

	out := filepath.Join(t.TempDir(), "yesterday.csv")
	r := runCLI(t, "", "export", d.admin(in), "--from", "yesterday", "--to", "yesterday", "--format", "csv", "--output", out)
	if !time.Now().UTC().Truncate(24 * time.Hour).Equal(today) {
		t.Skip("the day changed (UTC) while the test ran")
	}
	if r.code != 0 || r.stdout != "" {
		t.Fatalf("export --from yesterday --to yesterday:\n%v\nwant exit 0 and the data in --output", r)
	}
	if entries, _ := os.ReadDir(filepath.Dir(out)); len(entries) != 1 {
		t.Errorf("--output's directory holds %v, want the export alone (no partial file left)", entries)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("--output file mode = %v, %v; want -rw------- (it holds every payment of the day)", fi.Mode(), err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatalf("export is not CSV: %v", err)
	}
	if len(rows) == 0 || !slices.Equal(rows[0], cli.ExportColumns) {
		t.Fatalf("CSV header = %q, want %q", rows[0], cli.ExportColumns)
	}
	if len(rows)-1 != len(want) {
		t.Fatalf("CSV has %d payments, want %d (yesterday's): %q", len(rows)-1, len(want), rows[1:])
	}
	col := func(row []string, name string) string { return row[slices.Index(cli.ExportColumns, name)] }
	for i, w := range want {
		row := rows[i+1]
		if col(row, "idempotency_key") != w.key || col(row, "amount") != fmt.Sprint(w.amount) || col(row, "currency") != "EUR" ||
			col(row, "state") != "succeeded" || col(row, "caller") != checkout || col(row, "payment_json") != w.reply ||
			col(row, "create_time") != w.created.Format(time.RFC3339Nano) || col(row, "environment") != "sandbox" ||
			col(row, "attempt_history") != "[]" {
			t.Errorf("CSV row %d = %q, want %s created %s, amount %d EUR, reply %s", i+1, row, w.key, w.created.Format(time.RFC3339Nano), w.amount, w.reply)
		}
	}

	// The same as dates, and as JSON lines on stdout.
	day := yesterday.Format(time.DateOnly)
	r = runCLI(t, "", "export", d.admin(in), "--from", day, "--to", day, "--format", "jsonl")
	var lines []cli.ExportRecord
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	for {
		var rec cli.ExportRecord
		if err := dec.Decode(&rec); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("export --format jsonl: %v\n%v", err, r)
		}
		lines = append(lines, rec)
	}
	if r.code != 0 || len(lines) != len(want) || lines[2].IdempotencyKey != want[2].key || lines[1].PaymentJSON != want[1].reply {
		t.Errorf("export --from %s --to %s --format jsonl = %d lines:\n%v\nwant yesterday's %d", day, day, len(lines), r, len(want))
	}

	// Today's: the payment made through the API comes with its attempt.
	r = runCLI(t, "", "export", d.admin(in), "--from", "today", "--to", "today", "--format", "jsonl")
	var now *cli.ExportRecord
	dec = json.NewDecoder(strings.NewReader(r.stdout))
	for {
		var rec cli.ExportRecord
		if err := dec.Decode(&rec); err != nil {
			break
		}
		if rec.IdempotencyKey == "k-now" {
			now = &rec
		}
	}
	if now == nil || len(now.AttemptHistory) != 1 || now.AttemptHistory[0].Kind != "call" || now.AttemptHistory[0].ProviderHTTPStatus != 200 ||
		now.AttemptHistory[0].PaymentJSON != now.PaymentJSON || now.AttemptHistory[0].Outcome != "succeeded" {
		t.Errorf("export of today, k-now = %+v; want its one attempt, a call answered 200 with the payment", now)
	}

	// Only admins export other callers' payments.
	if r := runCLI(t, "", "export", d.notAdmin(in), "--from", day, "--to", day, "--caller", oncall); r.code != cli.ExitDenied {
		t.Errorf("export of another caller's payments by a non-admin:\n%v\nwant exit %d", r, cli.ExitDenied)
	}
	if r := runCLI(t, "", "export", d.admin(in), "--from", day); r.code != cli.ExitUsage {
		t.Errorf("export without --to:\n%v\nwant exit %d", r, cli.ExitUsage)
	}
}

// TestPaymentsExportProgress: an export that runs long says so on stderr,
// never on stdout.
func TestPaymentsExportProgress(t *testing.T) {
	t.Parallel()
	in := start(t, nil, "--simulate")
	if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-progress")); err != nil {
		t.Fatalf("CreateMultiCardPayment() = %v", err)
	}
	progress := &syncBuffer{written: make(chan struct{})}
	var out bytes.Buffer
	n, err := cli.ExportPayments(t.Context(), slowList{in.client, progress.written}, &paymentsv1.ListMultiCardPaymentsRequest{}, "csv", &out,
		cli.ExportOptions{Timeout: time.Minute, Progress: progress, ProgressAfter: 0})
	if err != nil || n != 1 {
		t.Fatalf("cli.ExportPayments() = %d, %v; want 1 payment", n, err)
	}
	if !strings.HasPrefix(progress.String(), "export: 0 payments so far") || strings.Contains(out.String(), "export: ") {
		t.Errorf("progress = %q, stdout = %q; want progress on its writer only", progress.String(), out.String())
	}
}

// slowList holds each List call until progress has been written: an
// export slower than the progress threshold.
type slowList struct {
	paymentsv1.PaymentsServiceClient
	progressed <-chan struct{}
}

func (s slowList) ListMultiCardPayments(ctx context.Context, req *paymentsv1.ListMultiCardPaymentsRequest, opts ...grpc.CallOption) (*paymentsv1.ListMultiCardPaymentsResponse, error) {
	select {
	case <-s.progressed:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.PaymentsServiceClient.ListMultiCardPayments(ctx, req, opts...)
}

// syncBuffer is a bytes.Buffer safe for the progress goroutine and the
// test; written is closed by the first write.
type syncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	written chan struct{}
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len() == 0 {
		close(s.written)
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestPaymentsCLIThroughRun: 'paymentsd payments' is dispatched by run
// before any server configuration is read, with --insecure against
// --simulate, where every caller is an admin.
func TestPaymentsCLIThroughRun(t *testing.T) {
	t.Parallel()
	in := start(t, nil, "--simulate")
	if _, err := in.client.CreateMultiCardPayment(t.Context(), validRequest("k-run")); err != nil {
		t.Fatalf("CreateMultiCardPayment() = %v", err)
	}
	var out, errb bytes.Buffer
	// PAYMENTS_ENVIRONMENT is unset and a server variable is misspelt:
	// the server would refuse to start, the CLI reads neither.
	env := []string{"PAYMENTS_CLI_ADDR=" + in.grpcAddr, "PAYMENTS_ENVIRONEMNT=live"}
	if err := run(context.Background(), []string{"paymentsd", "payments", "list", "--insecure", "-o", "json"}, env, &out, &errb); err != nil {
		t.Fatalf("run(payments list) = %v\n%s", err, errb.String())
	}
	got := jsonLines[paymentsv1.MultiCardPaymentSummary](t, out.String())
	if len(got) != 1 || got[0].GetIdempotencyKey() != "k-run" {
		t.Errorf("payments list -o json = %q, want k-run", out.String())
	}
	for _, sub := range []string{"list", "get", "resolve", "export"} {
		for _, help := range []string{"--help", "-h"} {
			out.Reset()
			errb.Reset()
			err := run(context.Background(), []string{"paymentsd", "payments", sub, help}, nil, &out, &errb)
			if err != nil || strings.Count(out.String(), "Usage: paymentsd payments "+sub) != 1 || errb.Len() != 0 {
				t.Errorf("payments %s %s = %v, stdout %q, stderr %q; want its usage once, on stdout only", sub, help, err, out.String(), errb.String())
			}
		}
		// A bad flag: the error and the usage, once, on stderr.
		out.Reset()
		errb.Reset()
		err := run(context.Background(), []string{"paymentsd", "payments", sub, "--no-such-flag"}, nil, &out, &errb)
		if cli.ExitCode(err) != cli.ExitUsage || strings.Count(errb.String(), "Usage: paymentsd payments "+sub) != 1 || out.Len() != 0 {
			t.Errorf("payments %s --no-such-flag = %v, stdout %q, stderr %q; want exit %d and the usage once, on stderr", sub, err, out.String(), errb.String(), cli.ExitUsage)
		}
	}
	// Plaintext only by name.
	err := run(context.Background(), []string{"paymentsd", "payments", "list", "--insecure", "--tls-ca", "x.pem"}, nil, &out, &errb)
	if cli.ExitCode(err) != cli.ExitUsage {
		t.Errorf("payments list --insecure --tls-ca = %v, want exit %d", err, cli.ExitUsage)
	}
}

// TestPaymentsCLIShowsInvisibleCharacters: a key (chosen by a calling
// service) with a right-to-left override or a zero-width space is
// printed escaped, so that "order-\u202e1174" never reads as order-4711
// in the on-call's table, nor two keys look alike.
func TestPaymentsCLIShowsInvisibleCharacters(t *testing.T) {
	t.Parallel()
	sim := start(t, nil, "--simulate")
	keys := []string{"order-\u202e1174", "order-47\u200b11", "order-4711\u2028x"}
	for _, k := range keys {
		if _, err := sim.client.CreateMultiCardPayment(t.Context(), validRequest(k)); err != nil {
			t.Fatal(err)
		}
	}
	conn := []string{"--addr", sim.grpcAddr, "--insecure"}
	r := runCLI(t, "", "list", conn)
	if r.code != 0 {
		t.Fatalf("list: %v", r)
	}
	g := runCLI(t, "", "get", conn, keys[0])
	if g.code != 0 {
		t.Fatalf("get: %v", g)
	}
	for _, out := range []string{r.stdout, g.stdout} {
		if strings.ContainsAny(out, "\u202e\u200b\u2028") {
			t.Errorf("output holds an invisible character unescaped:\n%s", out)
		}
	}
	if !strings.Contains(r.stdout, `\u202e`) {
		t.Errorf("list does not show the override escaped:\n%s", r.stdout)
	}
}
