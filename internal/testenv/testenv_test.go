package testenv_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"example.com/paymentsd/internal/testenv"
)

// TestMissingChild is run by TestMissing in a child process: it lacks
// something.
func TestMissingChild(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") == "" {
		t.Skip("run by TestMissing")
	}
	testenv.Missing(t, "no %s here", "frobnicator")
	t.Error("Missing returned")
}

// TestMissing: a test that lacks something skips, except under CI=true,
// where it fails.
func TestMissing(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		ci       string
		wantFail bool
	}{{"", false}, {"false", false}, {"true", true}} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissingChild$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", "CI="+tt.ci)
		out, err := cmd.CombinedOutput()
		if failed := err != nil; failed != tt.wantFail {
			t.Errorf("CI=%q: failed = %v, want %v\n%s", tt.ci, failed, tt.wantFail, out)
		}
		if !tt.wantFail && !strings.Contains(string(out), "--- SKIP: TestMissingChild") {
			t.Errorf("CI=%q: the test did not skip\n%s", tt.ci, out)
		}
	}
}
