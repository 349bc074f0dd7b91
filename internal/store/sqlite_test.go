package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"example.com/paymentsd/internal/record"
)

// TestSQLiteSettings checks the connection settings durability and
// concurrency rest on, on the writer and on the readers.
func TestSQLiteSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "db"), "sandbox", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		pragma string
		want   string
	}{
		{"journal_mode", "wal"},
		{"synchronous", "2"}, // FULL
		{"busy_timeout", "10000"},
	} {
		for name, db := range map[string]*sql.DB{"writer": s.w, "reader": s.r} {
			var got string
			if err := db.QueryRowContext(ctx, "PRAGMA "+tc.pragma).Scan(&got); err != nil {
				t.Fatalf("%s PRAGMA %s: %v", name, tc.pragma, err)
			}
			if got != tc.want {
				t.Errorf("%s PRAGMA %s = %s, want %s", name, tc.pragma, got, tc.want)
			}
		}
	}
	// Readers can't write.
	if _, err := s.r.ExecContext(ctx, `DELETE FROM records`); err == nil {
		t.Error("DELETE through the reader pool succeeded, want query_only refusal")
	}
}

// TestSQLiteBeginSurvivesExit begins a record in a child process that then
// exits without closing the store: the record must be there.
func TestSQLiteBeginSurvivesExit(t *testing.T) {
	if path := os.Getenv("STORE_TEST_CHILD_DB"); path != "" {
		s, err := Open(context.Background(), "sqlite:"+path, "sandbox", Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Begin(context.Background(), record.Claim{Request: record.Request{Key: "k", BodySHA256: sha256.Sum256(nil)}, Owner: "child",
			LeaseTTL: time.Minute, Window: time.Hour}, nil); err != nil {
			t.Fatal(err)
		}
		os.Exit(0) // no Close, no checkpoint
	}
	t.Parallel()
	path := filepath.Join(t.TempDir(), "db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestSQLiteBeginSurvivesExit$")
	cmd.Env = append(os.Environ(), "STORE_TEST_CHILD_DB="+path)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	s, err := Open(context.Background(), "sqlite:"+path, "sandbox", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err := s.Get(context.Background(), "k")
	if err != nil || r.LeaseOwner != "child" {
		t.Fatalf("Get(k) after the child exited = %+v, %v; want the child's record", r, err)
	}
}

// TestSQLiteTwoStoresOneKey: two Stores on one file (as two processes
// would be) each with their own writer connection; BEGIN IMMEDIATE and
// busy_timeout make their Begins on one key serialise.
func TestSQLiteTwoStoresOneKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := "sqlite:" + filepath.Join(t.TempDir(), "db")
	var stores [2]*Store
	for i := range stores {
		s, err := Open(ctx, url, "sandbox", Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		stores[i] = s
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		acquired int
	)
	for i := range 16 {
		wg.Go(func() {
			b, err := stores[i%2].Begin(ctx, record.Claim{Request: record.Request{Key: "k", BodySHA256: sha256.Sum256(nil)}, Owner: "o",
				LeaseTTL: time.Minute, Window: time.Hour}, nil)
			if err != nil {
				t.Errorf("Begin: %v", err)
				return
			}
			if b.Verdict == record.Acquired {
				mu.Lock()
				acquired++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if acquired != 1 {
		t.Errorf("%d Begins acquired the key, want 1", acquired)
	}
}
