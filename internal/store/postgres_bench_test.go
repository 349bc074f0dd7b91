package store_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
)

// BenchmarkPostgresPayment is BenchmarkPayment's records on PostgreSQL
// (PAYMENTS_TEST_POSTGRES_URL, a fresh database): one payment's Begin then
// Finish, and a lookup (Get) of a recorded key, at c=1 and c=32. It is
// what the choice of how statements reach the server (see openPostgres)
// costs.
func BenchmarkPostgresPayment(b *testing.B) {
	for _, c := range []int{1, 32} {
		for _, kind := range []string{"records", "get"} {
			b.Run(fmt.Sprintf("%s/c=%d", kind, c), func(b *testing.B) {
				ctx := context.Background()
				s, err := store.Open(ctx, storetest.PostgresURL(b), "sandbox", store.Options{MaxConns: 32})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				pay := benchRecords
				if kind == "get" {
					if err := benchRecords(ctx, s, "got"); err != nil {
						b.Fatal(err)
					}
					pay = func(ctx context.Context, s *store.Store, _ string) error {
						_, err := s.Get(ctx, "got")
						return err
					}
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
			})
		}
	}
}
