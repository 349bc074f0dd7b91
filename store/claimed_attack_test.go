package store_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"example.com/paymentsd/store"
	"example.com/paymentsd/store/storetest"
)

// TestClaimedRecordIsWhatIsStored: the record Begin builds for a new key
// (no longer read back from the INSERT) is the record Get reads right
// after, by the store's real clock (this host's for SQLite, the server's
// for PostgreSQL, as production runs), with durations that are not whole
// microseconds; and the attempt row that FinishWrite writes from the
// record (INSERT … SELECT) carries that claim's number, kind, request ID
// and start, with the outcome's owner, status and end.
func TestClaimedRecordIsWhatIsStored(t *testing.T) {
	t.Parallel()
	backends := map[string]func(t *testing.T) *store.Store{
		"sqlite": func(t *testing.T) *store.Store {
			s, err := store.Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "r.db"), "sandbox", store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		"postgres": func(t *testing.T) *store.Store {
			url, srv := storetest.PostgresURLWithClock(t)
			srv.Set(time.Hour)
			return openServerClocked(t, url)
		},
	}
	for name, open := range backends {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := open(t)
			ctx := context.Background()
			c := quiet(claim("k", `{"amount":1}`, "a"), 7*time.Second+501*time.Nanosecond)
			c.LeaseTTL = 30*time.Second + 999*time.Nanosecond
			c.Window = time.Hour + 1*time.Nanosecond
			began := begin(t, s, c, store.Acquired)
			got := get(t, s, c.Key)
			if diff := cmp.Diff(began.Record, got, cmpopts.IgnoreFields(store.Record{}, "ReadAt")); diff != "" {
				t.Errorf("Get after Begin differs from Begin's record (-Begin +Get):\n%s", diff)
			}
			if _, err := s.FinishWrite(ctx, store.Finish{Key: c.Key, Owner: c.Owner, State: store.StateSucceeded,
				AddAttempts: 1, ProviderStatus: 201, Reply: []byte(`{"id":"pay_1"}`), Claimed: began.Record.Claimed()}); err != nil {
				t.Fatalf("FinishWrite() error = %v", err)
			}
			after := get(t, s, c.Key)
			as, err := s.Attempts(ctx, after)
			if err != nil || len(as) != 1 {
				t.Fatalf("Attempts() = %d attempts, %v; want 1", len(as), err)
			}
			a := as[0]
			if a.Number != began.Record.AttemptSeq || a.Kind != began.Record.AttemptKind || a.RequestID != began.Record.AttemptRequestID ||
				!a.StartedAt.Equal(began.Record.AttemptStartedAt) || a.Owner != c.Owner || a.ProviderStatus != 201 ||
				a.HTTPRequests != 1 || a.State != store.StateSucceeded || a.Abandoned || a.InFlight ||
				!a.EndedAt.Equal(after.UpdatedAt) || string(a.Reply) != `{"id":"pay_1"}` {
				t.Errorf("attempt row = %+v; want the claim's attempt (%d, %v, %q, started %v) ended at %v by %s with 201", a,
					began.Record.AttemptSeq, began.Record.AttemptKind, began.Record.AttemptRequestID, began.Record.AttemptStartedAt, after.UpdatedAt, c.Owner)
			}
		})
	}
}
