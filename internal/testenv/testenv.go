// Package testenv says what a test does when the machine it runs on lacks
// something it needs: a PostgreSQL server, a capability such as unshare or
// a second loopback address, or /proc.
package testenv

import (
	"fmt"
	"os"
	"testing"
)

// Missing ends t because this machine lacks something it needs, which
// format and args describe (with how to provide it, where that helps). The
// test skips, except under CI=true, where it fails: CI must not quietly
// stop testing what a missing capability hides.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true, and this machine lacks what the test needs: %s", fmt.Sprintf(format, args...))
	}
	t.Skipf(format, args...)
}
