package store

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"example.com/paymentsd/store/storetest"
)

// TestPostgresUpgradeFromV1 applies migration 1 alone, stores a record the
// way version 1 did, and checks that Open upgrades the database and still
// finds it.
func TestPostgresUpgradeFromV1(t *testing.T) {
	t.Parallel()
	url := storetest.PostgresURL(t)
	ctx := context.Background()
	ms, err := migrations("postgres")
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		`CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL)`,
		ms[0].sql,
		`INSERT INTO schema_migrations VALUES (1, '` + ms[0].name + `')`,
		`INSERT INTO meta VALUES ('environment', 'sandbox')`,
		`INSERT INTO records (key, body_sha256, currency, amount, state, request_id, trace_id, caller,
			created_at, updated_at, settle_by, next_settle_at, lease_expires_at)
		 VALUES ('old key ü', '\x` + "0000000000000000000000000000000000000000000000000000000000000000" + `', 'EUR', 1, 2, '', '', '',
			now(), now(), now(), now(), now())`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("set up version 1: %v", err)
		}
	}
	s, err := Open(ctx, url, "sandbox", Options{})
	if err != nil {
		t.Fatalf("Open() on a version 1 database error = %v", err)
	}
	defer s.Close()
	if r, err := s.Get(ctx, "old key ü"); err != nil || r.State != StateSucceeded {
		t.Errorf("Get(old key) after upgrade = %v, %v; want the Succeeded record", r.State, err)
	}
	b, err := s.Begin(ctx, Claim{Key: "old key ü", Now: time.Now(), LeaseUntil: time.Now(), SettleBy: time.Now()})
	if err != nil || b.Outcome != Replay {
		t.Errorf("Begin(old key) after upgrade = %v, %v; want Replay", b.Outcome, err)
	}
}
