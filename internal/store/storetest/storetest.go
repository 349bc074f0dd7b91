// Package storetest gives tests a fresh database for package store: a
// SQLite file in the test's temp directory, or an empty database on the
// test PostgreSQL server named by PAYMENTS_TEST_POSTGRES_URL.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"example.com/paymentsd/internal/pgtest"
	"example.com/paymentsd/internal/testenv"
)

// EnvPostgresURL names the environment variable holding an admin (superuser)
// URL of the test PostgreSQL server, e.g. the one `bash .ci/postgres`
// starts.
const EnvPostgresURL = "PAYMENTS_TEST_POSTGRES_URL"

// SQLiteURL returns the store URL of a new SQLite database file in
// t.TempDir().
func SQLiteURL(t testing.TB) string {
	t.Helper()
	return "sqlite:" + filepath.Join(t.TempDir(), "paymentsd.db")
}

// PostgresURL creates a fresh, empty database on the test PostgreSQL server
// and returns its URL; t.Cleanup drops it. Without PAYMENTS_TEST_POSTGRES_URL
// it skips the test, except under CI=true, where it fails it: CI must not
// quietly stop testing PostgreSQL.
func PostgresURL(t testing.TB) string {
	t.Helper()
	admin := os.Getenv(EnvPostgresURL)
	if admin == "" {
		testenv.Missing(t, "%s is not set; run eval \"$(bash .ci/postgres)\" to test PostgreSQL", EnvPostgresURL)
	}
	if _, err := url.Parse(admin); err != nil {
		// The URL may hold a password: don't quote the parser's error.
		t.Fatalf("%s is not a URL", EnvPostgresURL)
	}

	var b [8]byte
	rand.Read(b[:])
	name := "paymentsd_test_" + hex.EncodeToString(b[:])

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dbURL, drop, err := pgtest.CreateDatabase(ctx, admin, name)
	if err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := drop(ctx); err != nil {
			t.Errorf("drop test database %s: %v", name, err)
		}
	})
	return dbURL
}
