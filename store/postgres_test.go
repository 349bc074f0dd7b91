package store

import (
	"context"
	"testing"

	"example.com/paymentsd/store/storetest"
)

// TestPostgresStatementTimeout: every connection of the pool bounds its
// statements (retention's grace period relies on it), and the bound is
// not left lifted after the migrations.
func TestPostgresStatementTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := Open(ctx, storetest.PostgresURL(t), "sandbox", Options{MaxConns: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Hold every connection at once, so that each is asked.
	conns := make([]string, 3)
	for i := range conns {
		c, err := s.w.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.QueryRowContext(ctx, `SHOW statement_timeout`).Scan(&conns[i]); err != nil {
			t.Fatal(err)
		}
	}
	for i, got := range conns {
		if got != "30s" {
			t.Errorf("connection %d: statement_timeout = %q, want 30s", i, got)
		}
	}
}
