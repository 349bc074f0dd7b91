package store_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
)

// TestClaimedRecordIsWhatIsStored: the record Begin returns for a new key
// (record.Step's, never read back from the INSERT) is the record Get reads
// right after, by the store's real clock (this host's for SQLite, the
// server's for PostgreSQL, as production runs), with durations that are
// not whole microseconds; and the journal row the finish statement writes
// (SQLite's trigger, PostgreSQL's CTE) carries that claim's number, kind,
// request ID and start, with the outcome's owner, status and end.
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
			c := quiet(claim("k", `{"amount":1}`, "p/a"), 7*time.Second+501*time.Nanosecond)
			c.LeaseTTL = 30*time.Second + 999*time.Nanosecond
			c.Window = time.Hour + 1*time.Nanosecond
			began := begin(t, s, c, record.Acquired)
			got := get(t, s, c.Key)
			if diff := cmp.Diff(began.Record, got, cmpopts.IgnoreFields(record.Record{}, "ReadAt")); diff != "" {
				t.Errorf("Get after Begin differs from Begin's record (-Begin +Get):\n%s", diff)
			}
			o := paid(201, `{"id":"pay_1"}`)
			o.Owner = c.Owner
			finishAs(t, s, began.Record, o, record.Written)
			after := get(t, s, c.Key)
			as, err := s.Attempts(ctx, after)
			if err != nil || len(as) != 1 {
				t.Fatalf("Attempts() = %d attempts, %v; want 1", len(as), err)
			}
			want := record.Attempt{Number: began.Record.AttemptSeq, Kind: began.Record.AttemptKind, Owner: c.Owner,
				RequestID: began.Record.AttemptRequestID, StartedAt: began.Record.AttemptStartedAt, EndedAt: after.UpdatedAt,
				ProviderStatus: 201, HTTPRequests: 1, Reply: []byte(`{"id":"pay_1"}`), State: record.Succeeded}
			if diff := cmp.Diff(want, as[0]); diff != "" {
				t.Errorf("journal row (-want +got):\n%s", diff)
			}
		})
	}
}
