//go:build !sqlite_ncruces && !sqlite_mattn

package store

import (
	"errors"
	sqlite "modernc.org/sqlite"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// The SQLite driver: modernc.org/sqlite, SQLite translated to pure Go, by
// default. The build tags sqlite_ncruces and sqlite_mattn swap it (see
// driver_ncruces.go, driver_mattn.go), for paymentsbench's driver table.

// SQLiteDriver is the database/sql driver name the store opens SQLite
// with, for tests that open a store's file directly.
const SQLiteDriver = "sqlite"

// SQLiteDSN is the driver's data source name for the file at path (or
// ":memory:"), with BEGIN IMMEDIATE transactions if immediate, and each of
// pragmas, written "name(value)", run on every new connection.
func SQLiteDSN(path string, immediate bool, pragmas ...string) string {
	return path + "?" + sqliteParams(immediate, pragmas, func(p string) string { return "_pragma=" + p })
}

// sqliteBusy reports whether err is SQLite's SQLITE_BUSY (an extended
// code's primary code included): another connection holds a lock.
func sqliteBusy(err error) bool {
	var e *sqlite.Error
	return errors.As(err, &e) && e.Code()&0xff == 5 // SQLITE_BUSY
}
