//go:build unix

package store

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"example.com/paymentsd/internal/store/storetest"

	"example.com/paymentsd/internal/record"
)

// BenchmarkListFiltered measures ListRecords' filtered pages over
// 1,000,000 records, each backend:
//
//	go test -run '^$' -bench ListFiltered -benchtime=200x ./internal/store/
//
// The records are written by one INSERT … SELECT (writing them through
// Begin and Finish would take far longer than it shows): one a
// millisecond, 1% OutcomeUnknown (a tenth of those given up), 1%
// NotCreated, 0.01% InProgress, the rest Succeeded, from ten callers. The
// target is a page in under 50 ms.
func BenchmarkListFiltered(b *testing.B) {
	const n = 1_000_000
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	gaveUp := true
	mid := base.Add(n / 2 * time.Millisecond)
	queries := []struct {
		name string
		q    ListQuery
	}{
		{"unknown", ListQuery{States: []record.State{record.OutcomeUnknown}}},
		{"unknown+in_progress", ListQuery{States: []record.State{record.OutcomeUnknown, record.InProgress}}},
		{"gave_up", ListQuery{GaveUp: &gaveUp}},
		{"all", ListQuery{}},
		{"all_full_view", ListQuery{WithReply: true}},
		{"all_page1000", ListQuery{Limit: 1000}},
		{"time_range_middle", ListQuery{CreatedAfter: mid, CreatedBefore: mid.Add(time.Hour)}},
		{"caller", ListQuery{ByCaller: true, Caller: "spiffe://bench/caller-3"}},
		{"caller_unknown", ListQuery{ByCaller: true, Caller: "spiffe://bench/caller-0", States: []record.State{record.OutcomeUnknown}}},
		{"unknown_deep_page", ListQuery{States: []record.State{record.OutcomeUnknown}, After: &Cursor{CreatedAt: mid, Tie: nil}}},
	}
	for _, bk := range []struct {
		name string
		url  func(testing.TB) string
	}{
		{"sqlite", func(tb testing.TB) string { return "sqlite:" + filepath.Join(tb.TempDir(), "db") }},
		{"postgres", storetest.PostgresURL},
	} {
		b.Run(bk.name, func(b *testing.B) {
			ctx := context.Background()
			s, err := Open(ctx, bk.url(b), "sandbox", Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			start := time.Now()
			if err := seedRecords(ctx, s, n, base); err != nil {
				b.Fatal(err)
			}
			b.Logf("%s: seeded %d records in %v", bk.name, n, time.Since(start).Round(time.Millisecond))
			for _, q := range queries {
				b.Run(q.name, func(b *testing.B) {
					q := q.q
					if q.Limit == 0 {
						q.Limit = 100
					}
					q.MaxBytes = 3 << 20
					if q.After != nil {
						q.After.Tie = []byte{}
					}
					var got int
					cpu := processCPU()
					for b.Loop() {
						p, err := s.ListRecords(ctx, q)
						if err != nil {
							b.Fatal(err)
						}
						got = len(p.Records)
					}
					b.ReportMetric(float64(got), "records/page")
					b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/page")
					// This process's CPU per page: for SQLite, the whole
					// cost, whatever else the machine is doing; for
					// PostgreSQL, the client's side only.
					b.ReportMetric(float64((processCPU()-cpu).Microseconds())/float64(b.N)/1000, "cpu-ms/page")
				})
			}
		})
	}
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// seedRecords writes n records in one statement.
func seedRecords(ctx context.Context, s *Store, n int, base time.Time) error {
	if s.d.intTimes {
		_, err := s.w.ExecContext(ctx, `
			WITH RECURSIVE seq(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i < ?1 - 1)
			INSERT INTO records (key, body, body_sha256, currency, amount, state, provider_status, reply,
				request_id, trace_id, caller, created_at, updated_at, settle_by, next_settle_at,
				lease_expires_at, gave_up)
			SELECT printf('bench-%07d', i), NULL, zeroblob(32), 'EUR', i,
				CASE WHEN i % 100 = 0 THEN 4 WHEN i % 100 = 1 THEN 3 WHEN i % 10000 = 2 THEN 1 ELSE 2 END,
				201, '{"id":"pay_' || i || '"}', '', '', 'spiffe://bench/caller-' || (i % 10),
				?2 + i * 1000, ?2 + i * 1000, ?2 + i * 1000 + 86400000000, 0, 0,
				CASE WHEN i % 1000 = 0 THEN 1 ELSE 0 END
			FROM seq`, n, base.UnixMicro())
		if err != nil {
			return err
		}
		_, err = s.w.ExecContext(ctx, `ANALYZE`)
		return err
	}
	// One statement writing a million rows and five indexes takes longer
	// than the pool's statement timeout.
	conn, err := s.w.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SET statement_timeout = 0`); err != nil {
		return err
	}
	defer conn.ExecContext(ctx, `RESET statement_timeout`)
	_, err = conn.ExecContext(ctx, `
		INSERT INTO records (key, key_hash, body, body_sha256, currency, amount, state, provider_status, reply,
			request_id, trace_id, caller, created_at, updated_at, settle_by, next_settle_at,
			lease_expires_at, gave_up)
		SELECT k, sha256(convert_to(k, 'UTF8')), NULL, sha256(''::bytea), 'EUR', i,
			CASE WHEN i % 100 = 0 THEN 4 WHEN i % 100 = 1 THEN 3 WHEN i % 10000 = 2 THEN 1 ELSE 2 END,
			201, convert_to('{"id":"pay_' || i || '"}', 'UTF8'), '', '', 'spiffe://bench/caller-' || (i % 10),
			t, t, t + interval '1 day', t, t, i % 1000 = 0
		FROM (SELECT i, 'bench-' || lpad(i::text, 7, '0') AS k, $2::timestamptz + i * interval '1 millisecond' AS t
			FROM generate_series(0, $1 - 1) AS i) AS g`, n, base)
	if err != nil {
		return err
	}
	_, err = conn.ExecContext(ctx, `ANALYZE records`)
	return err
}
