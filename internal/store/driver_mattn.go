//go:build sqlite_mattn

package store

import (
	"errors"
	sqlite3 "github.com/mattn/go-sqlite3"
	"net/url"
	"strings"

	_ "github.com/mattn/go-sqlite3" // registers the "sqlite3" database/sql driver (cgo)
)

// With the build tag sqlite_mattn, the SQLite driver is
// github.com/mattn/go-sqlite3, SQLite's C through cgo: a reference for
// paymentsbench's driver table only, since it needs a C compiler and makes
// the binary dynamic.

// SQLiteDriver is the database/sql driver name the store opens SQLite
// with, for tests that open a store's file directly.
const SQLiteDriver = "sqlite3"

// SQLiteDSN is the driver's data source name for the file at path (or
// ":memory:"), with BEGIN IMMEDIATE transactions if immediate, and each of
// pragmas, written "name(value)", as the driver's "_name=value"
// parameter.
func SQLiteDSN(path string, immediate bool, pragmas ...string) string {
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" +
		sqliteParams(immediate, pragmas, func(p string) string {
			name, value, _ := strings.Cut(strings.TrimSuffix(p, ")"), "(")
			return "_" + name + "=" + url.QueryEscape(value)
		})
}

// sqliteBusy reports whether err is SQLite's SQLITE_BUSY: another
// connection holds a lock.
func sqliteBusy(err error) bool {
	var e sqlite3.Error
	return errors.As(err, &e) && e.Code == sqlite3.ErrBusy
}
