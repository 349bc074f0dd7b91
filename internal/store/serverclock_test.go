package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
)

// The tests here open PostgreSQL stores without Options.Now, as production
// does: they decide by the database server's clock. storetest.ServerClock
// sets that clock apart from this host's, so a store that read the local
// clock anywhere would be an hour out, and fail.

// within reports whether got is within tolerance of want.
func within(got, want, tolerance time.Duration) bool {
	return got >= want-tolerance && got <= want+tolerance
}

func openServerClocked(t *testing.T, url string) *store.Store {
	t.Helper()
	// The tests move the database's clock past leases at once: takeovers
	// don't wait for the writes' health (TestTakeoverWaitsForHealthyWrites).
	s, err := store.Open(context.Background(), url, "sandbox", store.Options{TakeoverGrace: -1})
	if err != nil {
		t.Fatalf("Open() error = %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// checkServerTime fails the test unless got is within a second of the
// database's clock, read just before (before) and just after.
func checkServerTime(t *testing.T, what string, got, before time.Time, srv *storetest.ServerClock) {
	t.Helper()
	after := srv.Now()
	if got.Before(before.Add(-time.Second)) || got.After(after.Add(time.Second)) {
		t.Errorf("%s = %v, want the database's clock (between %v and %v)", what, got, before, after)
	}
}

func TestPostgresClockOffset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, srv := storetest.PostgresURLWithClock(t)
	s := openServerClocked(t, url)
	for _, tc := range []struct {
		name          string
		server, local time.Duration // ahead of the host's clock
	}{
		{"clocks agree", 0, 0},
		{"local clock ahead", 0, 10 * time.Second},
		{"local clock behind", 0, -10 * time.Second},
		{"server clock ahead", time.Hour, 0},
	} {
		srv.Set(tc.server)
		got, err := s.ClockOffset(ctx, func() time.Time { return time.Now().Add(tc.local) })
		if want := tc.local - tc.server; err != nil || !within(got, want, time.Second) {
			t.Errorf("%s: ClockOffset() = %v, %v; want %v within a second", tc.name, got, err, want)
		}
	}
}

// TestPostgresServerClockDecides: two replicas (Stores) on one database
// judge a lease by the database's clock, an hour ahead of their own: the
// lease is reported in the database's time, lasts its TTL, and the other
// replica takes the key over only once the database's clock has passed
// it, never before.
func TestPostgresServerClockDecides(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, srv := storetest.PostgresURLWithClock(t)
	srv.Set(time.Hour)
	a, b := openServerClocked(t, url), openServerClocked(t, url)
	const ttl = 2 * time.Second

	c := claim("k", "body", "a")
	c.LeaseTTL = ttl
	start := time.Now()
	before := srv.Now()
	first := begin(t, a, c, record.Acquired)
	checkServerTime(t, "Begin's ReadAt", first.Record.ReadAt, before, srv)
	checkServerTime(t, "Begin's AttemptStartedAt", first.Record.AttemptStartedAt, before, srv)
	if d := first.Record.LeaseExpiresAt.Sub(first.Record.ReadAt); d != ttl {
		t.Errorf("LeaseExpiresAt - ReadAt = %v, want %v", d, ttl)
	}
	before = srv.Now()
	checkServerTime(t, "Get's ReadAt", get(t, b, "k").ReadAt, before, srv)
	end := first.Record.LeaseExpiresAt

	busy := 0
	for {
		pre := srv.Now()
		c := claim("k", "body", "b")
		c.LeaseTTL = ttl
		got, err := b.Begin(ctx, c, nil)
		if err != nil {
			t.Fatalf("Begin(replica b) error = %v", err)
		}
		post := srv.Now()
		if got.Verdict == record.Busy {
			if !pre.Before(end) {
				t.Fatalf("Begin(replica b) = Busy at database time %v, after the lease ended at %v", pre, end)
			}
			busy++
		} else {
			if got.Verdict != record.Acquired || got.Record.PriorState != record.InProgress {
				t.Fatalf("Begin(replica b) = %v (PriorState %v), want Busy, then Acquired from InProgress", got.Verdict, got.Record.PriorState)
			}
			if post.Before(end) || got.Record.ReadAt.Before(end) {
				t.Fatalf("Begin(replica b) acquired at database time %v (ReadAt %v), before the lease ended at %v", post, got.Record.ReadAt, end)
			}
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("Begin(replica b) still Busy 30s after a %v lease began", ttl)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if busy == 0 {
		t.Error("Begin(replica b) was never Busy while the lease held")
	}
	if elapsed := time.Since(start); elapsed < ttl {
		t.Errorf("the key was taken over %v after the lease began, want at least its TTL %v", elapsed, ttl)
	}
}

// TestPostgresServerClockTimeTravel moves the database's clock, and no
// other, through a key's life: lease, quiet period, settlement, giving up,
// retention and the tombstone's expiry. Each is judged by that clock.
func TestPostgresServerClockTimeTravel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, srv := storetest.PostgresURLWithClock(t)
	// a serves calls, b settles and deletes: two replicas.
	a, b := openServerClocked(t, url), openServerClocked(t, url)
	var offset time.Duration
	move := func(d time.Duration) {
		offset += d
		srv.Set(offset)
	}
	retention := store.Retention{Records: 24 * time.Hour, Tombstones: 48 * time.Hour}

	c := quiet(claim("k", "body", "a"), 10*time.Second)
	c.Window = time.Hour
	begin(t, a, c, record.Acquired)
	begin(t, a, claim("k", "body", "b"), record.Busy)
	move(lease + time.Second)
	begin(t, a, claim("k", "body", "b"), record.Quiet)
	if got := claimDue(t, b, "settler", 0, 10); len(got) != 0 {
		t.Errorf("SettleDue while quiet = %v, want nothing", keys(got))
	}
	move(10 * time.Second)
	before := srv.Now()
	got := claimDue(t, b, "settler", 0, 10)
	if len(got) != 1 || got[0].PriorState != record.InProgress {
		t.Fatalf("SettleDue once quiet passed = %+v, want k from InProgress", got)
	}
	checkServerTime(t, "SettleDue's ReadAt", got[0].ReadAt, before, srv)
	finish(t, b, "k", record.Outcome{Result: record.Unknown, HTTPRequests: 1})

	move(time.Hour)
	before = srv.Now()
	gave := giveUp(t, b, "settler/1")
	if len(gave) != 1 {
		t.Fatalf("give-up pass past the window = %v; want k", keys(gave))
	}
	checkServerTime(t, "SettleDue's UpdatedAt", gave[0].UpdatedAt, before, srv)
	begin(t, a, claim("k", "body", "b"), record.PastWindow)

	if got := deleteAll(t, b, retention, 10); len(got) != 0 {
		t.Errorf("DeleteExpired within retention = %v, want nothing", got)
	}
	move(retention.Records + time.Second)
	before = srv.Now()
	deleteAll(t, b, retention, 10)
	ts := begin(t, a, claim("k", "body", "b"), record.Expired).Tombstone
	checkServerTime(t, "Tombstone's ExpiredAt", ts.ExpiredAt, before, srv)
	if _, err := a.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get(expired key) error = %v, want ErrNotFound", err)
	}
	move(store.TombstoneGrace + time.Second)
	deleteAll(t, b, retention, 10)
	if n, err := store.CountRows(ctx, b, "records"); err != nil || n != 0 {
		t.Errorf("records after the grace period = %d, %v; want 0", n, err)
	}
	begin(t, a, claim("k", "body", "b"), record.Expired)
	move(retention.Tombstones + time.Second)
	deleteAll(t, b, retention, 10)
	before = srv.Now()
	fresh := begin(t, a, claim("k", "another body", "b"), record.Acquired)
	checkServerTime(t, "a new record's CreatedAt", fresh.Record.CreatedAt, before, srv)
}
