package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"example.com/paymentsd/internal/store/storetest"

	"example.com/paymentsd/internal/record"
)

// applyV5 applies the backend's migrations before version 6, by hand, and
// writes as version 5 did a record in flight (its holder, of another
// process, died), an OutcomeUnknown record and an audit entry.
func applyV5(t *testing.T, db *sql.DB, backend string) {
	t.Helper()
	ms, err := migrations(backend)
	if err != nil {
		t.Fatal(err)
	}
	d := sqliteDialect
	if backend == "postgres" {
		d = postgresDialect
	}
	q := []string{`CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL)`}
	for _, m := range ms {
		if m.version < 6 {
			q = append(q, m.sql, fmt.Sprintf(`INSERT INTO schema_migrations VALUES (%d, '%s')`, m.version, m.name))
		}
	}
	q = append(q, `INSERT INTO meta VALUES ('environment', 'sandbox')`)
	for _, s := range q {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("set up the version 5 schema: %v", err)
		}
	}
	now := time.Now()
	body := sha256.Sum256([]byte(`{}`))
	for _, r := range []struct {
		key   string
		state record.State
		owner string
	}{
		{"old-in-flight", record.InProgress, "paymentsd-old/claim"},
		{"old-unknown", record.OutcomeUnknown, ""},
	} {
		cols, vals := "", ""
		args := []any{r.key, body[:], int(r.state), d.t(now.Add(-time.Hour)), d.t(now.Add(time.Hour)), d.t(now.Add(-time.Minute)), r.owner}
		if d.keyCol != "key" {
			cols, vals = ", key_hash", ", $8"
			args = append(args, d.k(r.key))
		}
		if _, err := db.Exec(d.q(`INSERT INTO records (key, body, body_sha256, currency, amount, state, request_id, trace_id, caller,
				created_at, updated_at, settle_by, next_settle_at, lease_owner, lease_expires_at, attempt_started_at`+cols+`)
			VALUES ($1, '{}', $2, 'EUR', 1, $3, 'r', 't', '', $4, $4, $5, $4, $7, $6, $4`+vals+`)`), args...); err != nil {
			t.Fatalf("insert a version 5 record: %v", err)
		}
	}
	sum := keySHA256("old-unknown")
	if _, err := db.Exec(d.q(`INSERT INTO audit_entries (key_sha256, record_created_at, created_at, actor, from_state, to_state,
			outcome, evidence, request_id, reply_recorded, gave_up) VALUES ($1, $2, $2, 'admin', 4, 3, 3, 'e', 'rid', $3, $3)`),
		sum[:], d.t(now.Add(-time.Hour)), false); err != nil {
		t.Fatalf("insert a version 5 audit entry: %v", err)
	}
}

// checkUpgradedTo6 opens a database applyV5 set up: the record in flight
// counts its attempt as number 1, and taking it over writes that
// attempt's row (abandoned); settlement's claim of the unknown record is
// its attempt 1; the old audit entry reads with no caller request ID.
func checkUpgradedTo6(t *testing.T, url string) {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, url, "sandbox", Options{TakeoverGrace: -1})
	if err != nil {
		t.Fatalf("Open() on a version 5 database error = %v", err)
	}
	defer s.Close()
	r, err := s.Get(ctx, "old-in-flight")
	if err != nil || r.AttemptSeq != 1 {
		t.Fatalf("Get(in flight) after the upgrade = %+v, %v; want attempt 1 in flight", r, err)
	}
	as, err := s.Attempts(ctx, r)
	if err != nil || len(as) != 1 || !as[0].InFlight || as[0].Owner != "paymentsd-old/claim" || as[0].Replica() != "paymentsd-old" {
		t.Errorf("Attempts(in flight) after the upgrade = %+v, %v; want the one in flight", as, err)
	}
	claimed, _, err := s.SettleDue(ctx, record.Settle{Owner: "paymentsd-new/1", LeaseTTL: time.Minute}, nil, 10)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("SettleDue() after the upgrade = %d records, %v; want both", len(claimed), err)
	}
	for _, key := range []string{"old-in-flight", "old-unknown"} {
		r, err := s.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		as, err := s.Attempts(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, a := range as {
			got = append(got, fmt.Sprintf("%d %v %s abandoned=%v in-flight=%v", a.Number, a.Kind, a.Owner, a.Abandoned, a.InFlight))
		}
		// The record in flight counted its attempt as 1 in the migration.
		want := map[string][]string{
			"old-in-flight": {"1 unspecified paymentsd-old/claim abandoned=true in-flight=false", "2 settlement paymentsd-new/1 abandoned=false in-flight=true"},
			"old-unknown":   {"1 settlement paymentsd-new/1 abandoned=false in-flight=true"},
		}[key]
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("attempts of %s after a settlement claim = %q, want %q", key, got, want)
		}
	}
	u, err := s.Get(ctx, "old-unknown")
	if err != nil {
		t.Fatal(err)
	}
	es, err := s.AuditEntries(ctx, u)
	if err != nil || len(es) != 1 || es[0].RequestID != "rid" || es[0].CallerRequestID != "" {
		t.Errorf("AuditEntries() after the upgrade = %+v, %v; want the old entry, no caller request ID", es, err)
	}
}

func TestSQLiteUpgradeTo6(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "v5.db")
	db, err := sql.Open(SQLiteDriver, SQLiteDSN(path, true))
	if err != nil {
		t.Fatal(err)
	}
	applyV5(t, db, "sqlite")
	db.Close()
	checkUpgradedTo6(t, "sqlite:"+path)
}

func TestPostgresUpgradeTo6(t *testing.T) {
	t.Parallel()
	url := storetest.PostgresURL(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	applyV5(t, db, "postgres")
	db.Close()
	checkUpgradedTo6(t, url)
}
