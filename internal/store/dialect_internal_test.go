package store

import (
	"regexp"
	"testing"
)

// TestDialectQ checks q's placeholder rewrite against the regular
// expression it replaced.
func TestDialectQ(t *testing.T) {
	dollarN := regexp.MustCompile(`\$([0-9]+)`)
	for _, query := range []string{
		"",
		"SELECT 1",
		"SELECT $1",
		"$1$2$10",
		"WHERE a = $1 AND b = $12 AND c = '$' AND d = $x AND e = $",
		"$",
		"$$1",
		"INSERT INTO t VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
		"ünïcode $3 ☃$4",
	} {
		want := dollarN.ReplaceAllString(query, "?$1")
		if got := sqliteDialect.q(query); got != want {
			t.Errorf("sqlite q(%q) = %q, want %q", query, got, want)
		}
		if got := postgresDialect.q(query); got != query {
			t.Errorf("postgres q(%q) = %q, want it unchanged", query, got)
		}
	}
}
