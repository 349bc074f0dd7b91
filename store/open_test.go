package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"example.com/paymentsd/store"
	"example.com/paymentsd/store/storetest"
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
		{"postgres://db.internal/payments?user=alice@myserver&password=" + sentinel, "postgres://db.internal/payments", true},
		{"postgres://app:" + sentinel + "@db.internal/payments?application_name=paymentsd@eu-1", "postgres://app@db.internal/payments", true},
		// A Unix socket directory in the query.
		{"postgres:///payments?host=/var/run/postgresql&password=" + sentinel, "postgres:///payments?host=%2Fvar%2Frun%2Fpostgresql", true},
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
