package storetest

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"
)

// ServerClock is the clock of a test PostgreSQL database as its sessions
// see it: now() and clock_timestamp() run Offset ahead of the server's
// real clock (behind, if negative). It stands in for a database server
// whose clock differs from this host's, and lets a test move the time a
// store without Options.Now decides by.
//
// It works by search_path: the database's sessions find now() and
// clock_timestamp() in a schema of their own, ahead of pg_catalog's. Only
// sessions opened after PostgresURLWithClock returns see it.
type ServerClock struct {
	t  testing.TB
	db *sql.DB
}

// PostgresURLWithClock is PostgresURL with a ServerClock, at offset zero.
func PostgresURLWithClock(t testing.TB) (string, *ServerClock) {
	t.Helper()
	url := PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatalf("open test database: %v", err)
	}
	for _, q := range []string{
		`CREATE SCHEMA test_clock`,
		`CREATE TABLE test_clock.offset_by (d interval NOT NULL)`,
		`INSERT INTO test_clock.offset_by VALUES ('0')`,
		`CREATE FUNCTION test_clock.now() RETURNS timestamptz LANGUAGE sql STABLE
			AS $$ SELECT pg_catalog.now() + (SELECT d FROM test_clock.offset_by) $$`,
		`CREATE FUNCTION test_clock.clock_timestamp() RETURNS timestamptz LANGUAGE sql VOLATILE
			AS $$ SELECT pg_catalog.clock_timestamp() + (SELECT d FROM test_clock.offset_by) $$`,
		`DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET search_path = public, test_clock, pg_catalog', current_database()); END $$`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			db.Close()
			t.Fatalf("set up the test clock: %v", err)
		}
	}
	// Reconnect, so that this pool's sessions see the clock too.
	db.Close()
	db, err = sql.Open("pgx", url)
	if err != nil {
		t.Fatalf("open test database: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return url, &ServerClock{t: t, db: db}
}

// Set sets the offset of the database's clock from the server's.
func (c *ServerClock) Set(offset time.Duration) {
	c.t.Helper()
	if _, err := c.db.Exec(`UPDATE test_clock.offset_by SET d = $1::interval`, fmt.Sprintf("%d microseconds", offset.Microseconds())); err != nil {
		c.t.Fatalf("set the database clock: %v", err)
	}
}

// Now is the database's clock, as a statement's now() reads it.
func (c *ServerClock) Now() time.Time {
	c.t.Helper()
	var now time.Time
	if err := c.db.QueryRow(`SELECT now()`).Scan(&now); err != nil {
		c.t.Fatalf("read the database clock: %v", err)
	}
	return now.UTC()
}
