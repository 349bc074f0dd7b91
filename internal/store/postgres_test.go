package store

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"example.com/paymentsd/internal/store/storetest"

	"example.com/paymentsd/internal/record"
)

// TestPostgresStatementTimeout: every statement of the store's
// transactions, the batcher's and the others, is bounded (retention's
// grace period relies on it), by a setting that ends with the transaction
// or the connection: behind a pooler in transaction mode, a session
// setting would stay with the server connection, for whichever client gets
// it next, and a startup parameter is refused, so each transaction sets it;
// straight to PostgreSQL, every connection has it as a startup parameter,
// and no transaction spends a round trip on it.
func TestPostgresStatementTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		url  func(testing.TB) string
	}{
		{"direct", storetest.PostgresURL},
		{"pgbouncer", func(t testing.TB) string { return storetest.PooledPostgresURL(t, 2) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s, err := Open(ctx, tc.url(t), "sandbox", Options{MaxConns: 3})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			show := func(tx *sql.Tx, into *string) error {
				return tx.QueryRowContext(ctx, `SHOW statement_timeout`).Scan(into)
			}
			// Three at once, so that the pool's every connection is seen.
			var wg sync.WaitGroup
			var inTransact, inBatch [3]string
			for i := range inTransact {
				wg.Go(func() {
					if err := s.transact(ctx, func(tx *sql.Tx, _ time.Time) error { return show(tx, &inTransact[i]) }); err != nil {
						t.Error(err)
					}
					if err := s.batch.run(ctx, func(_ context.Context, tx *sql.Tx, _ time.Time) error { return show(tx, &inBatch[i]) }); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			for i := range inTransact {
				if inTransact[i] != "30s" || inBatch[i] != "30s" {
					t.Errorf("statement_timeout in a transaction = %q, in a batch = %q; want 30s", inTransact[i], inBatch[i])
				}
			}
		})
	}
}

// TestPostgresTransactionClock: the clock a store's transaction decides by,
// read by the round trip that begins it (pgtx.go), is the transaction's
// now(), to the microsecond, directly and through a pooler, in a batch as
// in any other transaction.
func TestPostgresTransactionClock(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		url  func(testing.TB) string
	}{
		{"direct", storetest.PostgresURL},
		{"pgbouncer", func(t testing.TB) string { return storetest.PooledPostgresURL(t, 2) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s, err := Open(ctx, tc.url(t), "sandbox", Options{MaxConns: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			check := func(what string, tx *sql.Tx, now time.Time) error {
				var server time.Time
				if err := tx.QueryRowContext(ctx, `SELECT now()`).Scan(&server); err != nil {
					return err
				}
				if !now.Equal(server) || now.Location() != time.UTC {
					t.Errorf("%s: the store's clock = %v, want the transaction's now() %v, in UTC", what, now, server.UTC())
				}
				return nil
			}
			for range 3 {
				if err := s.transact(ctx, func(tx *sql.Tx, now time.Time) error { return check("transact", tx, now) }); err != nil {
					t.Fatal(err)
				}
				if err := s.batch.run(ctx, func(_ context.Context, tx *sql.Tx, now time.Time) error { return check("batch", tx, now) }); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestPostgresSessionsKeepNothing: through a pooler in transaction mode,
// after payments, lookups and webhook events, the server session holds no
// prepared statement and no setting of the store's: nothing the pooler
// would hand to another client, or lose. The pooler's pool is one server
// session, so every transaction ran in it, and a query through the pooler
// sees what they left there.
func TestPostgresSessionsKeepNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pooled := storetest.PooledPostgresURL(t, 1)
	s, err := Open(ctx, pooled, "sandbox", Options{MaxConns: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.pg.pooled.Load() {
		t.Errorf("Open through PgBouncer: no pooler detected")
	}
	for _, key := range []string{"a", "b", "c"} {
		b, err := s.Begin(ctx, record.Claim{Request: record.Request{Key: key, Body: []byte("{}")}, Owner: "o", LeaseTTL: time.Minute, Window: time.Hour}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Finish(ctx, &b.Record, record.Outcome{Owner: "o", Result: record.Paid, HTTPRequests: 1, ProviderStatus: 200, Reply: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, key); err != nil {
			t.Fatal(err)
		}
		if _, err := s.AppendEvent(ctx, Event{ReceivedAt: time.Now(), Body: []byte(key)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.ListEvents(ctx, EventQuery{Limit: 10}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Tombstone(ctx, "a"); err != nil && !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	if _, _, err := s.SettleDue(ctx, record.Settle{Owner: "settler/1", LeaseTTL: time.Minute, Quiet: time.Minute}, nil, 10); err != nil {
		t.Fatal(err)
	}

	db, err := sql.Open("pgx", pooled)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var timeout string
	var prepared int
	if err := db.QueryRowContext(ctx, `SELECT current_setting('statement_timeout'), (SELECT count(*) FROM pg_prepared_statements)`,
		pgx.QueryExecModeSimpleProtocol).Scan(&timeout, &prepared); err != nil {
		t.Fatal(err)
	}
	if timeout != "0" || prepared != 0 {
		t.Errorf("the server session: statement_timeout = %q and %d prepared statements, want the server's default (0) and none", timeout, prepared)
	}
}

// TestPostgresPoolerDetected: connections straight to PostgreSQL keep
// prepared statements (cheaper), through PgBouncer they don't, and a URL
// that asks for prepared statements through PgBouncer is refused at Open
// rather than failing payment after payment.
func TestPostgresPoolerDetected(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := storetest.PostgresURL(t)
	bouncer := storetest.StartPgBouncer(t, direct, 2)
	for _, tt := range []struct {
		name       string
		url        string
		wantPooled bool
		wantMode   pgx.QueryExecMode
	}{
		{"direct", direct, false, pgx.QueryExecModeCacheStatement},
		{"PgBouncer", bouncer.URL(direct), true, pgx.QueryExecModeExec},
		{"PgBouncer, exec asked for", bouncer.URL(direct) + "&default_query_exec_mode=exec", true, pgx.QueryExecModeExec},
		{"direct, exec asked for", direct + "&default_query_exec_mode=exec", false, pgx.QueryExecModeExec},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Open(ctx, tt.url, "sandbox", Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got, mode := s.pg.pooled.Load(), pgx.QueryExecMode(s.pg.v.Load()); got != tt.wantPooled || mode != tt.wantMode {
				t.Errorf("pooler detected = %v, mode %v; want %v, %v", got, mode, tt.wantPooled, tt.wantMode)
			}
			if err := s.CheckWrite(ctx); err != nil {
				t.Errorf("CheckWrite() = %v", err)
			}
			// Direct, every statement is bounded, reads too; through
			// PgBouncer, only the transactions' (see
			// TestPostgresStatementTimeout), since it refuses startup
			// parameters.
			var timeout string
			if err := s.r.QueryRowContext(ctx, `SHOW statement_timeout`).Scan(&timeout); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]string{false: "30s", true: "0"}[tt.wantPooled]; timeout != want {
				t.Errorf("statement_timeout outside a transaction = %q, want %q", timeout, want)
			}
		})
	}
	t.Run("PgBouncer, cache_statement asked for", func(t *testing.T) {
		s, err := Open(ctx, bouncer.URL(direct)+"&default_query_exec_mode=cache_statement", "sandbox", Options{})
		if err == nil {
			s.Close()
			t.Fatal("Open with prepared statements through PgBouncer succeeded, want a refusal")
		}
	})
}
