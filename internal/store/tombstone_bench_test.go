package store

import (
	"context"
	"crypto/sha256"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"example.com/paymentsd/internal/store/storetest"

	"example.com/paymentsd/internal/record"
)

// BenchmarkTombstoneSpace measures the space 1,000,000 tombstones take in
// each backend, table and indexes, as bytes per tombstone and MiB in all:
//
//	go test -run '^$' -bench TombstoneSpace -benchtime=1x ./internal/store/
//
// Writing them through Begin, Finish and DeleteExpired would take far
// longer than the space is worth, so it writes the tombstones table
// directly, with the columns, types and key order retention writes: keys
// are SHA-256 hashes (so rows arrive in random key order, as they do), and
// expired_at grows.
func BenchmarkTombstoneSpace(b *testing.B) {
	const n = 1_000_000
	for _, bk := range []struct {
		name string
		url  func(testing.TB) string
		size func(context.Context, *Store) (int64, error)
	}{
		{"sqlite", func(tb testing.TB) string { return "sqlite:" + filepath.Join(tb.TempDir(), "db") }, sqliteSize},
		{"postgres", storetest.PostgresURL, postgresTombstonesSize},
	} {
		b.Run(bk.name, func(b *testing.B) {
			ctx := context.Background()
			for range b.N {
				s, err := Open(ctx, bk.url(b), "sandbox", Options{})
				if err != nil {
					b.Fatal(err)
				}
				before, err := bk.size(ctx, s)
				if err != nil {
					b.Fatal(err)
				}
				if err := insertTombstones(ctx, s, n); err != nil {
					b.Fatal(err)
				}
				after, err := bk.size(ctx, s)
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(after-before)/n, "bytes/tombstone")
				b.ReportMetric(float64(after-before)/(1<<20), "MiB")
			}
		})
	}
}

// insertTombstones writes n tombstones, as tombstoneRecords would for
// Succeeded records, in transactions of 10,000.
func insertTombstones(ctx context.Context, s *Store, n int) error {
	d := s.d
	const rowsPerInsert, insertsPerTx = 1000, 10
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	expired := created.AddDate(0, 1, 0)
	for done := 0; done < n; {
		tx, err := s.w.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		for range insertsPerTx {
			rows := min(rowsPerInsert, n-done)
			if rows == 0 {
				break
			}
			var q strings.Builder
			q.WriteString(`INSERT INTO tombstones (` + tombstoneColumns + `) VALUES `)
			args := make([]any, 0, 7*rows)
			for i := range rows {
				k := done + i
				key := sha256.Sum256([]byte(fmt.Sprintf("idempotency-key-%d", k)))
				body := sha256.Sum256([]byte(fmt.Sprintf(`{"amount":%d}`, k)))
				if i > 0 {
					q.WriteString(", ")
				}
				p := len(args)
				fmt.Fprintf(&q, "($%d, $%d, $%d, $%d, $%d, $%d, $%d)", p+1, p+2, p+3, p+4, p+5, p+6, p+7)
				at := created.Add(time.Duration(k) * time.Second)
				args = append(args, key[:], body[:], int(record.Succeeded), false,
					d.t(at), d.t(at.Add(time.Second)), d.t(expired.Add(time.Duration(k)*time.Second)))
			}
			if _, err := tx.ExecContext(ctx, d.q(q.String()), args...); err != nil {
				tx.Rollback()
				return err
			}
			done += rows
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// sqliteSize is the size of the database, its WAL checkpointed into it.
func sqliteSize(ctx context.Context, s *Store) (int64, error) {
	if _, err := s.w.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		return 0, err
	}
	var pages, size int64
	if err := s.w.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&pages); err != nil {
		return 0, err
	}
	if err := s.w.QueryRowContext(ctx, `PRAGMA page_size`).Scan(&size); err != nil {
		return 0, err
	}
	return pages * size, nil
}

// postgresTombstonesSize is the size of the tombstones table with its
// indexes (and TOAST, visibility and free space maps), once vacuumed as
// autovacuum would.
func postgresTombstonesSize(ctx context.Context, s *Store) (int64, error) {
	if _, err := s.w.ExecContext(ctx, `VACUUM tombstones`); err != nil {
		return 0, err
	}
	var n int64
	err := s.w.QueryRowContext(ctx, `SELECT pg_total_relation_size('tombstones')`).Scan(&n)
	return n, err
}
