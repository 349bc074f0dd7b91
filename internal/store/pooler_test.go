package store_test

import (
	"testing"

	"example.com/paymentsd/internal/store/storetest"
)

// TestPostgresBehindPgBouncer runs the conformance suite through a real
// PgBouncer in transaction mode whose pool (2 server connections) is
// smaller than the store's (10): each transaction may land on another
// server session, so a store that kept anything in one (a prepared
// statement, a startup parameter, a SET) fails here.
func TestPostgresBehindPgBouncer(t *testing.T) {
	t.Parallel()
	direct := storetest.PostgresURL(t) // skip early, and once, without a server
	bouncer := storetest.StartPgBouncer(t, direct, 2)
	testStore(t, backend{name: "postgres", url: func(t *testing.T) string { return bouncer.URL(storetest.PostgresURL(t)) }, persistent: true})
}
