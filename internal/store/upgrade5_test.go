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

// applyV4 applies the backend's migrations before version 5, by hand, and
// writes an OutcomeUnknown record and a tombstone as version 4 did.
func applyV4(t *testing.T, db *sql.DB, backend string) {
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
		if m.version < 5 {
			q = append(q, m.sql, fmt.Sprintf(`INSERT INTO schema_migrations VALUES (%d, '%s')`, m.version, m.name))
		}
	}
	q = append(q, `INSERT INTO meta VALUES ('environment', 'sandbox')`)
	for _, s := range q {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("set up the version 4 schema: %v", err)
		}
	}
	now := time.Now()
	body := sha256.Sum256([]byte(`{}`))
	cols, vals := "", ""
	if d.keyCol != "key" {
		cols, vals = ", key_hash", ", $7"
	}
	if _, err := db.Exec(d.q(`INSERT INTO records (key, body_sha256, currency, amount, state, request_id, trace_id, caller,
			created_at, updated_at, settle_by, next_settle_at, lease_expires_at`+cols+`)
		VALUES ($1, $2, 'EUR', 1, $3, 'r', 't', 'spiffe://old', $4, $4, $5, $4, $6`+vals+`)`),
		append([]any{"old-unknown", body[:], int(record.OutcomeUnknown), d.t(now), d.t(now.Add(-time.Hour)), d.t(time.Time{})},
			func() []any {
				if d.keyCol == "key" {
					return nil
				}
				return []any{d.k("old-unknown")}
			}()...)...); err != nil {
		t.Fatalf("insert a version 4 record: %v", err)
	}
	ts := keySHA256("old-gone")
	if _, err := db.Exec(d.q(`INSERT INTO tombstones (`+tombstoneColumns+`) VALUES ($1, $2, $3, $4, $5, $5, $5)`),
		ts[:], body[:], int(record.Succeeded), false, d.t(now)); err != nil {
		t.Fatalf("insert a version 4 tombstone: %v", err)
	}
}

// checkUpgradedTo5 opens a database applyV4 set up: its record lists and
// resolves, its tombstone's caller is unknown, and a claim that owns its
// keys only is told the tombstone is Expired (not NotOwned).
func checkUpgradedTo5(t *testing.T, url string) {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, url, "sandbox", Options{})
	if err != nil {
		t.Fatalf("Open() on a version 4 database error = %v", err)
	}
	defer s.Close()
	p, err := s.ListRecords(ctx, ListQuery{States: []record.State{record.OutcomeUnknown}, Limit: 10, ByCaller: true, Caller: "spiffe://old"})
	if err != nil || len(p.Records) != 1 || p.Records[0].Key != "old-unknown" || !p.Records[0].ResolvedAt.IsZero() {
		t.Fatalf("ListRecords() after the upgrade = %+v, %v; want the old record", p.Records, err)
	}
	if _, err := s.Resolve(ctx, "old-unknown", record.Resolve{To: record.NotCreated}, AuditInfo{Evidence: "e", Actor: "a"}); err != nil {
		t.Errorf("Resolve() after the upgrade error = %v", err)
	}
	tomb, err := s.Tombstone(ctx, "old-gone")
	if err != nil || tomb.CallerKnown {
		t.Errorf("Tombstone() after the upgrade = %+v, %v; want one whose caller is unknown", tomb, err)
	}
	b, err := s.Begin(ctx, record.Claim{Request: record.Request{Key: "old-gone", Body: []byte(`{}`), BodySHA256: sha256.Sum256([]byte(`{}`)), Caller: "spiffe://new"},
		OwnKeysOnly: true, Owner: "o", LeaseTTL: time.Minute, Window: time.Hour}, nil)
	if err != nil || b.Verdict != record.Expired {
		t.Errorf("Begin(old tombstone, OwnKeysOnly) = %v, %v; want Expired", b.Verdict, err)
	}
}

func TestSQLiteUpgradeTo5(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "v4.db")
	db, err := sql.Open(SQLiteDriver, SQLiteDSN(path, true))
	if err != nil {
		t.Fatal(err)
	}
	applyV4(t, db, "sqlite")
	db.Close()
	checkUpgradedTo5(t, "sqlite:"+path)
}

func TestPostgresUpgradeTo5(t *testing.T) {
	t.Parallel()
	url := storetest.PostgresURL(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	applyV4(t, db, "postgres")
	db.Close()
	checkUpgradedTo5(t, url)
}
