package store_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
)

// BenchmarkPayment is one payment's records on a SQLite file (WAL,
// synchronous=FULL) with the build's driver: Begin then Finish, as
// paymentsd writes them, against FloorExec's INSERT then UPDATE, the
// record floor's. c=1 commits each alone; c=32 shares commits. Run it once
// per driver tag (see docs/performance.md, "The SQLite driver").
func BenchmarkPayment(b *testing.B) {
	for _, c := range []int{1, 32} {
		for _, kind := range []string{"records", "floor"} {
			b.Run(fmt.Sprintf("%s/c=%d", kind, c), func(b *testing.B) {
				ctx := context.Background()
				s, err := store.Open(ctx, storetest.SQLiteURL(b), "sandbox", store.Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				if err := s.FloorExec(ctx, `CREATE TABLE floor_records (key TEXT PRIMARY KEY, body BLOB NOT NULL, state INTEGER NOT NULL,
					status INTEGER NOT NULL DEFAULT 0, reply BLOB, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL)`); err != nil {
					b.Fatal(err)
				}
				pay := benchRecords
				if kind == "floor" {
					pay = benchFloor
				}
				var n atomic.Int64
				b.SetParallelism((c + 1) / 2) // 2 cores: GOMAXPROCS × this goroutines
				if c == 1 {
					b.SetParallelism(1)
				}
				b.ResetTimer()
				cpu0 := cpuTime()
				defer func() { b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op") }()
				if c == 1 {
					for b.Loop() {
						if err := pay(ctx, s, "k"+strconv.FormatInt(n.Add(1), 10)); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := pay(ctx, s, "k"+strconv.FormatInt(n.Add(1), 10)); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(s.Commits())/float64(b.N), "commits/op")
			})
		}
	}
}

// cpuTime is the CPU time this process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var (
	benchBody  = []byte(`{"amountMoney":{"currency":"USD","amount":1250},"idempotencyKey":"k123456"}`)
	benchReply = []byte(`{"id":"pay_bench","status":"COMPLETED","amountMoney":{"currency":"USD","amount":1250}}`)
)

func benchRecords(ctx context.Context, s *store.Store, key string) error {
	b, err := s.Begin(ctx, record.Claim{Request: record.Request{Key: key, Body: benchBody, BodySHA256: sha256.Sum256(benchBody), Currency: "USD",
		Amount: 1250, RequestID: "r"}, Owner: "o", LeaseTTL: time.Minute, Window: time.Hour, Quiet: time.Minute}, nil)
	if err != nil {
		return err
	}
	if b.Verdict != record.Acquired {
		return fmt.Errorf("Begin(%s) = %v, want Acquired", key, b.Verdict)
	}
	v, err := s.Finish(ctx, &b.Record, record.Outcome{Owner: "o", Result: record.Paid, HTTPRequests: 1, ProviderStatus: 200, Reply: benchReply})
	if err == nil && v != record.Written {
		return fmt.Errorf("Finish(%s) = %v, want Written", key, v)
	}
	return err
}

func benchFloor(ctx context.Context, s *store.Store, key string) error {
	now := time.Now().UnixMicro()
	if err := s.FloorExec(ctx, `INSERT INTO floor_records (key, body, state, created_at, updated_at) VALUES ($1, $2, 1, $3, $3)`, key, benchBody, now); err != nil {
		return err
	}
	done := make(chan error, 1)
	s.FloorExecLater(func(err error) { done <- err }, `UPDATE floor_records SET state = 2, status = $2, reply = $3, updated_at = $4 WHERE key = $1`, key, 200, benchReply, now)
	return <-done
}
