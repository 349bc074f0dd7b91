package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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
	r, err := s.Get(ctx, "old key ü")
	if err != nil || r.State != StateSucceeded {
		t.Errorf("Get(old key) after upgrade = %v, %v; want the Succeeded record", r.State, err)
	}
	if !r.QuietUntil.IsZero() || !r.AttemptStartedAt.IsZero() || r.PriorState != 0 || !r.TombstonedAt.IsZero() {
		t.Errorf("Get(old key) after upgrade: QuietUntil %v AttemptStartedAt %v PriorState %v TombstonedAt %v, want all zero",
			r.QuietUntil, r.AttemptStartedAt, r.PriorState, r.TombstonedAt)
	}
	b, err := s.Begin(ctx, Claim{Key: "old key ü", LeaseTTL: time.Minute, Window: time.Hour})
	if err != nil || b.Outcome != Replay {
		t.Errorf("Begin(old key) after upgrade = %v, %v; want Replay", b.Outcome, err)
	}
}

// TestUpgradeToQuietAndTombstones stores records the way the version before
// quiet periods and tombstones did, on both backends, and checks that
// after the upgrade they read with no quiet period, no prior state and no
// tombstone, so that settlement picks them up at once.
func TestUpgradeToQuietAndTombstones(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	zero := time.Time{}
	for _, tc := range []struct {
		backend, driver string
		url             func(t *testing.T) (url, dsn string)
		// insert is the version-2 INSERT of a record, with $1 the key,
		// $2 its state, $3 lease owner, $4 lease end, $5 next settlement,
		// $6 created, $7 settle by.
		insert string
		time   func(time.Time) any
	}{
		{
			backend: "sqlite", driver: "sqlite",
			url: func(t *testing.T) (string, string) {
				path := filepath.Join(t.TempDir(), "db")
				return "sqlite:" + path, path
			},
			insert: `INSERT INTO records (key, body_sha256, currency, amount, state, request_id, trace_id, caller,
				created_at, updated_at, settle_by, next_settle_at, lease_owner, lease_expires_at)
				VALUES (?1, ?8, 'EUR', 1, ?2, '', '', '', ?6, ?6, ?7, ?5, ?3, ?4)`,
			time: func(t time.Time) any { return t.UnixMicro() },
		},
		{
			backend: "postgres", driver: "pgx",
			url: func(t *testing.T) (string, string) {
				u := storetest.PostgresURL(t)
				return u, u
			},
			insert: `INSERT INTO records (key, key_hash, body_sha256, currency, amount, state, request_id, trace_id, caller,
				created_at, updated_at, settle_by, next_settle_at, lease_owner, lease_expires_at)
				VALUES ($1, sha256(convert_to($1, 'UTF8')), $8, 'EUR', 1, $2, '', '', '', $6, $6, $7, $5, $3, $4)`,
			time: func(t time.Time) any { return t },
		},
	} {
		t.Run(tc.backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url, dsn := tc.url(t)
			ms, err := migrations(tc.backend)
			if err != nil {
				t.Fatal(err)
			}
			last := ms[len(ms)-1]
			if last.name != "0003_quiet_tombstones.sql" {
				t.Fatalf("last migration is %s: this test upgrades to 0003_quiet_tombstones.sql", last.name)
			}
			db, err := sql.Open(tc.driver, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if _, err := db.ExecContext(ctx, `CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			for _, m := range ms[:len(ms)-1] {
				if _, err := db.ExecContext(ctx, m.sql); err != nil {
					t.Fatalf("migration %s: %v", m.name, err)
				}
				if _, err := db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO schema_migrations VALUES (%d, '%s')`, m.version, m.name)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := db.ExecContext(ctx, `INSERT INTO meta VALUES ('environment', 'sandbox')`); err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(nil)
			for _, r := range []struct {
				key   string
				state State
				owner string
				lease time.Time
			}{
				{"unknown", StateOutcomeUnknown, "", zero},
				{"abandoned", StateInProgress, "dead", now.Add(-time.Minute)},
			} {
				if _, err := db.ExecContext(ctx, tc.insert, r.key, int(r.state), r.owner, tc.time(r.lease),
					tc.time(now.Add(-time.Minute)), tc.time(now.Add(-time.Hour)), tc.time(now.Add(time.Hour)), sum[:]); err != nil {
					t.Fatalf("insert %s: %v", r.key, err)
				}
			}
			db.Close()

			s, err := Open(ctx, url, "sandbox", Options{Now: func() time.Time { return now }})
			if err != nil {
				t.Fatalf("Open() on the previous version error = %v", err)
			}
			defer s.Close()
			for _, k := range []string{"unknown", "abandoned"} {
				r, err := s.Get(ctx, k)
				if err != nil {
					t.Fatalf("Get(%s) after upgrade error = %v", k, err)
				}
				if !r.QuietUntil.IsZero() || !r.AttemptStartedAt.IsZero() || r.PriorState != 0 || !r.TombstonedAt.IsZero() {
					t.Errorf("Get(%s) after upgrade: QuietUntil %v AttemptStartedAt %v PriorState %v TombstonedAt %v, want all zero",
						k, r.QuietUntil, r.AttemptStartedAt, r.PriorState, r.TombstonedAt)
				}
			}
			got, err := s.ClaimDue(ctx, "settler", time.Minute, 0, 10)
			if err != nil {
				t.Fatal(err)
			}
			prior := map[string]State{}
			for _, r := range got {
				prior[r.Key] = r.PriorState
			}
			if diff := cmp.Diff(map[string]State{"unknown": StateOutcomeUnknown, "abandoned": StateInProgress}, prior); diff != "" {
				t.Errorf("ClaimDue after upgrade: keys and prior states (-want +got):\n%s", diff)
			}
			if _, err := s.Tombstone(ctx, "unknown"); !errors.Is(err, ErrNotFound) {
				t.Errorf("Tombstone(unknown) after upgrade error = %v, want ErrNotFound", err)
			}
		})
	}
}
