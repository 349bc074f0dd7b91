package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"example.com/paymentsd/internal/pgtest"
)

// Record stores a paymentsd process can be given. Every process gets a
// database of its own, so that no key of one phase or run is ever found by
// another (a found key is a replay, far cheaper than a payment).
const (
	storeSQLite   = "sqlite"   // the default: a file in the benchmark's temp dir
	storePostgres = "postgres" // a fresh database on -postgres
	storeMemory   = "memory"   // sqlite::memory:, the records off-disk
)

// databases hands out fresh databases and removes them at the end.
type databases struct {
	dir      string // SQLite files go beneath it
	pgAdmin  string // admin URL of the PostgreSQL server, or ""
	cleanups []func() error
}

// url returns the PAYMENTS_DATABASE_URL of a new, empty database of kind
// for the process called name.
func (d *databases) url(ctx context.Context, kind, name string) (string, error) {
	switch kind {
	case storeSQLite:
		dir := filepath.Join(d.dir, name+"-"+randomHex(4))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
		return "sqlite:" + filepath.Join(dir, "records.db"), nil
	case storeMemory:
		return "sqlite::memory:", nil
	case storePostgres:
		return d.postgres(ctx)
	}
	return "", fmt.Errorf("unknown store %q", kind)
}

// postgres creates a database on the PostgreSQL server and returns its URL.
func (d *databases) postgres(ctx context.Context) (string, error) {
	if d.pgAdmin == "" {
		return "", errors.New("no PostgreSQL URL (-postgres)")
	}
	if _, err := url.Parse(d.pgAdmin); err != nil {
		// It may hold a password: don't quote it.
		return "", errors.New("-postgres is not a URL")
	}
	dbURL, drop, err := pgtest.CreateDatabase(ctx, d.pgAdmin, "paymentsbench_"+randomHex(8))
	if err != nil {
		return "", fmt.Errorf("create database: %w", err)
	}
	d.cleanups = append(d.cleanups, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return drop(ctx)
	})
	return dbURL, nil
}

// close drops the PostgreSQL databases it created.
func (d *databases) close() error {
	var errs []error
	for _, f := range d.cleanups {
		errs = append(errs, f())
	}
	d.cleanups = nil
	return errors.Join(errs...)
}
