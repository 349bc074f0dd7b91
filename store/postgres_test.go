package store

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"example.com/paymentsd/store/storetest"
)

// TestPostgresStatementTimeout: every statement of the store's
// transactions, the batcher's and the others, is bounded (retention's
// grace period relies on it), by a setting that ends with the transaction:
// behind a pooler in transaction mode, a session setting would stay with
// the server connection, for whichever client gets it next, and a startup
// parameter is refused.
func TestPostgresStatementTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := Open(ctx, storetest.PostgresURL(t), "sandbox", Options{MaxConns: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	show := func(tx *sql.Tx, into *string) error {
		return tx.QueryRowContext(ctx, `SHOW statement_timeout`).Scan(into)
	}
	var inTransact, inBatch string
	if err := s.transact(ctx, func(tx *sql.Tx) error { return show(tx, &inTransact) }); err != nil {
		t.Fatal(err)
	}
	if err := s.batch.run(ctx, func(_ context.Context, tx *sql.Tx, _ time.Time) error { return show(tx, &inBatch) }); err != nil {
		t.Fatal(err)
	}
	if inTransact != "30s" || inBatch != "30s" {
		t.Errorf("statement_timeout in a transaction = %q, in a batch = %q; want 30s", inTransact, inBatch)
	}
}

// TestPostgresSessionsKeepNothing: after payments, lookups and webhook
// events, no session of the pool holds a prepared statement or a setting
// of the store's: nothing a pooler in transaction mode would hand to
// another client, or lose.
func TestPostgresSessionsKeepNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const conns = 3
	s, err := Open(ctx, storetest.PostgresURL(t), "sandbox", Options{MaxConns: conns})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, key := range []string{"a", "b", "c"} {
		if _, err := s.Begin(ctx, Claim{Key: key, Body: []byte("{}"), Owner: "o", LeaseTTL: time.Minute, Window: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Finish(ctx, Finish{Key: key, Owner: "o", State: StateSucceeded, AddAttempts: 1, ProviderStatus: 200, Reply: []byte("{}")}); err != nil {
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
	// Hold every connection at once, so that each is asked.
	for i := range conns {
		c, err := s.w.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var timeout string
		var prepared int
		if err := c.QueryRowContext(ctx, `SELECT current_setting('statement_timeout'), (SELECT count(*) FROM pg_prepared_statements)`).Scan(&timeout, &prepared); err != nil {
			t.Fatal(err)
		}
		if timeout != "0" || prepared != 0 {
			t.Errorf("session %d: statement_timeout = %q and %d prepared statements, want the server's default (0) and none", i, timeout, prepared)
		}
	}
}
