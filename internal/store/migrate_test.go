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

	"example.com/paymentsd/internal/store/storetest"

	"example.com/paymentsd/internal/record"
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
	if err != nil || r.State != record.Succeeded {
		t.Errorf("Get(old key) after upgrade = %v, %v; want the Succeeded record", r.State, err)
	}
	if !r.QuietUntil.IsZero() || !r.AttemptStartedAt.IsZero() || r.PriorState != 0 || !r.TombstonedAt.IsZero() {
		t.Errorf("Get(old key) after upgrade: QuietUntil %v AttemptStartedAt %v PriorState %v TombstonedAt %v, want all zero",
			r.QuietUntil, r.AttemptStartedAt, r.PriorState, r.TombstonedAt)
	}
	b, err := s.Begin(ctx, record.Claim{Request: record.Request{Key: "old key ü"}, LeaseTTL: time.Minute, Window: time.Hour}, nil)
	if err != nil || b.Verdict != record.Replay {
		t.Errorf("Begin(old key) after upgrade = %v, %v; want Replay", b.Verdict, err)
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
			backend: "sqlite", driver: SQLiteDriver,
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
			// The database is built as it was before 0003 (and any later
			// migration); Open then applies the rest.
			upTo := -1
			for i, m := range ms {
				if m.name == "0003_quiet_tombstones.sql" {
					upTo = i
				}
			}
			if upTo < 0 {
				t.Fatal("no migration 0003_quiet_tombstones.sql: this test upgrades across it")
			}
			db, err := sql.Open(tc.driver, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if _, err := db.ExecContext(ctx, `CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			for _, m := range ms[:upTo] {
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
				state record.State
				owner string
				lease time.Time
			}{
				{"unknown", record.OutcomeUnknown, "", zero},
				{"abandoned", record.InProgress, "dead", now.Add(-time.Minute)},
			} {
				if _, err := db.ExecContext(ctx, tc.insert, r.key, int(r.state), r.owner, tc.time(r.lease),
					tc.time(now.Add(-time.Minute)), tc.time(now.Add(-time.Hour)), tc.time(now.Add(time.Hour)), sum[:]); err != nil {
					t.Fatalf("insert %s: %v", r.key, err)
				}
			}
			db.Close()

			s, err := Open(ctx, url, "sandbox", Options{Now: func() time.Time { return now }, TakeoverGrace: -1})
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
			got, _, err := s.SettleDue(ctx, record.Settle{Owner: "settler/1", LeaseTTL: time.Minute}, nil, 10)
			if err != nil {
				t.Fatal(err)
			}
			prior := map[string]record.State{}
			for _, r := range got {
				prior[r.Key] = r.PriorState
			}
			if diff := cmp.Diff(map[string]record.State{"unknown": record.OutcomeUnknown, "abandoned": record.InProgress}, prior); diff != "" {
				t.Errorf("SettleDue after upgrade: keys and prior states (-want +got):\n%s", diff)
			}
			if _, err := s.Tombstone(ctx, "unknown"); !errors.Is(err, ErrNotFound) {
				t.Errorf("Tombstone(unknown) after upgrade error = %v, want ErrNotFound", err)
			}
		})
	}
}

// legacyEvent is a row as the inbox wrote it before migration 4: text
// columns only.
type legacyEvent struct {
	contentType, headers, body string
}

// legacyEvents are the rows an old inbox may hold. In SQLite, a
// Content-Type that is not UTF-8, which SQLite stored as sent and which
// made every read fail once it reached protobuf; PostgreSQL refused such
// deliveries, so its text holds only UTF-8.
func legacyEvents(backend string) []legacyEvent {
	contentType := "application/json; charset=\xe9"
	if backend == "postgres" {
		contentType = "application/json; charset=\ufffd"
	}
	return []legacyEvent{
		{contentType, `[["Content-Type","application/json; charset=\ufffd"],["X-A","b"]]`, `{"a":1}`},
		{"text/plain", `[]`, ""},
	}
}

// applyOld applies the backend's migrations before version 4, by hand,
// and inserts the legacy events.
func applyOld(t *testing.T, db *sql.DB, backend string) {
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
		if m.version < 4 {
			q = append(q, m.sql, fmt.Sprintf(`INSERT INTO schema_migrations VALUES (%d, '%s')`, m.version, m.name))
		}
	}
	q = append(q, `INSERT INTO meta VALUES ('environment', 'sandbox')`)
	for _, s := range q {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("set up the old schema: %v", err)
		}
	}
	for i, e := range legacyEvents(backend) {
		if _, err := db.Exec(d.q(`UPDATE event_counter SET last = $1`), i+1); err != nil {
			t.Fatal(err)
		}
		var body any
		if e.body != "" {
			body = []byte(e.body)
		}
		sum := sha256.Sum256([]byte(e.body))
		if _, err := db.Exec(d.q(`INSERT INTO events (seq, received_at, content_type, headers, body, body_sha256) VALUES ($1, $2, $3, $4, $5, $6)`),
			i+1, d.t(time.Now()), e.contentType, e.headers, body, sum[:]); err != nil {
			t.Fatalf("insert legacy event %d: %v", i+1, err)
		}
	}
}

// checkUpgradedInbox opens the database at url, which applyOld set up, and
// checks that the old events read back exactly, with their sizes counted
// in the inbox's usage, and that the inbox takes new events.
func checkUpgradedInbox(t *testing.T, url, backend string) {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, url, "sandbox", Options{})
	if err != nil {
		t.Fatalf("Open() on an old inbox error = %v", err)
	}
	defer s.Close()
	legacy := legacyEvents(backend)
	got, err := s.ListEvents(ctx, EventQuery{Limit: 10, MaxBytes: 1 << 20})
	if err != nil || len(got) != len(legacy) {
		t.Fatalf("ListEvents() after the upgrade = %d events, %v; want %d", len(got), err, len(legacy))
	}
	var total int64
	for i, e := range got {
		want := int64(len(legacy[i].body) + len(legacy[i].contentType) + len(legacy[i].headers))
		if e.ContentType != legacy[i].contentType || string(e.Body) != legacy[i].body || e.Size != want {
			t.Errorf("event %d after the upgrade: content type %q, body %q, Size %d; want %q, %q, %d",
				e.Sequence, e.ContentType, e.Body, e.Size, legacy[i].contentType, legacy[i].body, want)
		}
		total += e.Size
	}
	if len(got[0].Headers) != 2 || got[0].Headers[1] != (Header{"X-A", "b"}) {
		t.Errorf("event 1 headers after the upgrade = %q, want the two stored", got[0].Headers)
	}
	if u, err := s.InboxUsage(ctx); err != nil || u.StoredBytes != total {
		t.Errorf("InboxUsage() after the upgrade = %+v, %v; want %d stored", u, err, total)
	}
	e, err := s.AppendEvent(ctx, Event{ReceivedAt: time.Now(), Body: []byte("new"), BodySHA256: sha256.Sum256([]byte("new"))})
	if err != nil || e.Sequence != int64(len(legacy)+1) {
		t.Errorf("AppendEvent() after the upgrade = %d, %v; want sequence %d", e.Sequence, err, len(legacy)+1)
	}
	if u, err := s.InboxUsage(ctx); err != nil || u.StoredBytes != total+e.Size {
		t.Errorf("InboxUsage() after a new event = %+v, %v; want %d stored", u, err, total+e.Size)
	}
}

func TestSQLiteInboxUpgrade(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open(SQLiteDriver, path)
	if err != nil {
		t.Fatal(err)
	}
	applyOld(t, db, "sqlite")
	db.Close()
	checkUpgradedInbox(t, "sqlite:"+path, "sqlite")
}

func TestPostgresInboxUpgrade(t *testing.T) {
	t.Parallel()
	url := storetest.PostgresURL(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	applyOld(t, db, "postgres")
	db.Close()
	checkUpgradedInbox(t, url, "postgres")
}
