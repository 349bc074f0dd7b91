package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store/storetest"
)

// applyV6 applies the backend's migrations before version 7, by hand, and
// writes as version 6 did records in flight (one of them finished later
// by version 6's own statements), an OutcomeUnknown record due for
// settlement, and one settlement gave up on.
func applyV6(t *testing.T, db *sql.DB, backend string, now time.Time) {
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
		if m.version < 7 {
			q = append(q, m.sql, fmt.Sprintf(`INSERT INTO schema_migrations VALUES (%d, '%s')`, m.version, m.name))
		}
	}
	q = append(q, `INSERT INTO meta VALUES ('environment', 'sandbox')`)
	for _, s := range q {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("set up the version 6 schema: %v", err)
		}
	}
	body := sha256.Sum256([]byte(`{}`))
	for _, r := range []struct {
		key    string
		state  record.State
		owner  string
		gaveUp bool
	}{
		{"old-in-flight", record.InProgress, "paymentsd-old/1", false},
		{"old-rollout", record.InProgress, "paymentsd-old/2", false},
		{"old-unknown", record.OutcomeUnknown, "", false},
		{"old-gave-up", record.OutcomeUnknown, "", true},
	} {
		cols, vals := "", ""
		args := []any{r.key, body[:], int(r.state), d.t(now.Add(-time.Hour)), d.t(now.Add(time.Hour)), d.t(now.Add(time.Minute)), r.owner, r.gaveUp}
		if d.keyCol != "key" {
			cols, vals = ", key_hash", ", $9"
			args = append(args, d.k(r.key))
		}
		if _, err := db.Exec(d.q(`INSERT INTO records (key, body, body_sha256, currency, amount, state, request_id, trace_id, caller,
				created_at, updated_at, settle_by, next_settle_at, lease_owner, lease_expires_at, attempt_started_at,
				attempt_seq, attempt_kind, attempt_request_id, gave_up`+cols+`)
			VALUES ($1, '{}', $2, 'EUR', 1, $3, 'r', 't', '', $4, $4, $5, $4, $7, $6, $4, 1, 1, 'r', $8`+vals+`)`), args...); err != nil {
			t.Fatalf("insert a version 6 record: %v", err)
		}
	}
}

// checkUpgradedTo7 opens a database applyV6 set up: a holder's outcome on
// a record written before the upgrade leaves its journal row, written by
// the finish statement; version 6's own finish, as an older replica runs
// it during a rollout, leaves one row, its own; settlement finds the
// unknown record through records_due, and not the one given up.
func checkUpgradedTo7(t *testing.T, url, backend string, now time.Time) {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, url, "sandbox", Options{TakeoverGrace: -1, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatalf("Open() on a version 6 database error = %v", err)
	}
	defer s.Close()
	r, err := s.Get(ctx, "old-in-flight")
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.Finish(ctx, &r, record.Outcome{Owner: r.LeaseOwner, Result: record.Paid, HTTPRequests: 1, ProviderStatus: 201, Reply: []byte(`{}`)})
	if err != nil || v != record.Written {
		t.Fatalf("Finish() of a version 6 claim = %v, %v; want Written", v, err)
	}
	r, _ = s.Get(ctx, "old-in-flight")
	as, err := s.Attempts(ctx, r)
	if err != nil || len(as) != 1 || as[0].Owner != "paymentsd-old/1" || as[0].ProviderStatus != 201 || as[0].Number != 1 || as[0].Replica() != "paymentsd-old" {
		t.Errorf("Attempts() of the version 6 claim finished = %+v, %v; want its row, with the 201", as, err)
	}

	// Version 6's finish: its UPDATE, then its INSERT of the row.
	d := s.d
	if _, err := s.w.ExecContext(ctx, d.q(`
		UPDATE records SET state = 2, attempts = attempts + 1, provider_status = 200, reply = NULL, last_error = '', code = 0,
			updated_at = $2, next_settle_at = $3, settle_attempts = settle_attempts + 0, lease_owner = '', lease_expires_at = $3,
			quiet_until = $3
		WHERE `+d.keyCol+` = $1 AND lease_owner = 'paymentsd-old/2' AND state = 1`), d.k("old-rollout"), d.t(now), d.t(time.Time{})); err != nil {
		t.Fatal(err)
	}
	if _, err := s.w.ExecContext(ctx, d.q(`
		INSERT INTO attempts (`+d.keyCol+`, attempt, kind, owner, replica, request_id, started_at, ended_at,
			provider_status, http_requests, reply, state, code, error, abandoned)
		SELECT `+d.keyCol+`, attempt_seq, attempt_kind, 'paymentsd-old/2', 'paymentsd-old', attempt_request_id, attempt_started_at, $2,
			200, 1, NULL, 2, 0, '', $3
		FROM records WHERE `+d.keyCol+` = $1`), d.k("old-rollout"), d.t(now), false); err != nil {
		t.Fatal(err)
	}
	r, _ = s.Get(ctx, "old-rollout")
	if as, err := s.Attempts(ctx, r); err != nil || len(as) != 1 {
		t.Errorf("Attempts() after version 6's finish = %+v, %v; want its one row", as, err)
	}

	got, gave, err := s.SettleDue(ctx, record.Settle{Owner: "paymentsd-new/1", LeaseTTL: time.Minute}, nil, 10)
	if err != nil || len(got) != 1 || got[0].Key != "old-unknown" || len(gave) != 0 {
		t.Errorf("SettleDue() after the upgrade = %d acquired, %d given up, %v; want old-unknown", len(got), len(gave), err)
	}
	if backend == "sqlite" {
		var plan string
		var id, parent, unused int
		if err := s.w.QueryRowContext(ctx, `EXPLAIN QUERY PLAN `+s.stmts.dueUnknown, d.t(now), d.t(time.Time{}), "", 10).
			Scan(&id, &parent, &unused, &plan); err != nil {
			t.Fatal(err)
		}
		if want := "records_due"; !strings.Contains(plan, want) {
			t.Errorf("settlement's plan = %q, want it to use %s", plan, want)
		}
	}
}

func TestSQLiteUpgradeTo7(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC().Truncate(time.Microsecond)
	path := filepath.Join(t.TempDir(), "v6.db")
	db, err := sql.Open(SQLiteDriver, SQLiteDSN(path, true))
	if err != nil {
		t.Fatal(err)
	}
	applyV6(t, db, "sqlite", now)
	db.Close()
	checkUpgradedTo7(t, "sqlite:"+path, "sqlite", now)
}

func TestPostgresUpgradeTo7(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC().Truncate(time.Microsecond)
	url := storetest.PostgresURL(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	applyV6(t, db, "postgres", now)
	db.Close()
	checkUpgradedTo7(t, url, "postgres", now)
}
