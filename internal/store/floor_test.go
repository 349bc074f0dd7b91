package store

import (
	"context"
	"testing"

	"example.com/paymentsd/internal/store/storetest"
)

// The record floor's statements run through the group commit: an INSERT
// is durable when FloorExec returns, an UPDATE when FloorExecLater's done
// is called, and a failing statement fails alone.
func TestFloorExec(t *testing.T) {
	t.Parallel()
	for _, b := range []struct {
		name, blob string
		url        func(testing.TB) string
	}{{"sqlite", "BLOB", storetest.SQLiteURL}, {"postgres", "BYTEA", storetest.PostgresURL}} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s, err := Open(ctx, b.url(t), "sandbox", Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.FloorExec(ctx, `CREATE TABLE floor_records (key TEXT PRIMARY KEY, body `+b.blob+` NOT NULL, state INTEGER NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			insert := `INSERT INTO floor_records (key, body, state) VALUES ($1, $2, 1)`
			if err := s.FloorExec(ctx, insert, "k1", []byte("body")); err != nil {
				t.Fatalf("FloorExec(INSERT k1) = %v", err)
			}
			if err := s.FloorExec(ctx, insert, "k1", []byte("again")); err == nil {
				t.Errorf("FloorExec(INSERT k1 again) = nil; want the primary key's error")
			}
			done := make(chan error, 1)
			s.FloorExecLater(func(err error) { done <- err }, `UPDATE floor_records SET state = 2 WHERE key = $1`, "k1")
			if err := <-done; err != nil {
				t.Fatalf("FloorExecLater(UPDATE k1) = %v", err)
			}
			var state int
			var body []byte
			if err := s.w.QueryRowContext(ctx, s.d.q(`SELECT state, body FROM floor_records WHERE key = $1`), "k1").Scan(&state, &body); err != nil || state != 2 || string(body) != "body" {
				t.Errorf("k1's row = state %d, body %q, %v; want 2, %q", state, body, err, "body")
			}
		})
	}
}
