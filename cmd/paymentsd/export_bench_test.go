package main

import (
	"database/sql"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/cli"
)

// BenchmarkExport measures 'paymentsd payments export': the CLI's export
// code against a real paymentsd over gRPC with mTLS, paging through
// 100,000 records in SQLite with the full view and writing them to a file.
// The target is 20,000 records/s or more:
//
//	go test -run '^$' -bench Export -benchtime 3x ./cmd/paymentsd/
func BenchmarkExport(b *testing.B) {
	const n = 100_000
	dbPath := filepath.Join(b.TempDir(), "records.db")
	d := newCLIDeployment(b, with(sandboxEnv(fakeProvider(b, "sandbox")), "PAYMENTS_DATABASE_URL", "sqlite:"+dbPath))
	in := start(b, d.env)
	from := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	seedSQLiteBulk(b, dbPath, n, from)

	conn := cli.ConnFlags{Addr: in.grpcAddr, CAFile: d.caFile, CertFile: d.adminCert, KeyFile: d.adminKey, Timeout: time.Minute}
	client, closeConn, err := conn.Dial()
	if err != nil {
		b.Fatal(err)
	}
	defer closeConn()
	for _, format := range []string{"csv", "jsonl"} {
		b.Run(format, func(b *testing.B) {
			out := filepath.Join(b.TempDir(), "export."+format)
			var got int
			cpu := cpuTime(b)
			for b.Loop() {
				f, err := os.Create(out)
				if err != nil {
					b.Fatal(err)
				}
				req := &paymentsv1.ListMultiCardPaymentsRequest{}
				req.CreatedAfter, req.CreatedBefore = timestamppb.New(from), timestamppb.New(from.Add(24*time.Hour))
				got, err = cli.ExportPayments(b.Context(), client, req, format, f, cli.ExportOptions{Timeout: time.Minute})
				f.Close()
				if err != nil {
					b.Fatal(err)
				}
				if got != n {
					b.Fatalf("exported %d records, want %d", got, n)
				}
			}
			b.ReportMetric(float64(got)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
			// The machine may be shared: records per second of CPU (the
			// server's and the CLI's, both in this process) does not
			// depend on what else runs.
			b.ReportMetric(float64(got)*float64(b.N)/(cpuTime(b)-cpu).Seconds(), "records/cpu-s")
			if fi, err := os.Stat(out); err == nil {
				b.ReportMetric(float64(fi.Size())/float64(got), "bytes/record")
			}
		})
	}
}

// seedSQLiteBulk writes n succeeded records, one every 100 ms from start,
// in one statement (as the store's list benchmark does), each with a
// provider reply of about 200 bytes.
func seedSQLiteBulk(b *testing.B, path string, n int, start time.Time) {
	b.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	_, err = db.Exec(`
		WITH RECURSIVE seq(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i < ?1 - 1)
		INSERT INTO records (key, body, body_sha256, currency, amount, state, provider_status, reply,
			request_id, trace_id, caller, created_at, updated_at, settle_by, next_settle_at,
			lease_expires_at, gave_up)
		SELECT printf('order-%07d', i), NULL, zeroblob(32), 'EUR', 1000 + i, 2, 201,
			'{"id":"pay_' || i || '","status":"COMPLETED","amountMoney":{"amount":' || (1000 + i) ||
			',"currency":"EUR"},"cards":[{"last4":"4242","amount":' || (1000 + i) || '}],"createdAt":"2026-11-23T00:00:00Z"}',
			'', '', ?3, ?2 + i * 100000, ?2 + i * 100000, ?2 + i * 100000 + 86400000000, 0, 0, 0
		FROM seq`, n, start.UnixMicro(), checkout)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec(`ANALYZE`); err != nil {
		b.Fatal(err)
	}
}

// cpuTime is the CPU time this process has used, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
