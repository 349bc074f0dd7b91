//go:build sqlite_ncruces && !sqlite_mattn

package store

import (
	"errors"
	"github.com/ncruces/go-sqlite3"
	"net/url"

	_ "github.com/ncruces/go-sqlite3/driver" // registers the "sqlite3" database/sql driver
)

// With the build tag sqlite_ncruces, the SQLite driver is
// github.com/ncruces/go-sqlite3: SQLite compiled to WebAssembly and
// translated to pure Go.

// SQLiteDriver is the database/sql driver name the store opens SQLite
// with, for tests that open a store's file directly.
const SQLiteDriver = "sqlite3"

// SQLiteDSN is the driver's data source name for the file at path (or
// ":memory:"), with BEGIN IMMEDIATE transactions if immediate, and each of
// pragmas, written "name(value)", run on every new connection. It is a
// "file:" URI, the only form that takes parameters.
func SQLiteDSN(path string, immediate bool, pragmas ...string) string {
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" +
		sqliteParams(immediate, pragmas, func(p string) string { return "_pragma=" + url.QueryEscape(p) })
}

// sqliteBusy reports whether err is SQLite's SQLITE_BUSY: another
// connection holds a lock.
func sqliteBusy(err error) bool {
	// An *sqlite3.Error, or the bare code the driver returns for some.
	return errors.Is(err, sqlite3.BUSY)
}
