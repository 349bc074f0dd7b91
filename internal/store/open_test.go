package store_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
)

const sentinel = "PGPASS_SENTINEL_91c"

func TestOpenErrorsHideThePassword(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, url string }{
		{"connection refused", "postgres://app:" + sentinel + "@127.0.0.1:1/payments?sslmode=disable&connect_timeout=5"},
		{"password in query", "postgresql://app@127.0.0.1:1/payments?sslmode=disable&password=" + sentinel},
		{"bad port", "postgres://app:" + sentinel + "@127.0.0.1:notaport/payments"},
		{"bad escape", "postgres://app:" + sentinel + "%zz@127.0.0.1:1/payments"},
		{"bad option", "postgres://app:" + sentinel + "@127.0.0.1:1/payments?sslmode=sometimes"},
		{"escaped", "postgres://app:" + sentinel + "%2F%40x@127.0.0.1:1/payments?sslmode=disable"},
		{"unknown scheme", "mysql://app:" + sentinel + "@127.0.0.1/payments"},
		{"unescaped #", "postgres://app:12#" + sentinel + "@127.0.0.1:1/payments?sslmode=disable"},
		{"unescaped /", "postgres://app:12/" + sentinel + "@127.0.0.1:1/payments?sslmode=disable"},
		{"unescaped ?", "postgres://app:12?" + sentinel + "@127.0.0.1:1/payments&sslmode=disable"},
		// libpq, and so pgx, ends the password at its first '@': the rest
		// would be dialled as the host, and quoted by "no such host".
		{"unescaped @", "postgres://app:" + sentinel + "@" + sentinel + "@127.0.0.1:1/payments?sslmode=disable"},
		{"unescaped @, two", "postgres://app:" + sentinel + "@" + sentinel + "@" + sentinel + "@127.0.0.1:1/payments"},
		{"unescaped @ in the user", "postgres://" + sentinel + "@corp:" + sentinel + "@127.0.0.1:1/payments"},
		{"unescaped / and @", "postgres://app:" + sentinel + "/" + sentinel + "@" + sentinel + "@127.0.0.1:1/payments"},
		{"@ in a query without a path", "postgres://127.0.0.1:1?user=" + sentinel + "@x&password=" + sentinel},
		{"no host", "postgres://app:" + sentinel + "@/payments"},
		{"parameter without =", "postgres://app:" + sentinel + "@127.0.0.1:1/payments?" + sentinel},
		{"parameter with two =", "postgres://app@127.0.0.1:1/payments?password=" + sentinel + "=" + sentinel},
		{"bad escape in the query", "postgres://app@127.0.0.1:1/payments?password=" + sentinel + "%g0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := store.Open(ctx, tc.url, "sandbox", store.Options{})
			if err == nil {
				s.Close()
				t.Fatalf("Open(%s) error = nil, want an error", tc.name)
			}
			t.Log(err)
			for _, form := range []string{sentinel, strings.ToLower(sentinel), "%2F%40x", "/@x"} {
				if strings.Contains(err.Error(), form) {
					t.Errorf("Open(%s) error %q contains the password (%q)", tc.name, err, form)
				}
			}
		})
	}
}

// TestRedactedURL: what of a database URL may be shown holds no password
// and no query, and nothing at all when the URL's parts can't be told
// apart.
func TestRedactedURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url, want string
		ok        bool
	}{
		{"sqlite:/var/lib/paymentsd/records.db", "sqlite:/var/lib/paymentsd/records.db", true},
		{"sqlite::memory:", "sqlite::memory:", true},
		{"postgres://db.internal/payments", "postgres://db.internal/payments", true},
		{"postgres://app:" + sentinel + "@db.internal:5432/payments", "postgres://app@db.internal:5432/payments", true},
		{"postgresql://app:" + sentinel + "%2F%23@[::1]:5432/payments?sslmode=require", "postgresql://app@[::1]:5432/payments", true},
		{"postgres://app@db.internal/payments?sslmode=require&password=" + sentinel, "postgres://app@db.internal/payments", true},
		{"postgres://app@db.internal/payments?sslpassword=" + sentinel, "postgres://app@db.internal/payments", true},
		{"postgres://app:#" + sentinel + "@db.internal/payments", "postgres://[REDACTED]", false},
		{"postgres://app:1234#" + sentinel + "@db.internal/payments", "postgres://[REDACTED]", false},
		{"postgres://app:12/" + sentinel + "@db.internal/payments", "postgres://[REDACTED]", false},
		{"postgres://app:12?" + sentinel + "@db.internal/payments", "postgres://[REDACTED]", false},
		{"postgres://app:" + sentinel + "%zz@db.internal/payments", "postgres://[REDACTED]", false},
		{"mysql://app:" + sentinel + "@db.internal/payments", "[REDACTED]", false},
		// '@' inside a query value is a value, not a password's end.
		{"postgres://db.internal/payments?user=alice@myserver&password=" + sentinel, "postgres://db.internal/payments?user=alice@myserver", true},
		{"postgres://app:" + sentinel + "@db.internal/payments?application_name=paymentsd@eu-1", "postgres://app@db.internal/payments", true},
		// A Unix socket directory in the query.
		{"postgres:///payments?host=/var/run/postgresql&password=" + sentinel, "postgres:///payments?host=/var/run/postgresql", true},
		// The host dialled is shown: a host= in the query overrides the
		// URL's, as do port= and hostaddr=.
		{"postgres://app:" + sentinel + "@db.internal/payments?sslmode=require&host=db2.internal&port=5433", "postgres://app@db.internal/payments?host=db2.internal&port=5433", true},
		{"postgres://app:" + sentinel + "@db1,db2:5433/payments", "postgres://app@db1,db2:5433/payments", true},
		// An unescaped '@' in the password: pgx would dial 3xkcd@db.internal.
		{"postgres://paymentsd:Tr0ub4dor@3xkcd@db.internal/payments", "postgres://[REDACTED]", false},
		{"postgres://db.internal?user=alice@server", "postgres://[REDACTED]", false},
		{"postgres://app:" + sentinel + "@/payments", "postgres://[REDACTED]", false},
		{"postgres://app@db.internal/payments?" + sentinel, "postgres://[REDACTED]", false},
	} {
		shown, ok := store.RedactedURL(tc.url)
		if shown != tc.want || ok != tc.ok {
			t.Errorf("RedactedURL(%q) = %q, %v; want %q, %v", tc.url, shown, ok, tc.want, tc.ok)
		}
	}
}

func TestOpenRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct{ name, url, env string }{
		{"empty environment", "sqlite::memory:", ""},
		{"empty SQLite path", "sqlite:", "sandbox"},
		{"unknown scheme", "file:/tmp/x.db", "sandbox"},
		{"missing directory", "sqlite:" + t.TempDir() + "/no/such/dir/db", "sandbox"},
	} {
		if s, err := store.Open(ctx, tc.url, tc.env, store.Options{}); err == nil {
			s.Close()
			t.Errorf("Open(%s) error = nil, want an error", tc.name)
		}
	}
}

func TestWrongEnvironmentMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := storetest.SQLiteURL(t)
	s, err := store.Open(ctx, url, "live", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, err = store.Open(ctx, url, "sandbox", store.Options{})
	if !errors.Is(err, store.ErrWrongEnvironment) {
		t.Fatalf("Open(sandbox) on a live database error = %v, want ErrWrongEnvironment", err)
	}
	for _, want := range []string{`"live"`, `"sandbox"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open(sandbox) error %q doesn't mention %s", err, want)
		}
	}
	t.Log(err)
}

func TestPostgresWrongEnvironmentHidesPassword(t *testing.T) {
	t.Parallel()
	// The test server trusts loopback, so any password is accepted: put the
	// sentinel in and check the refusal doesn't repeat it.
	url := strings.Replace(storetest.PostgresURL(t), "postgres://postgres@", "postgres://postgres:"+sentinel+"@", 1)
	ctx := context.Background()
	s, err := store.Open(ctx, url, "live", store.Options{})
	if err != nil {
		t.Fatalf("Open(live) error = %v", err)
	}
	s.Close()
	_, err = store.Open(ctx, url, "sandbox", store.Options{})
	if !errors.Is(err, store.ErrWrongEnvironment) || strings.Contains(err.Error(), sentinel) {
		t.Errorf("Open(sandbox) on a live database error = %v, want ErrWrongEnvironment without the password", err)
	}
}

// TestCheckURL: each URL whose password could be read as another part is
// refused with advice to percent-encode; well-formed ones pass.
func TestCheckURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url  string
		want bool // accepted
	}{
		{"sqlite:records.db", true},
		{"sqlite::memory:", true},
		{"sqlite:", false},
		{"sqlite:x.db?mode=ro", false},
		{"postgres://app:pw@db.internal:5432/payments?sslmode=verify-full", true},
		{"postgres://app:Tr0ub4dor%403xkcd@db.internal/payments", true},
		{"postgres://app:12%23pw@db.internal/payments", true},
		{"postgres:///payments?host=/run/postgresql", true},
		{"postgres://paymentsd:Tr0ub4dor@3xkcd@db.internal/payments", false},
		{"postgres://app:12#pw@db.internal/payments", false},
		{"postgres://app:12/pw@db.internal/payments", false},
		{"postgres://app:12?pw@db.internal/payments", false},
		{"postgres://app:100%@db.internal/payments", false},
		{"postgres://app:pw@/payments", false},
		{"mysql://db.internal/payments", false},
	} {
		err := store.CheckURL(tc.url)
		if (err == nil) != tc.want {
			t.Errorf("CheckURL(%q) = %v, want accepted %v", tc.url, err, tc.want)
		}
		if shown, ok := store.RedactedURL(tc.url); ok != tc.want {
			t.Errorf("RedactedURL(%q) = %q, %v; want ok %v, as CheckURL", tc.url, shown, ok, tc.want)
		}
	}
}

// TestOpenHungDatabase: a database that accepts connections and never
// answers makes Open fail within the connect timeout, with
// ErrConnectTimeout, rather than wait forever.
func TestOpenHungDatabase(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c // held open, never answered
		}
	}()
	defer func() {
		ln.Close()
		for c := range accepted {
			c.Close()
		}
	}()
	const timeout = 500 * time.Millisecond
	url := "postgres://app:" + sentinel + "@" + ln.Addr().String() + "/payments?sslmode=disable"
	// The context is a guard against a hang, not a timed assertion: Open
	// must give up by itself, with ErrConnectTimeout, long before.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := store.Open(ctx, url, "sandbox", store.Options{ConnectTimeout: timeout})
	if err == nil {
		s.Close()
		t.Fatal("Open() on a database that never answers = nil error")
	}
	if !errors.Is(err, store.ErrConnectTimeout) || ctx.Err() != nil {
		t.Errorf("Open() error = %v, want ErrConnectTimeout once the connect timeout passed", err)
	}
	if strings.Contains(err.Error(), sentinel) {
		t.Errorf("Open() error %q contains the password", err)
	}
	t.Log(err)
}

// TestOpenLogsMigrations: Open reports the migrations it applies, and
// that the schema is up to date when there are none.
func TestOpenLogsMigrations(t *testing.T) {
	t.Parallel()
	url := storetest.SQLiteURL(t)
	for i, want := range []string{"applied migrations", "database schema is up to date"} {
		var buf bytes.Buffer
		s, err := store.Open(context.Background(), url, "sandbox", store.Options{Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		var line struct{ Msg string }
		if err := json.Unmarshal(buf.Bytes(), &line); err != nil || line.Msg != want {
			t.Errorf("Open() #%d logged %q, want one line %q", i+1, buf.String(), want)
		}
	}
}

// TestOpenNamesSQLiteFile: a SQLite file that can't be opened is named in
// the error (a path holds no password).
func TestOpenNamesSQLiteFile(t *testing.T) {
	t.Parallel()
	path := t.TempDir() + "/no/such/dir/records.db"
	_, err := store.Open(context.Background(), "sqlite:"+path, "sandbox", store.Options{})
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("Open(sqlite:%s) error = %v, want it to name the file", path, err)
	}
}
