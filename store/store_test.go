package store_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"example.com/paymentsd/store"
	"example.com/paymentsd/store/storetest"
)

// backend is one way to get a database for the conformance suite.
type backend struct {
	// name is Store.Backend's answer.
	name string
	// url returns the URL of a fresh, empty database.
	url func(t *testing.T) string
	// persistent: Close and Open see the same database again.
	persistent bool
}

func TestSQLite(t *testing.T) {
	t.Parallel()
	testStore(t, backend{name: "sqlite", url: func(t *testing.T) string { return storetest.SQLiteURL(t) }, persistent: true})
}

func TestSQLiteMemory(t *testing.T) {
	t.Parallel()
	testStore(t, backend{name: "sqlite", url: func(*testing.T) string { return "sqlite::memory:" }})
}

func TestPostgres(t *testing.T) {
	t.Parallel()
	storetest.PostgresURL(t) // skip early, and once, without a server
	testStore(t, backend{name: "postgres", url: func(t *testing.T) string { return storetest.PostgresURL(t) }, persistent: true})
}

// t0 is the suite's starting time; its nanoseconds check the microsecond
// truncation and its zone that times come back UTC.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.FixedZone("X", 3600))

const (
	lease  = 30 * time.Second
	window = 24 * time.Hour
	// keep is the suite's record retention, and keepTombstones its
	// tombstone retention.
	keep           = 7 * 24 * time.Hour
	keepTombstones = 400 * 24 * time.Hour
)

// clock is the store's clock in the suite (Options.Now): tests move time
// by setting it, never by sleeping. Safe for concurrent use.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *clock { return &clock{t: t} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set moves the clock to t and returns t.
func (c *clock) Set(t time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
	return t
}

// Add moves the clock on by d and returns the new time.
func (c *clock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

func openStore(t *testing.T, url, env string, clk *clock) *store.Store {
	t.Helper()
	// The suite moves the clock by hours: takeovers don't wait for the
	// writes' health (see TestTakeoverWaitsForHealthyWrites).
	s, err := store.Open(context.Background(), url, env, store.Options{Now: clk.Now, TakeoverGrace: -1})
	if err != nil {
		t.Fatalf("Open(%s) error = %v", env, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// claim is a claim with the suite's lease and window and no quiet period
// beyond the lease.
func claim(key, body, owner string) store.Claim {
	return store.Claim{
		Key:        key,
		Body:       []byte(body),
		BodySHA256: sha256.Sum256([]byte(body)),
		Currency:   "EUR",
		Amount:     1234,
		RequestID:  "req-" + owner,
		TraceID:    "trace-" + owner,
		Caller:     "caller-" + owner,
		Owner:      owner,
		LeaseTTL:   lease,
		Window:     window,
	}
}

// quiet is claim with a quiet period q.
func quiet(c store.Claim, q time.Duration) store.Claim {
	c.Quiet = q
	return c
}

func begin(t *testing.T, s *store.Store, c store.Claim, want store.Outcome) store.Began {
	t.Helper()
	b, err := s.Begin(context.Background(), c)
	if err != nil {
		t.Fatalf("Begin(%q, owner %s) error = %v", c.Key, c.Owner, err)
	}
	if b.Outcome != want {
		t.Fatalf("Begin(%q, owner %s) outcome = %v, want %v (record %+v)", c.Key, c.Owner, b.Outcome, want, b.Record)
	}
	return b
}

func finish(t *testing.T, s *store.Store, f store.Finish) store.Record {
	t.Helper()
	r, err := s.Finish(context.Background(), f)
	if err != nil {
		t.Fatalf("Finish(%q, owner %s, %v) error = %v", f.Key, f.Owner, f.State, err)
	}
	return r
}

func get(t *testing.T, s *store.Store, key string) store.Record {
	t.Helper()
	r, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%q) error = %v", key, err)
	}
	return r
}

// claimDue claims due records for owner, with the suite's lease and a
// quiet period q.
func claimDue(t *testing.T, s *store.Store, owner string, q time.Duration, limit int) []store.Record {
	t.Helper()
	got, err := s.ClaimDue(context.Background(), owner, lease, q, limit)
	if err != nil {
		t.Fatalf("ClaimDue(%s) error = %v", owner, err)
	}
	return got
}

// deleteAll runs DeleteExpired until it has nothing more to do, and
// returns what each call changed.
func deleteAll(t *testing.T, s *store.Store, r store.Retention, limit int) []int {
	t.Helper()
	var batches []int
	for {
		n, err := s.DeleteExpired(context.Background(), r, limit)
		if err != nil {
			t.Fatalf("DeleteExpired(%+v) error = %v", r, err)
		}
		if n == 0 {
			return batches
		}
		batches = append(batches, n)
		if len(batches) > 1000 {
			t.Fatalf("DeleteExpired(%+v) never returns 0", r)
		}
	}
}

func us(t time.Time) time.Time { return t.Truncate(time.Microsecond).UTC() }

// readAt is r as read at now.
func readAt(r store.Record, now time.Time) store.Record {
	r.ReadAt = us(now)
	return r
}

// makeUnknown leaves c.Key OutcomeUnknown, as an unanswered attempt by
// c.Owner at the clock's time, due for settlement settleAfter later and
// with no quiet period.
func makeUnknown(t *testing.T, s *store.Store, c store.Claim, settleAfter time.Duration) store.Record {
	t.Helper()
	begin(t, s, c, store.Acquired)
	return finish(t, s, store.Finish{Key: c.Key, Owner: c.Owner, State: store.StateOutcomeUnknown, AddAttempts: 1,
		ProviderStatus: 503, Reply: []byte(`{"error":"unavailable"}`), LastError: "503", Code: 14, SettleAfter: settleAfter})
}

func keys(rs []store.Record) map[string]int {
	m := map[string]int{}
	for _, r := range rs {
		m[r.Key]++
	}
	return m
}

// testStore is the conformance suite: every backend must pass it.
func testStore(t *testing.T, b backend) {
	ctx := context.Background()
	// fresh opens a new, empty database whose clock starts at t0.
	fresh := func(t *testing.T) (*store.Store, *clock) {
		t.Helper()
		clk := newClock(t0)
		return openStore(t, b.url(t), "sandbox", clk), clk
	}

	t.Run("Backend", func(t *testing.T) {
		t.Parallel()
		s, _ := fresh(t)
		if got := s.Backend(); got != b.name {
			t.Errorf("Backend() = %q, want %q", got, b.name)
		}
		if err := s.Ping(ctx); err != nil {
			t.Errorf("Ping() error = %v", err)
		}
	})

	t.Run("NewKeyAcquired", func(t *testing.T) {
		t.Parallel()
		s, _ := fresh(t)
		c := quiet(claim("k1", `{"amount":1}`, "a"), 7*time.Second)
		got := begin(t, s, c, store.Acquired)
		want := store.Record{
			Key: c.Key, Body: c.Body, BodySHA256: c.BodySHA256, Currency: "EUR", Amount: 1234,
			State: store.StateInProgress, RequestID: "req-a", TraceID: "trace-a", Caller: "caller-a",
			CreatedAt: us(t0), UpdatedAt: us(t0), SettleBy: us(t0.Add(window)),
			LeaseOwner: "a", LeaseExpiresAt: us(t0.Add(lease)),
			QuietUntil: us(t0.Add(lease + 7*time.Second)), AttemptStartedAt: us(t0), ReadAt: us(t0),
			AttemptSeq: 1, AttemptKind: store.AttemptCall, AttemptRequestID: "req-a",
		}
		if got.Prior != 0 {
			t.Errorf("Begin(new key) Prior = %v, want 0", got.Prior)
		}
		if diff := cmp.Diff(want, got.Record); diff != "" {
			t.Errorf("Begin(new key) record mismatch (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(want, get(t, s, c.Key)); diff != "" {
			t.Errorf("Get after Begin mismatch (-want +got):\n%s", diff)
		}
		if got.Record.CreatedAt.Location() != time.UTC {
			t.Errorf("CreatedAt location = %v, want UTC", got.Record.CreatedAt.Location())
		}
		if _, err := s.Get(ctx, "missing"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Get(missing) error = %v, want ErrNotFound", err)
		}
	})

	t.Run("LeaseBusyExpiredAndLost", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		first := begin(t, s, claim("k", "body", "a"), store.Acquired)

		// Same body while the lease holds: Busy, nothing changed.
		at := clk.Set(t0.Add(lease - time.Microsecond))
		busy := begin(t, s, claim("k", "body", "b"), store.Busy)
		if diff := cmp.Diff(readAt(first.Record, at), busy.Record); diff != "" {
			t.Errorf("Busy record changed (-before +after):\n%s", diff)
		}
		// Not the owner: lease lost, nothing written.
		if _, err := s.Finish(ctx, store.Finish{Key: "k", Owner: "b", State: store.StateSucceeded}); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Finish(wrong owner) error = %v, want ErrLeaseLost", err)
		}
		if _, err := s.Finish(ctx, store.Finish{Key: "nope", Owner: "a", State: store.StateSucceeded}); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Finish(no record) error = %v, want ErrLeaseLost", err)
		}
		if _, err := s.Finish(ctx, store.Finish{Key: "k", Owner: "a", State: store.StateInProgress}); err == nil {
			t.Errorf("Finish(InProgress) error = nil, want a refusal")
		}
		if diff := cmp.Diff(readAt(first.Record, at), get(t, s, "k")); diff != "" {
			t.Errorf("refused Finishes changed the record (-before +after):\n%s", diff)
		}

		// Expired lease: taken over, Prior InProgress, window kept.
		later := clk.Set(t0.Add(lease))
		took := begin(t, s, claim("k", "body", "b"), store.Acquired)
		if took.Prior != store.StateInProgress || took.Record.PriorState != store.StateInProgress {
			t.Errorf("takeover Prior = %v, PriorState %v, want InProgress", took.Prior, took.Record.PriorState)
		}
		if took.Record.LeaseOwner != "b" || !took.Record.LeaseExpiresAt.Equal(us(later.Add(lease))) {
			t.Errorf("takeover lease = %s until %v, want b until %v", took.Record.LeaseOwner, took.Record.LeaseExpiresAt, us(later.Add(lease)))
		}
		if !took.Record.AttemptStartedAt.Equal(us(later)) || !took.Record.QuietUntil.Equal(us(later.Add(lease))) {
			t.Errorf("takeover AttemptStartedAt %v QuietUntil %v, want %v and %v", took.Record.AttemptStartedAt, took.Record.QuietUntil, us(later), us(later.Add(lease)))
		}
		if !took.Record.SettleBy.Equal(first.Record.SettleBy) {
			t.Errorf("takeover SettleBy = %v, want kept %v", took.Record.SettleBy, first.Record.SettleBy)
		}
		if took.Record.RequestID != "req-a" {
			t.Errorf("takeover RequestID = %q, want the creator's req-a", took.Record.RequestID)
		}
		// The first owner's late Finish is refused.
		if _, err := s.Finish(ctx, store.Finish{Key: "k", Owner: "a", State: store.StateNotCreated}); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Finish(old owner) error = %v, want ErrLeaseLost", err)
		}
		if r := get(t, s, "k"); r.State != store.StateInProgress || r.LeaseOwner != "b" {
			t.Errorf("after refused Finish: state %v owner %q, want InProgress b", r.State, r.LeaseOwner)
		}
	})

	t.Run("SucceededReplays", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		c := claim("k", "body", "a")
		begin(t, s, c, store.Acquired)
		now := clk.Set(t0.Add(time.Second))
		r := finish(t, s, store.Finish{Key: "k", Owner: "a", State: store.StateSucceeded, AddAttempts: 2,
			ProviderStatus: 201, Reply: []byte(`{"id":"p1"}`), Code: 0, SettleAfter: time.Hour})
		want := store.Record{
			Key: "k", Body: c.Body, BodySHA256: c.BodySHA256, Currency: "EUR", Amount: 1234,
			State: store.StateSucceeded, Attempts: 2, ProviderStatus: 201, Reply: []byte(`{"id":"p1"}`),
			RequestID: "req-a", TraceID: "trace-a", Caller: "caller-a",
			CreatedAt: us(t0), UpdatedAt: us(now), SettleBy: us(t0.Add(window)),
			AttemptStartedAt: us(t0), ReadAt: us(now),
			AttemptSeq: 1, AttemptKind: store.AttemptCall, AttemptRequestID: "req-a",
		}
		if diff := cmp.Diff(want, r); diff != "" {
			t.Errorf("Finish(Succeeded) record mismatch (-want +got):\n%s", diff)
		}
		wantAttempts := []store.Attempt{{Number: 1, Kind: store.AttemptCall, Owner: "a", RequestID: "req-a",
			StartedAt: us(t0), EndedAt: us(now), ProviderStatus: 201, HTTPRequests: 2, Reply: []byte(`{"id":"p1"}`),
			State: store.StateSucceeded}}
		if as, err := s.Attempts(ctx, r); err != nil || !cmp.Equal(wantAttempts, as) {
			t.Errorf("Attempts() = %v (-want +got):\n%s", err, cmp.Diff(wantAttempts, as))
		}
		// Even long after the window, a success replays.
		for _, at := range []time.Time{now, t0.Add(2 * window)} {
			clk.Set(at)
			rb := begin(t, s, claim("k", "body", "b"), store.Replay)
			if diff := cmp.Diff(readAt(want, at), rb.Record); diff != "" {
				t.Errorf("Replay record mismatch (-want +got):\n%s", diff)
			}
		}
	})

	t.Run("ReusedInEveryState", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		setups := map[string]func(key string){
			"InProgress": func(key string) { begin(t, s, claim(key, "body", "a"), store.Acquired) },
			"Succeeded": func(key string) {
				begin(t, s, claim(key, "body", "a"), store.Acquired)
				finish(t, s, store.Finish{Key: key, Owner: "a", State: store.StateSucceeded})
			},
			"NotCreated": func(key string) {
				begin(t, s, claim(key, "body", "a"), store.Acquired)
				finish(t, s, store.Finish{Key: key, Owner: "a", State: store.StateNotCreated})
			},
			"OutcomeUnknown": func(key string) { makeUnknown(t, s, claim(key, "body", "a"), 0) },
			"Quiet": func(key string) {
				begin(t, s, claim(key, "body", "a"), store.Acquired)
				finish(t, s, store.Finish{Key: key, Owner: "a", State: store.StateOutcomeUnknown, QuietFor: 3 * window})
			},
		}
		for name, setup := range setups {
			clk.Set(t0)
			setup(name)
			before := get(t, s, name)
			for _, at := range []time.Time{t0, t0.Add(lease), t0.Add(2 * window)} {
				clk.Set(at)
				got := begin(t, s, claim(name, "other body", "b"), store.Reused)
				if diff := cmp.Diff(readAt(before, at), got.Record); diff != "" {
					t.Errorf("%s: Reused record (-stored +got):\n%s", name, diff)
				}
			}
			if diff := cmp.Diff(readAt(before, clk.Now()), get(t, s, name)); diff != "" {
				t.Errorf("%s: Reused changed the record (-before +after):\n%s", name, diff)
			}
		}
	})

	t.Run("NotCreatedStartsNewWindow", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		begin(t, s, claim("k", "body", "a"), store.Acquired)
		finish(t, s, store.Finish{Key: "k", Owner: "a", State: store.StateNotCreated, AddAttempts: 1, ProviderStatus: 400})
		// Even after the first window closed.
		later := clk.Set(t0.Add(2 * window))
		got := begin(t, s, claim("k", "body", "b"), store.Acquired)
		if got.Prior != store.StateNotCreated || got.Record.PriorState != store.StateNotCreated {
			t.Errorf("Prior = %v, PriorState %v, want NotCreated", got.Prior, got.Record.PriorState)
		}
		if !got.Record.SettleBy.Equal(us(later.Add(window))) || got.Record.State != store.StateInProgress || got.Record.LeaseOwner != "b" {
			t.Errorf("record = state %v owner %q SettleBy %v, want InProgress b %v", got.Record.State, got.Record.LeaseOwner, got.Record.SettleBy, us(later.Add(window)))
		}
		if got.Record.Attempts != 1 {
			t.Errorf("Attempts = %d, want 1 kept", got.Record.Attempts)
		}
	})

	t.Run("OutcomeUnknownWindow", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		u := makeUnknown(t, s, claim("k", "body", "a"), time.Minute)
		// Before SettleBy: acquired, window kept.
		clk.Set(t0.Add(window - time.Microsecond))
		got := begin(t, s, claim("k", "body", "b"), store.Acquired)
		if got.Prior != store.StateOutcomeUnknown || !got.Record.SettleBy.Equal(u.SettleBy) {
			t.Errorf("Prior %v SettleBy %v, want OutcomeUnknown %v", got.Prior, got.Record.SettleBy, u.SettleBy)
		}
		finish(t, s, store.Finish{Key: "k", Owner: "b", State: store.StateOutcomeUnknown, SettleAfter: time.Minute})
		// At or after SettleBy: past the window, left alone.
		before := get(t, s, "k")
		at := clk.Set(t0.Add(window))
		pw := begin(t, s, claim("k", "body", "c"), store.PastWindow)
		if diff := cmp.Diff(readAt(before, at), pw.Record); diff != "" {
			t.Errorf("PastWindow record (-before +after):\n%s", diff)
		}
		if diff := cmp.Diff(readAt(before, at), get(t, s, "k")); diff != "" {
			t.Errorf("PastWindow changed the record (-before +after):\n%s", diff)
		}

		// An expired InProgress record past the window becomes OutcomeUnknown.
		clk.Set(t0)
		begin(t, s, claim("ip", "body", "a"), store.Acquired)
		clk.Set(t0.Add(window))
		pw = begin(t, s, claim("ip", "body", "b"), store.PastWindow)
		if pw.Record.State != store.StateOutcomeUnknown || pw.Record.LeaseOwner != "" {
			t.Errorf("expired InProgress past window: state %v owner %q, want OutcomeUnknown and no lease", pw.Record.State, pw.Record.LeaseOwner)
		}
		if r := get(t, s, "ip"); r.State != store.StateOutcomeUnknown {
			t.Errorf("stored state %v, want OutcomeUnknown", r.State)
		}
		// Its old owner can't finish it any more.
		if _, err := s.Finish(ctx, store.Finish{Key: "ip", Owner: "a", State: store.StateNotCreated}); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Finish after PastWindow error = %v, want ErrLeaseLost", err)
		}
	})

	t.Run("ClaimDue", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		now := t0.Add(time.Hour)
		makeUnknown(t, s, claim("due", "body", "a"), time.Hour)                 // due exactly now
		makeUnknown(t, s, claim("not-yet", "body", "a"), time.Hour+time.Second) // not due
		clk.Set(now.Add(-window))
		makeUnknown(t, s, claim("closed", "body", "a"), window) // window closed at now
		clk.Set(now.Add(-lease))
		begin(t, s, claim("expired", "body", "a"), store.Acquired) // lease ended at now
		clk.Set(now)
		begin(t, s, claim("leased", "body", "a"), store.Acquired) // lease holds
		clk.Set(t0)
		begin(t, s, claim("done", "body", "a"), store.Acquired)
		finish(t, s, store.Finish{Key: "done", Owner: "a", State: store.StateSucceeded}) // nothing to settle

		clk.Set(now)
		const q = 5 * time.Second
		got := claimDue(t, s, "settler", q, 10)
		if diff := cmp.Diff(map[string]int{"due": 1, "expired": 1}, keys(got)); diff != "" {
			t.Errorf("ClaimDue() keys (-want +got):\n%s", diff)
		}
		prior := map[string]store.State{"due": store.StateOutcomeUnknown, "expired": store.StateInProgress}
		for _, r := range got {
			if r.State != store.StateInProgress || r.LeaseOwner != "settler" || !r.LeaseExpiresAt.Equal(us(now.Add(lease))) {
				t.Errorf("claimed %q: state %v lease %q until %v, want InProgress settler until %v", r.Key, r.State, r.LeaseOwner, r.LeaseExpiresAt, us(now.Add(lease)))
			}
			if !r.QuietUntil.Equal(us(now.Add(lease+q))) || !r.AttemptStartedAt.Equal(us(now)) || r.PriorState != prior[r.Key] || !r.ReadAt.Equal(us(now)) {
				t.Errorf("claimed %q: QuietUntil %v AttemptStartedAt %v PriorState %v ReadAt %v, want %v %v %v %v", r.Key,
					r.QuietUntil, r.AttemptStartedAt, r.PriorState, r.ReadAt, us(now.Add(lease+q)), us(now), prior[r.Key], us(now))
			}
			if diff := cmp.Diff(r, get(t, s, r.Key)); diff != "" {
				t.Errorf("claimed %q: stored record (-returned +stored):\n%s", r.Key, diff)
			}
		}
		if again := claimDue(t, s, "other", 0, 10); len(again) != 0 {
			t.Errorf("second ClaimDue() = %v; want nothing (leased)", keys(again))
		}
		// The settler finishes: SettleAttempts counts it.
		r := finish(t, s, store.Finish{Key: "due", Owner: "settler", State: store.StateOutcomeUnknown, AddAttempts: 1, SettleAfter: time.Minute, Settlement: true})
		if r.SettleAttempts != 1 || r.Attempts != 2 || !r.NextSettleAt.Equal(us(now.Add(time.Minute))) {
			t.Errorf("after settlement: SettleAttempts %d Attempts %d NextSettleAt %v, want 1, 2, %v", r.SettleAttempts, r.Attempts, r.NextSettleAt, us(now.Add(time.Minute)))
		}
		// limit is honoured.
		clk.Set(t0)
		for i := range 5 {
			makeUnknown(t, s, claim(fmt.Sprintf("many%d", i), "body", "a"), 0)
		}
		clk.Set(now)
		if got, err := s.ClaimDue(ctx, "settler", lease, 0, 3); err != nil || len(got) != 3 {
			t.Errorf("ClaimDue(limit 3) = %d records, %v; want 3", len(got), err)
		}
		if got, err := s.ClaimDue(ctx, "settler", lease, 0, 0); err != nil || len(got) != 0 {
			t.Errorf("ClaimDue(limit 0) = %d records, %v; want none", len(got), err)
		}
	})

	t.Run("ClaimDueConcurrentClaimers", func(t *testing.T) {
		t.Parallel()
		url := b.url(t)
		clk := newClock(t0)
		s := openStore(t, url, "sandbox", clk)
		// A second Store on the same database stands in for another replica.
		s2 := s
		if b.persistent {
			s2 = openStore(t, url, "sandbox", clk)
		}
		const n = 40
		for i := range n {
			makeUnknown(t, s, claim(fmt.Sprintf("k%02d", i), "body", "a"), 0)
		}
		clk.Set(t0.Add(time.Minute))
		var (
			mu     sync.Mutex
			seen   = map[string]string{}
			wg     sync.WaitGroup
			errs   = make(chan error, 4)
			stores = []*store.Store{s, s2, s, s2}
		)
		for w, st := range stores {
			owner := fmt.Sprintf("replica%d", w)
			wg.Go(func() {
				for {
					got, err := st.ClaimDue(ctx, owner, lease, 0, 3)
					if err != nil {
						errs <- err
						return
					}
					if len(got) == 0 {
						return
					}
					mu.Lock()
					for _, r := range got {
						if prev, ok := seen[r.Key]; ok {
							errs <- fmt.Errorf("%s claimed by %s and %s", r.Key, prev, owner)
						}
						seen[r.Key] = owner
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if len(seen) != n {
			t.Errorf("claimed %d records, want %d", len(seen), n)
		}
	})

	t.Run("GiveUp", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		end := t0.Add(window)
		makeUnknown(t, s, claim("unknown", "body", "a"), 0)        // window closed at end
		begin(t, s, claim("expired", "body", "a"), store.Acquired) // lease long gone
		begin(t, s, claim("leased", "body", "a"), store.Acquired)  //
		clk.Set(t0.Add(time.Hour))
		begin(t, s, claim("open", "body", "a"), store.Acquired) // window still open at end
		finish(t, s, store.Finish{Key: "open", Owner: "a", State: store.StateOutcomeUnknown})
		clk.Set(t0)
		begin(t, s, claim("notcreated", "body", "a"), store.Acquired)
		finish(t, s, store.Finish{Key: "notcreated", Owner: "a", State: store.StateNotCreated})
		// "leased" renews its lease past the window's end.
		clk.Set(end.Add(-time.Second))
		begin(t, s, claim("leased", "body", "a"), store.Acquired)

		clk.Set(end)
		got, err := s.GiveUp(ctx, "", 10)
		if err != nil {
			t.Fatalf("GiveUp() error = %v", err)
		}
		if diff := cmp.Diff(map[string]int{"unknown": 1, "expired": 1}, keys(got)); diff != "" {
			t.Errorf("GiveUp() keys (-want +got):\n%s", diff)
		}
		for _, r := range got {
			if r.State != store.StateOutcomeUnknown || !r.GaveUp || r.LeaseOwner != "" || !r.UpdatedAt.Equal(us(end)) || !r.ReadAt.Equal(us(end)) {
				t.Errorf("gave up %q: state %v GaveUp %v owner %q UpdatedAt %v ReadAt %v, want OutcomeUnknown, true, none, %v, %v",
					r.Key, r.State, r.GaveUp, r.LeaseOwner, r.UpdatedAt, r.ReadAt, us(end), us(end))
			}
		}
		if again, err := s.GiveUp(ctx, "", 10); err != nil || len(again) != 0 {
			t.Errorf("second GiveUp() = %v, %v; want nothing (each once ever)", keys(again), err)
		}
		if none, err := s.GiveUp(ctx, "", 0); err != nil || len(none) != 0 {
			t.Errorf("GiveUp(limit 0) = %v, %v; want nothing", keys(none), err)
		}
		// Given up is past the window: only "open" may still be settled.
		if got := claimDue(t, s, "settler", 0, 10); !cmp.Equal(keys(got), map[string]int{"open": 1}) {
			t.Errorf("ClaimDue after GiveUp = %v; want open only", keys(got))
		}
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatalf("Stats() error = %v", err)
		}
		if st.Unsettled != 2 {
			t.Errorf("Stats().Unsettled = %d, want 2", st.Unsettled)
		}
	})

	t.Run("ConcurrentBeginOneKey", func(t *testing.T) {
		t.Parallel()
		s, _ := fresh(t)
		const n = 16
		outcomes := make(chan store.Outcome, n)
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				b, err := s.Begin(ctx, claim("one", "body", fmt.Sprintf("o%d", i)))
				if err != nil {
					errs <- err
					return
				}
				outcomes <- b.Outcome
			})
		}
		wg.Wait()
		close(outcomes)
		close(errs)
		for err := range errs {
			t.Errorf("Begin error = %v", err)
		}
		count := map[store.Outcome]int{}
		for o := range outcomes {
			count[o]++
		}
		if diff := cmp.Diff(map[store.Outcome]int{store.Acquired: 1, store.Busy: n - 1}, count); diff != "" {
			t.Errorf("outcomes (-want +got):\n%s", diff)
		}
	})

	// Concurrent writes are committed together (group commit in SQLite):
	// each still gets its own outcome, a lost lease fails only its own
	// Finish, and every acquired record is there once Begin returns.
	t.Run("ConcurrentBeginsAndFinishesDistinctKeys", func(t *testing.T) {
		t.Parallel()
		s, _ := fresh(t)
		const n = 24
		for i := range n {
			begin(t, s, claim(fmt.Sprintf("pre%d", i), "body", "a"), store.Acquired)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 3*n)
		for i := range n {
			wg.Go(func() {
				key := fmt.Sprintf("new%d", i)
				b, err := s.Begin(ctx, claim(key, "body", "b"))
				if err != nil || b.Outcome != store.Acquired || b.Record.Key != key || b.Record.State != store.StateInProgress {
					errs <- fmt.Errorf("Begin(%q) = %v %q %v, %v; want Acquired InProgress", key, b.Outcome, b.Record.Key, b.Record.State, err)
				}
			})
			wg.Go(func() {
				key := fmt.Sprintf("pre%d", i)
				owner := "a"
				if i%3 == 0 {
					owner = "not-the-owner"
				}
				r, err := s.Finish(ctx, store.Finish{Key: key, Owner: owner, State: store.StateSucceeded, AddAttempts: 1,
					ProviderStatus: 200, Reply: []byte(fmt.Sprintf(`{"n":%d}`, i))})
				switch {
				case owner != "a" && !errors.Is(err, store.ErrLeaseLost):
					errs <- fmt.Errorf("Finish(%q, wrong owner) error = %v, want ErrLeaseLost", key, err)
				case owner == "a" && (err != nil || string(r.Reply) != fmt.Sprintf(`{"n":%d}`, i)):
					errs <- fmt.Errorf("Finish(%q) = %s, %v; want its own reply", key, r.Reply, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		for i := range n {
			if r := get(t, s, fmt.Sprintf("new%d", i)); r.State != store.StateInProgress || r.LeaseOwner != "b" {
				t.Errorf("record new%d = %v owned by %q, want InProgress owned by b", i, r.State, r.LeaseOwner)
			}
			want := store.StateSucceeded
			if i%3 == 0 {
				want = store.StateInProgress
			}
			if r := get(t, s, fmt.Sprintf("pre%d", i)); r.State != want {
				t.Errorf("record pre%d = %v, want %v", i, r.State, want)
			}
		}
		if s.Commits() == 0 {
			t.Error("Commits() = 0 after writes")
		}
	})

	// FinishWrite's outcome is durable when it returns, with its attempt.
	t.Run("FinishWrite", func(t *testing.T) {
		t.Parallel()
		url := b.url(t)
		clk := newClock(t0)
		s, err := store.Open(ctx, url, "sandbox", store.Options{Now: clk.Now, TakeoverGrace: -1})
		if err != nil {
			t.Fatal(err)
		}
		const n = 8
		for i := range n {
			begin(t, s, claim(fmt.Sprintf("k%d", i), "body", "a"), store.Acquired)
		}
		clk.Set(t0.Add(time.Second))
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				_, errs[i] = s.FinishWrite(ctx, store.Finish{Key: fmt.Sprintf("k%d", i), Owner: "a", State: store.StateSucceeded,
					AddAttempts: 1, ProviderStatus: 200, Reply: []byte(`{}`)})
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("FinishWrite(k%d) error = %v", i, err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close() error = %v", err)
		}
		if !b.persistent {
			return
		}
		s = openStore(t, url, "sandbox", clk)
		for i := range n {
			r := get(t, s, fmt.Sprintf("k%d", i))
			if r.State != store.StateSucceeded || !r.UpdatedAt.Equal(us(t0.Add(time.Second))) {
				t.Errorf("after reopening, record k%d = %v updated %v, want Succeeded updated %v", i, r.State, r.UpdatedAt, us(t0.Add(time.Second)))
			}
			as, err := s.Attempts(ctx, r)
			if err != nil || len(as) != 1 || as[0].ProviderStatus != 200 || string(as[0].Reply) != `{}` || as[0].Owner != "a" || as[0].Number != 1 {
				t.Errorf("after reopening, attempts of k%d = %+v, %v; want one with the 200", i, as, err)
			}
		}
	})

	t.Run("ExactKeys", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		// An incompressible 10 KB key, too: PostgreSQL can't index one in a
		// btree directly.
		random := make([]byte, 7<<10)
		rand.Read(random)
		ks := []string{base64.StdEncoding.EncodeToString(random), "abc", "ABC", "abc ", " abc", "abc  ", "é", "e\u0301", "日本語", "ß", "ss", "İ", "i", "😀",
			strings.Repeat("k", 10<<10), strings.Repeat("k", 10<<10) + " ", `quote'"\`}
		for i, k := range ks {
			begin(t, s, claim(k, fmt.Sprintf("body%d", i), "a"), store.Acquired)
		}
		for i, k := range ks {
			r := get(t, s, k)
			if r.Key != k || string(r.Body) != fmt.Sprintf("body%d", i) {
				t.Errorf("Get(key %d) = key %.20q body %q, want %.20q body%d", i, r.Key, r.Body, k, i)
			}
			// The same key again finds its own record.
			begin(t, s, claim(k, fmt.Sprintf("body%d", i), "b"), store.Busy)
		}
		// A NUL byte: stored exactly, or refused with ErrKeyNotStorable
		// (always in PostgreSQL, whose text can't hold it).
		for _, k := range []string{"a\x00b", "a\x00c"} {
			bg, err := s.Begin(ctx, claim(k, "nul "+k, "a"))
			switch {
			case errors.Is(err, store.ErrKeyNotStorable):
			case err != nil:
				t.Errorf("Begin(NUL key) error = %v, want nil or ErrKeyNotStorable", err)
			case b.name == "postgres":
				t.Errorf("Begin(NUL key) on PostgreSQL = %v, want ErrKeyNotStorable", bg.Outcome)
			case bg.Outcome != store.Acquired:
				t.Errorf("Begin(NUL key %q) = %v, want Acquired", k, bg.Outcome)
			default:
				if r := get(t, s, k); r.Key != k || string(r.Body) != "nul "+k {
					t.Errorf("Get(NUL key %q) = key %q body %q", k, r.Key, r.Body)
				}
				ks = append(ks, k)
			}
		}
		// Each key's tombstone refuses that key and no other.
		for _, k := range ks {
			if _, err := s.Finish(ctx, store.Finish{Key: k, Owner: "a", State: store.StateSucceeded}); err != nil {
				t.Fatalf("Finish(%.20q) error = %v", k, err)
			}
		}
		clk.Set(t0.Add(keep + time.Second))
		deleteAll(t, s, store.Retention{Records: keep, Tombstones: keepTombstones}, 10)
		for i, k := range ks {
			want := sha256.Sum256([]byte(k))
			if got := begin(t, s, claim(k, "other body", "b"), store.Expired); got.Tombstone.KeySHA256 != want {
				t.Errorf("Begin(key %d) after retention: tombstone of another key", i)
			}
		}
		begin(t, s, claim("abcd", "body", "b"), store.Acquired) // a key never used
	})

	t.Run("EnvironmentStamp", func(t *testing.T) {
		t.Parallel()
		if !b.persistent {
			t.Skip("each Open of this backend is a new database")
		}
		url := b.url(t)
		clk := newClock(t0)
		s := openStore(t, url, "sandbox", clk)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		_, err := store.Open(ctx, url, "live", store.Options{})
		if !errors.Is(err, store.ErrWrongEnvironment) {
			t.Fatalf("Open(live) on a sandbox database error = %v, want ErrWrongEnvironment", err)
		}
		if !strings.Contains(err.Error(), `"sandbox"`) {
			t.Errorf("Open(live) error %q doesn't name the database's environment", err)
		}
		s = openStore(t, url, "sandbox", clk) // the right one still opens
		s.Close()
	})

	t.Run("ConcurrentOpenMigrates", func(t *testing.T) {
		t.Parallel()
		if !b.persistent {
			t.Skip("each Open of this backend is a new database")
		}
		url := b.url(t)
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Go(func() {
				s, err := store.Open(ctx, url, "sandbox", store.Options{})
				if err != nil {
					errs <- err
					return
				}
				errs <- s.Close()
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("concurrent Open error = %v", err)
			}
		}
	})

	t.Run("Reopen", func(t *testing.T) {
		t.Parallel()
		if !b.persistent {
			t.Skip("each Open of this backend is a new database")
		}
		url := b.url(t)
		clk := newClock(t0)
		s := openStore(t, url, "sandbox", clk)
		begin(t, s, quiet(claim("k", "body", "a"), time.Minute), store.Acquired)
		want := finish(t, s, store.Finish{Key: "k", Owner: "a", State: store.StateOutcomeUnknown, ProviderStatus: 503,
			Reply: []byte("{}"), SettleAfter: time.Second, QuietFor: time.Minute})
		e, err := s.AppendEvent(ctx, store.Event{ReceivedAt: t0, Body: []byte("x"), BodySHA256: sha256.Sum256([]byte("x"))})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close() error = %v", err)
		}
		s = openStore(t, url, "sandbox", clk)
		if diff := cmp.Diff(want, get(t, s, "k")); diff != "" {
			t.Errorf("record after reopen (-before +after):\n%s", diff)
		}
		if got, err := s.ListEvents(ctx, store.EventQuery{After: 0, Limit: 10}); err != nil || len(got) != 1 || !cmp.Equal(e, got[0]) {
			t.Errorf("ListEvents after reopen = %+v, %v; want [%+v]", got, err, e)
		}
	})

	t.Run("DuplicatesWithinRetention", func(t *testing.T) {
		t.Parallel()
		s, err := store.Open(ctx, b.url(t), "sandbox", store.Options{Retention: time.Hour, Now: newClock(t0).Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		body := []byte(`{"same":true}`)
		var seqs []int64
		for i, at := range []time.Time{t0, t0.Add(2 * time.Hour), t0.Add(2*time.Hour + time.Minute)} {
			e, err := s.AppendEvent(ctx, store.Event{ReceivedAt: at, ContentType: "application/json", Body: body, BodySHA256: sha256.Sum256(body)})
			if err != nil {
				t.Fatalf("AppendEvent(%d) error = %v", i, err)
			}
			seqs = append(seqs, e.Sequence)
			// The first is past retention when the second arrives (though
			// not yet deleted): the second is no duplicate of it.
			var want int64
			if i == 2 {
				want = seqs[1]
			}
			if e.DuplicateOf != want {
				t.Errorf("AppendEvent(%d).DuplicateOf = %d, want %d", i, e.DuplicateOf, want)
			}
		}
	})

	t.Run("Events", func(t *testing.T) {
		t.Parallel()
		s, _ := fresh(t)
		if n, err := s.LastSequence(ctx); err != nil || n != 0 {
			t.Errorf("LastSequence() on empty = %d, %v; want 0", n, err)
		}
		ev := func(body string, hs ...store.Header) store.Event {
			return store.Event{ReceivedAt: t0, ContentType: "application/json", Headers: hs, Body: []byte(body), BodySHA256: sha256.Sum256([]byte(body))}
		}
		hs := []store.Header{{"X-Sig", "b"}, {"Content-Type", "application/json"}, {"X-Sig", "a"}, {"X-Empty", ""}}
		in := []store.Event{ev(`{"a":1}`, hs...), ev(`{"b":2}`), ev(`{"a":1}`), ev(`{"b":2}`), ev("")}
		var want []store.Event
		for i, e := range in {
			got, err := s.AppendEvent(ctx, e)
			if err != nil {
				t.Fatalf("AppendEvent(%d) error = %v", i, err)
			}
			e.Sequence = int64(i + 1)
			e.ReceivedAt = us(e.ReceivedAt)
			e.DuplicateOf = map[int]int64{2: 1, 3: 2}[i]
			if min := int64(len(e.Body) + len(e.ContentType)); got.Size <= min {
				t.Errorf("AppendEvent(%d).Size = %d, want more than the body and content type's %d", i, got.Size, min)
			}
			e.Size = got.Size
			if diff := cmp.Diff(e, got); diff != "" {
				t.Errorf("AppendEvent(%d) (-want +got):\n%s", i, diff)
			}
			want = append(want, e)
		}
		got, err := s.ListEvents(ctx, store.EventQuery{After: 0, Limit: 100})
		if err != nil {
			t.Fatalf("ListEvents() error = %v", err)
		}
		// Empty bodies may come back nil.
		if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b []byte) bool { return string(a) == string(b) })); diff != "" {
			t.Errorf("ListEvents(0, 100) (-want +got):\n%s", diff)
		}
		if got, err := s.ListEvents(ctx, store.EventQuery{After: 2, Limit: 2}); err != nil || len(got) != 2 || got[0].Sequence != 3 || got[1].Sequence != 4 {
			t.Errorf("ListEvents(2, 2) = %+v, %v; want sequences 3, 4", got, err)
		}
		if got, err := s.ListEvents(ctx, store.EventQuery{After: 5, Limit: 10}); err != nil || len(got) != 0 {
			t.Errorf("ListEvents(5, 10) = %+v, %v; want none", got, err)
		}
		if n, err := s.LastSequence(ctx); err != nil || n != 5 {
			t.Errorf("LastSequence() = %d, %v; want 5", n, err)
		}
	})

	t.Run("ConcurrentAppendNeverSkips", func(t *testing.T) {
		t.Parallel()
		s, _ := fresh(t)
		const writers, each = 8, 25
		const total = writers * each
		var wg sync.WaitGroup
		errs := make(chan error, writers+1)
		for w := range writers {
			wg.Go(func() {
				for i := range each {
					body := fmt.Sprintf(`{"w":%d,"i":%d}`, w, i)
					if _, err := s.AppendEvent(ctx, store.Event{ReceivedAt: t0, Body: []byte(body), BodySHA256: sha256.Sum256([]byte(body))}); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		// The reader polls from the last sequence it saw, as a webhook
		// consumer does; a late-committing lower sequence would be skipped
		// and show up as a gap.
		// A writer that fails leaves the reader short of total: it gives
		// up after a minute.
		done := make(chan struct{})
		wg.Go(func() {
			defer close(done)
			deadline := time.Now().Add(time.Minute)
			var last int64
			for last < total {
				if time.Now().After(deadline) {
					errs <- fmt.Errorf("reader saw sequences up to %d of %d in a minute", last, total)
					return
				}
				got, err := s.ListEvents(ctx, store.EventQuery{After: last, Limit: 7})
				if err != nil {
					errs <- err
					return
				}
				for _, e := range got {
					if e.Sequence != last+1 {
						errs <- fmt.Errorf("reader after %d got sequence %d: skipped", last, e.Sequence)
						return
					}
					last = e.Sequence
				}
			}
		})
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if n, err := s.LastSequence(ctx); err != nil || n != total {
			t.Errorf("LastSequence() = %d, %v; want %d", n, err, total)
		}
	})

	t.Run("Stats", func(t *testing.T) {
		t.Parallel()
		s, _ := fresh(t)
		begin(t, s, claim("ip", "body", "a"), store.Acquired)
		for i, st := range []store.State{store.StateSucceeded, store.StateNotCreated, store.StateOutcomeUnknown, store.StateOutcomeUnknown} {
			k := fmt.Sprintf("%v-%d", st, i)
			begin(t, s, claim(k, "body", "a"), store.Acquired)
			finish(t, s, store.Finish{Key: k, Owner: "a", State: st})
		}
		if _, err := s.AppendEvent(ctx, store.Event{ReceivedAt: t0, BodySHA256: sha256.Sum256(nil)}); err != nil {
			t.Fatal(err)
		}
		got, err := s.Stats(ctx)
		if err != nil {
			t.Fatalf("Stats() error = %v", err)
		}
		want := store.Stats{ByState: map[store.State]int64{
			store.StateInProgress: 1, store.StateSucceeded: 1, store.StateNotCreated: 1, store.StateOutcomeUnknown: 2,
		}, Events: 1}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Stats() (-want +got):\n%s", diff)
		}
	})

	testQuiet(t, fresh)
	testClockAndReads(t, fresh)
	testRetention(t, b, fresh)
	testList(t, fresh)
	testResolve(t, fresh)
	testInbox(t, b)
}

// testQuiet checks the provider quiet period: nothing is sent with a key
// while an earlier request with it may still be at the provider.
func testQuiet(t *testing.T, fresh func(*testing.T) (*store.Store, *clock)) {
	ctx := context.Background()

	// An attempt that ended without the provider's answer leaves the key
	// quiet for Finish.QuietFor: Begin answers Quiet and changes nothing,
	// settlement leaves it alone, and both go on once it has passed.
	t.Run("QuietAfterUnansweredAttempt", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		begin(t, s, claim("k", "body", "a"), store.Acquired)
		done := clk.Set(t0.Add(time.Second))
		u := finish(t, s, store.Finish{Key: "k", Owner: "a", State: store.StateOutcomeUnknown, AddAttempts: 1, QuietFor: 20 * time.Second})
		end := done.Add(20 * time.Second)
		if !u.QuietUntil.Equal(us(end)) || !u.NextSettleAt.Equal(us(done)) || u.LeaseOwner != "" {
			t.Errorf("Finish(QuietFor 20s): QuietUntil %v NextSettleAt %v owner %q, want %v, %v, none", u.QuietUntil, u.NextSettleAt, u.LeaseOwner, us(end), us(done))
		}
		for _, at := range []time.Time{done, end.Add(-time.Microsecond)} {
			clk.Set(at)
			q := begin(t, s, claim("k", "body", "b"), store.Quiet)
			if diff := cmp.Diff(readAt(u, at), q.Record); diff != "" {
				t.Errorf("Quiet record at %v (-stored +got):\n%s", at, diff)
			}
			if got := claimDue(t, s, "settler", 0, 10); len(got) != 0 {
				t.Errorf("ClaimDue at %v while quiet = %v, want nothing", at, keys(got))
			}
		}
		if diff := cmp.Diff(readAt(u, clk.Now()), get(t, s, "k")); diff != "" {
			t.Errorf("Quiet changed the record (-before +after):\n%s", diff)
		}
		clk.Set(end)
		got := begin(t, s, claim("k", "body", "b"), store.Acquired)
		if got.Prior != store.StateOutcomeUnknown || got.Record.LeaseOwner != "b" || !got.Record.QuietUntil.Equal(us(end.Add(lease))) {
			t.Errorf("Begin once quiet passed: Prior %v owner %q QuietUntil %v, want OutcomeUnknown, b, %v", got.Prior, got.Record.LeaseOwner, got.Record.QuietUntil, us(end.Add(lease)))
		}
	})

	// A claimant that dies mid-call leaves its request presumed at the
	// provider until its lease ends plus Claim.Quiet.
	t.Run("QuietAfterLeaseOfDeadHolder", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		const q = 10 * time.Second
		first := begin(t, s, quiet(claim("k", "body", "a"), q), store.Acquired)
		end := t0.Add(lease + q)
		for _, at := range []time.Time{t0.Add(lease), end.Add(-time.Microsecond)} {
			clk.Set(at)
			got := begin(t, s, claim("k", "body", "b"), store.Quiet)
			if diff := cmp.Diff(readAt(first.Record, at), got.Record); diff != "" {
				t.Errorf("Quiet record at %v (-stored +got):\n%s", at, diff)
			}
			if got := claimDue(t, s, "settler", 0, 10); len(got) != 0 {
				t.Errorf("ClaimDue at %v while quiet = %v, want nothing", at, keys(got))
			}
			if got, err := s.GiveUp(ctx, "", 10); err != nil || len(got) != 0 {
				t.Errorf("GiveUp at %v = %v, %v; want nothing (window open)", at, keys(got), err)
			}
		}
		clk.Set(end)
		took := begin(t, s, claim("k", "body", "b"), store.Acquired)
		if took.Prior != store.StateInProgress || took.Record.LeaseOwner != "b" {
			t.Errorf("Begin once quiet passed: Prior %v owner %q, want InProgress, b", took.Prior, took.Record.LeaseOwner)
		}
		if _, err := s.Finish(ctx, store.Finish{Key: "k", Owner: "a", State: store.StateNotCreated}); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Finish(dead holder, not created) error = %v, want ErrLeaseLost", err)
		}
	})

	// Finish sets QuietUntil from QuietFor, or clears what Begin presumed.
	t.Run("FinishSetsOrClearsQuiet", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		for _, tc := range []struct {
			name     string
			state    store.State
			quietFor time.Duration
			want     time.Duration // 0: no quiet period
			then     store.Outcome
		}{
			{"answered", store.StateOutcomeUnknown, 0, 0, store.Acquired},
			{"negative", store.StateOutcomeUnknown, -time.Second, 0, store.Acquired},
			{"unanswered", store.StateOutcomeUnknown, 15 * time.Second, 15 * time.Second, store.Quiet},
			// NotCreated starts the key afresh, whatever QuietUntil says.
			{"not created", store.StateNotCreated, 15 * time.Second, 15 * time.Second, store.Acquired},
			{"succeeded", store.StateSucceeded, 15 * time.Second, 15 * time.Second, store.Replay},
		} {
			now := clk.Set(t0)
			begin(t, s, quiet(claim(tc.name, "body", "a"), time.Hour), store.Acquired)
			r := finish(t, s, store.Finish{Key: tc.name, Owner: "a", State: tc.state, QuietFor: tc.quietFor})
			want := time.Time{}
			if tc.want > 0 {
				want = us(now.Add(tc.want))
			}
			if !r.QuietUntil.Equal(want) {
				t.Errorf("%s: Finish(QuietFor %v) QuietUntil = %v, want %v", tc.name, tc.quietFor, r.QuietUntil, want)
			}
			got := begin(t, s, claim(tc.name, "body", "b"), tc.then)
			if tc.then == store.Acquired && !got.Record.QuietUntil.Equal(us(now.Add(lease))) {
				t.Errorf("%s: reacquired QuietUntil = %v, want %v", tc.name, got.Record.QuietUntil, us(now.Add(lease)))
			}
		}
	})

	t.Run("ClaimDueSkipsQuiet", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		const q = 10 * time.Second
		makeUnknown(t, s, claim("loud", "body", "a"), 0)
		begin(t, s, claim("quiet", "body", "a"), store.Acquired)
		finish(t, s, store.Finish{Key: "quiet", Owner: "a", State: store.StateOutcomeUnknown, QuietFor: time.Minute})
		begin(t, s, quiet(claim("held", "body", "a"), time.Minute), store.Acquired) // its holder dies

		for _, step := range []struct {
			at   time.Duration
			want map[string]int
		}{
			{lease, map[string]int{"loud": 1}},                 // loud's settler then dies too
			{time.Minute - time.Microsecond, map[string]int{}}, //
			{time.Minute, map[string]int{"quiet": 1}},          // loud: lease ended, quiet until +70s
			{lease + time.Minute, map[string]int{"held": 1, "loud": 1}},
		} {
			now := clk.Set(t0.Add(step.at))
			got := claimDue(t, s, "settler", q, 10)
			if diff := cmp.Diff(step.want, keys(got)); diff != "" {
				t.Errorf("ClaimDue at t0+%v keys (-want +got):\n%s", step.at, diff)
			}
			for _, r := range got {
				if !r.QuietUntil.Equal(us(now.Add(lease + q))) {
					t.Errorf("ClaimDue at t0+%v: %s QuietUntil %v, want %v", step.at, r.Key, r.QuietUntil, us(now.Add(lease+q)))
				}
			}
		}
		// A settler that died leaves the key quiet for Begin too.
		clk.Set(t0.Add(lease + time.Minute + lease))
		begin(t, s, claim("held", "body", "b"), store.Quiet)
		clk.Set(t0.Add(lease + time.Minute + lease + q))
		begin(t, s, claim("held", "body", "b"), store.Acquired)
	})

	t.Run("PastWindowWinsOverQuiet", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		begin(t, s, claim("unknown", "body", "a"), store.Acquired)
		begin(t, s, quiet(claim("ip", "body", "a"), 2*window), store.Acquired)
		clk.Set(t0.Add(window - time.Second))
		u := finish(t, s, store.Finish{Key: "unknown", Owner: "a", State: store.StateOutcomeUnknown, QuietFor: time.Hour})
		end := clk.Set(t0.Add(window))
		if got := begin(t, s, claim("unknown", "body", "b"), store.PastWindow); !cmp.Equal(readAt(u, end), got.Record) {
			t.Errorf("PastWindow record = %+v, want unchanged %+v", got.Record, u)
		}
		got := begin(t, s, claim("ip", "body", "b"), store.PastWindow)
		if got.Record.State != store.StateOutcomeUnknown || got.Record.LeaseOwner != "" {
			t.Errorf("expired InProgress past window while quiet: state %v owner %q, want OutcomeUnknown, no lease", got.Record.State, got.Record.LeaseOwner)
		}
	})
}

// testClockAndReads checks what every read and write reports of the
// store's clock: ReadAt, AttemptStartedAt, PriorState, and ClockOffset.
func testClockAndReads(t *testing.T, fresh func(*testing.T) (*store.Store, *clock)) {
	ctx := context.Background()

	t.Run("ReadAt", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		check := func(what string, r store.Record) {
			t.Helper()
			if want := us(clk.Now()); !r.ReadAt.Equal(want) || r.ReadAt.Location() != time.UTC {
				t.Errorf("%s: ReadAt = %v, want %v", what, r.ReadAt, want)
			}
		}
		step := func() { clk.Add(time.Second + 7*time.Nanosecond) }
		check("Begin Acquired", begin(t, s, claim("k", "body", "a"), store.Acquired).Record)
		step()
		check("Begin Busy", begin(t, s, claim("k", "body", "b"), store.Busy).Record)
		check("Begin Reused", begin(t, s, claim("k", "other", "b"), store.Reused).Record)
		check("Get", get(t, s, "k"))
		step()
		check("Finish", finish(t, s, store.Finish{Key: "k", Owner: "a", State: store.StateOutcomeUnknown, QuietFor: 10 * time.Second}))
		step()
		check("Begin Quiet", begin(t, s, claim("k", "body", "b"), store.Quiet).Record)
		clk.Add(10 * time.Second)
		got := claimDue(t, s, "settler", 0, 10)
		if len(got) != 1 {
			t.Fatalf("ClaimDue = %v, want k", keys(got))
		}
		check("ClaimDue", got[0])
		finish(t, s, store.Finish{Key: "k", Owner: "settler", State: store.StateOutcomeUnknown})
		clk.Set(t0.Add(window))
		check("Begin PastWindow", begin(t, s, claim("k", "body", "b"), store.PastWindow).Record)
		gave, err := s.GiveUp(ctx, "", 10)
		if err != nil || len(gave) != 1 {
			t.Fatalf("GiveUp = %v, %v; want k", keys(gave), err)
		}
		check("GiveUp", gave[0])
		begin(t, s, claim("s", "body", "a"), store.Acquired)
		finish(t, s, store.Finish{Key: "s", Owner: "a", State: store.StateSucceeded})
		step()
		check("Begin Replay", begin(t, s, claim("s", "body", "b"), store.Replay).Record)
		// Acquiring an existing record, and closing an abandoned one.
		begin(t, s, claim("n", "body", "a"), store.Acquired)
		finish(t, s, store.Finish{Key: "n", Owner: "a", State: store.StateNotCreated})
		step()
		check("Begin Acquired (NotCreated)", begin(t, s, claim("n", "body", "b"), store.Acquired).Record)
		clk.Add(window)
		check("Begin PastWindow (abandoned)", begin(t, s, claim("n", "body", "c"), store.PastWindow).Record)
	})

	t.Run("PriorStateAndAttemptStartedAt", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		check := func(what string, b store.Began, prior store.State, started time.Time) {
			t.Helper()
			if b.Prior != prior || b.Record.PriorState != prior || !b.Record.AttemptStartedAt.Equal(us(started)) {
				t.Errorf("%s: Prior %v PriorState %v AttemptStartedAt %v, want %v, %v, %v", what, b.Prior, b.Record.PriorState, b.Record.AttemptStartedAt, prior, prior, us(started))
			}
		}
		check("new key", begin(t, s, claim("k", "body", "a"), store.Acquired), 0, t0)
		clk.Add(time.Second)
		// Finish keeps both.
		r := finish(t, s, store.Finish{Key: "k", Owner: "a", State: store.StateOutcomeUnknown})
		if r.PriorState != 0 || !r.AttemptStartedAt.Equal(us(t0)) {
			t.Errorf("after Finish: PriorState %v AttemptStartedAt %v, want 0, %v", r.PriorState, r.AttemptStartedAt, us(t0))
		}
		now := clk.Add(time.Second)
		check("from OutcomeUnknown", begin(t, s, claim("k", "body", "b"), store.Acquired), store.StateOutcomeUnknown, now)
		finish(t, s, store.Finish{Key: "k", Owner: "b", State: store.StateNotCreated})
		now = clk.Add(time.Second)
		check("from NotCreated", begin(t, s, claim("k", "body", "c"), store.Acquired), store.StateNotCreated, now)
		now = clk.Add(lease)
		check("from expired InProgress", begin(t, s, claim("k", "body", "d"), store.Acquired), store.StateInProgress, now)
		// Outcomes that acquire nothing change neither.
		clk.Add(time.Second)
		if b := begin(t, s, claim("k", "body", "e"), store.Busy); !b.Record.AttemptStartedAt.Equal(us(now)) || b.Record.PriorState != store.StateInProgress || b.Prior != 0 {
			t.Errorf("Busy: Prior %v PriorState %v AttemptStartedAt %v, want 0, InProgress, %v", b.Prior, b.Record.PriorState, b.Record.AttemptStartedAt, us(now))
		}
		// ClaimDue sets both, too.
		finish(t, s, store.Finish{Key: "k", Owner: "d", State: store.StateOutcomeUnknown})
		now = clk.Add(time.Second)
		got := claimDue(t, s, "settler", 0, 10)
		if len(got) != 1 || got[0].PriorState != store.StateOutcomeUnknown || !got[0].AttemptStartedAt.Equal(us(now)) {
			t.Errorf("ClaimDue = %+v, want k with PriorState OutcomeUnknown, AttemptStartedAt %v", got, us(now))
		}
	})

	// A store with a clock of its own (here Options.Now) compares the
	// local clock with it directly.
	t.Run("ClockOffset", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		for _, d := range []time.Duration{0, 10 * time.Second, -3*time.Second - 5*time.Microsecond} {
			got, err := s.ClockOffset(ctx, func() time.Time { return clk.Now().Add(d) })
			if err != nil || got != d {
				t.Errorf("ClockOffset(store clock %+v) = %v, %v; want %v", d, got, err, d)
			}
		}
	})
}

// testRetention checks DeleteExpired and tombstones: a record past
// retention leaves a tombstone that refuses its key (Begin answers
// Expired), is deleted a grace period later, and the tombstone itself
// expires after Retention.Tombstones.
func testRetention(t *testing.T, b backend, fresh func(*testing.T) (*store.Store, *clock)) {
	ctx := context.Background()
	retention := store.Retention{Records: keep, Tombstones: keepTombstones}
	rows := func(t *testing.T, s *store.Store, table string) int64 {
		t.Helper()
		n, err := store.CountRows(ctx, s, table)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	t.Run("DeleteExpiredInBatches", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		for i := range 5 {
			k := fmt.Sprintf("old%d", i)
			begin(t, s, claim(k, "body", "a"), store.Acquired)
			finish(t, s, store.Finish{Key: k, Owner: "a", State: store.StateSucceeded})
		}
		begin(t, s, claim("old-inprogress", "body", "a"), store.Acquired)
		cut := clk.Set(t0.Add(keep + time.Second))
		begin(t, s, claim("new", "body", "a"), store.Acquired)
		finish(t, s, store.Finish{Key: "new", Owner: "a", State: store.StateNotCreated})
		for i := range 3 {
			body := fmt.Sprint(i)
			at := t0
			if i == 2 {
				at = cut
			}
			if _, err := s.AppendEvent(ctx, store.Event{ReceivedAt: at, Body: []byte(body), BodySHA256: sha256.Sum256([]byte(body))}); err != nil {
				t.Fatal(err)
			}
		}
		// 5 tombstones and 2 events, at most 2 of each per call.
		if diff := cmp.Diff([]int{4, 2, 1}, deleteAll(t, s, retention, 2)); diff != "" {
			t.Errorf("DeleteExpired batches (-want +got):\n%s", diff)
		}
		if n := rows(t, s, "tombstones"); n != 5 {
			t.Errorf("%d tombstones, want 5", n)
		}
		// The 5 records, a grace period later.
		clk.Add(store.TombstoneGrace)
		if diff := cmp.Diff([]int{2, 2, 1}, deleteAll(t, s, retention, 2)); diff != "" {
			t.Errorf("DeleteExpired batches after the grace period (-want +got):\n%s", diff)
		}
		if n := rows(t, s, "records"); n != 2 {
			t.Errorf("%d records left, want 2", n)
		}
		for _, k := range []string{"old-inprogress", "new"} {
			get(t, s, k)
		}
		for i := range 5 {
			k := fmt.Sprintf("old%d", i)
			if _, err := s.Get(ctx, k); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Get(%s) after DeleteExpired error = %v, want ErrNotFound", k, err)
			}
			begin(t, s, claim(k, "body", "b"), store.Expired)
		}
		if got, err := s.ListEvents(ctx, store.EventQuery{After: 0, Limit: 10}); err != nil || len(got) != 1 || got[0].Sequence != 3 {
			t.Errorf("ListEvents after DeleteExpired = %+v, %v; want sequence 3 only", got, err)
		}
		// Sequences keep counting after deletions.
		if e, err := s.AppendEvent(ctx, store.Event{ReceivedAt: cut, BodySHA256: sha256.Sum256(nil)}); err != nil || e.Sequence != 4 {
			t.Errorf("AppendEvent after DeleteExpired = %d, %v; want sequence 4", e.Sequence, err)
		}
		if n, err := s.DeleteExpired(ctx, retention, 0); err != nil || n != 0 {
			t.Errorf("DeleteExpired(limit 0) = %d, %v; want 0", n, err)
		}
	})

	// A key whose record is past retention is refused for good, with a
	// tombstone saying what became of it, from the moment the tombstone is
	// written: before and after its record is deleted.
	t.Run("ExpiredKey", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			state  store.State
			gaveUp bool
		}{
			{store.StateSucceeded, false},
			{store.StateNotCreated, false},
			{store.StateOutcomeUnknown, true},
		} {
			t.Run(tc.state.String(), func(t *testing.T) {
				t.Parallel()
				s, clk := fresh(t)
				c := claim("k", `{"amount":1}`, "a")
				begin(t, s, c, store.Acquired)
				clk.Set(t0.Add(time.Second))
				last := finish(t, s, store.Finish{Key: "k", Owner: "a", State: tc.state})
				if tc.gaveUp {
					clk.Set(t0.Add(window))
					gave, err := s.GiveUp(ctx, "", 10)
					if err != nil || len(gave) != 1 {
						t.Fatalf("GiveUp = %v, %v; want k", keys(gave), err)
					}
					last = gave[0]
				}
				if _, err := s.Tombstone(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
					t.Errorf("Tombstone(live key) error = %v, want ErrNotFound", err)
				}
				// Kept for exactly Records after its last change.
				clk.Set(last.UpdatedAt.Add(keep))
				if got := deleteAll(t, s, retention, 10); len(got) != 0 {
					t.Errorf("DeleteExpired at the end of retention = %v, want nothing", got)
				}
				get(t, s, "k")
				marked := clk.Set(last.UpdatedAt.Add(keep + time.Microsecond))
				if diff := cmp.Diff([]int{1}, deleteAll(t, s, retention, 10)); diff != "" {
					t.Errorf("DeleteExpired past retention (-want +got):\n%s", diff)
				}
				want := store.Tombstone{KeySHA256: sha256.Sum256([]byte("k")), BodySHA256: c.BodySHA256, State: tc.state, GaveUp: tc.gaveUp,
					CreatedAt: us(t0), UpdatedAt: last.UpdatedAt, ExpiredAt: us(marked), Caller: c.Caller, CallerKnown: true}
				expired := func(when string) {
					t.Helper()
					if _, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
						t.Errorf("%s: Get error = %v, want ErrNotFound", when, err)
					}
					if got, err := s.Tombstone(ctx, "k"); err != nil || !cmp.Equal(want, got) {
						t.Errorf("%s: Tombstone = %+v, %v; want %+v", when, got, err, want)
					}
					for _, body := range []string{`{"amount":1}`, `{"amount":99999}`} {
						got := begin(t, s, claim("k", body, "b"), store.Expired)
						if diff := cmp.Diff(want, got.Tombstone); diff != "" {
							t.Errorf("%s: Begin(%s) Tombstone (-want +got):\n%s", when, body, diff)
						}
					}
					if got := claimDue(t, s, "settler", 0, 10); len(got) != 0 {
						t.Errorf("%s: ClaimDue = %v, want nothing", when, keys(got))
					}
					if got, err := s.GiveUp(ctx, "", 10); err != nil || len(got) != 0 {
						t.Errorf("%s: GiveUp = %v, %v, want nothing", when, keys(got), err)
					}
					if _, err := s.Tombstone(ctx, "other"); !errors.Is(err, store.ErrNotFound) {
						t.Errorf("Tombstone(unknown key) error = %v, want ErrNotFound", err)
					}
				}
				expired("tombstoned")
				// The record outlives its tombstone by the grace period.
				clk.Set(marked.Add(store.TombstoneGrace - time.Microsecond))
				if got := deleteAll(t, s, retention, 10); len(got) != 0 {
					t.Errorf("DeleteExpired within the grace period = %v, want nothing", got)
				}
				if n := rows(t, s, "records"); n != 1 {
					t.Errorf("%d records within the grace period, want 1", n)
				}
				expired("within the grace period")
				clk.Set(marked.Add(store.TombstoneGrace))
				if diff := cmp.Diff([]int{1}, deleteAll(t, s, retention, 10)); diff != "" {
					t.Errorf("DeleteExpired after the grace period (-want +got):\n%s", diff)
				}
				if n := rows(t, s, "records"); n != 0 {
					t.Errorf("%d records after the grace period, want 0", n)
				}
				expired("deleted")
			})
		}
	})

	// A record retention has tombstoned is left alone by everything else
	// until it is deleted, even one whose settlement window is still open
	// (a retention shorter than the window: paymentsd refuses that
	// configuration, the store does not).
	t.Run("TombstonedRecordLeftAlone", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		c := claim("k", "body", "a")
		c.Window = 3 * keep
		makeUnknown(t, s, c, 0)
		marked := clk.Set(t0.Add(keep + time.Second))
		if diff := cmp.Diff([]int{1}, deleteAll(t, s, retention, 10)); diff != "" {
			t.Errorf("DeleteExpired (-want +got):\n%s", diff)
		}
		begin(t, s, claim("k", "body", "b"), store.Expired)
		if got := claimDue(t, s, "settler", 0, 10); len(got) != 0 {
			t.Errorf("ClaimDue = %v, want nothing", keys(got))
		}
		if _, err := s.Finish(ctx, store.Finish{Key: "k", Owner: "a", State: store.StateSucceeded}); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Finish error = %v, want ErrLeaseLost", err)
		}
		clk.Set(marked.Add(store.TombstoneGrace))
		if diff := cmp.Diff([]int{1}, deleteAll(t, s, retention, 10)); diff != "" {
			t.Errorf("DeleteExpired after the grace period (-want +got):\n%s", diff)
		}
		begin(t, s, claim("k", "body", "b"), store.Expired)
	})

	// Retention never tombstones an InProgress record, however old: its
	// holder may be sending. Once settlement gives up on it, it is an
	// unknown record like any other.
	t.Run("InProgressNeverTombstoned", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		begin(t, s, claim("k", "body", "a"), store.Acquired)
		clk.Set(t0.Add(10 * keep))
		if got := deleteAll(t, s, retention, 10); len(got) != 0 {
			t.Errorf("DeleteExpired = %v, want nothing", got)
		}
		if r := get(t, s, "k"); r.State != store.StateInProgress {
			t.Errorf("state = %v, want InProgress", r.State)
		}
		if _, err := s.GiveUp(ctx, "", 10); err != nil {
			t.Fatal(err)
		}
		if got := deleteAll(t, s, retention, 10); len(got) != 0 {
			t.Errorf("DeleteExpired just after GiveUp = %v, want nothing", got)
		}
		clk.Add(keep + time.Microsecond)
		if diff := cmp.Diff([]int{1}, deleteAll(t, s, retention, 10)); diff != "" {
			t.Errorf("DeleteExpired a retention after GiveUp (-want +got):\n%s", diff)
		}
		if ts, err := s.Tombstone(ctx, "k"); err != nil || ts.State != store.StateOutcomeUnknown || !ts.GaveUp {
			t.Errorf("Tombstone = %+v, %v; want OutcomeUnknown, given up", ts, err)
		}
	})

	t.Run("TombstonesExpire", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		begin(t, s, claim("k", "body", "a"), store.Acquired)
		finish(t, s, store.Finish{Key: "k", Owner: "a", State: store.StateSucceeded})
		marked := clk.Set(t0.Add(keep + time.Microsecond))
		deleteAll(t, s, retention, 10)
		clk.Set(marked.Add(keepTombstones))
		if diff := cmp.Diff([]int{1}, deleteAll(t, s, retention, 10)); diff != "" { // the record
			t.Errorf("DeleteExpired at the end of tombstone retention (-want +got):\n%s", diff)
		}
		begin(t, s, claim("k", "body", "b"), store.Expired)
		now := clk.Set(marked.Add(keepTombstones + time.Microsecond))
		if diff := cmp.Diff([]int{1}, deleteAll(t, s, retention, 10)); diff != "" {
			t.Errorf("DeleteExpired past tombstone retention (-want +got):\n%s", diff)
		}
		if _, err := s.Tombstone(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Tombstone after it expired: error = %v, want ErrNotFound", err)
		}
		// The key is forgotten: it starts afresh, with any body.
		got := begin(t, s, claim("k", "another body", "b"), store.Acquired)
		if got.Prior != 0 || !got.Record.CreatedAt.Equal(us(now)) || got.Record.Attempts != 0 {
			t.Errorf("Begin after the tombstone expired: Prior %v CreatedAt %v Attempts %d, want a new record", got.Prior, got.Record.CreatedAt, got.Record.Attempts)
		}
	})

	t.Run("EventsExpire", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		for i, at := range []time.Time{t0, t0.Add(time.Hour)} {
			body := fmt.Sprint(i)
			if _, err := s.AppendEvent(ctx, store.Event{ReceivedAt: at, Body: []byte(body), BodySHA256: sha256.Sum256([]byte(body))}); err != nil {
				t.Fatal(err)
			}
		}
		clk.Set(t0.Add(keep))
		if got := deleteAll(t, s, retention, 10); len(got) != 0 {
			t.Errorf("DeleteExpired at the end of retention = %v, want nothing", got)
		}
		clk.Set(t0.Add(keep + time.Microsecond))
		if diff := cmp.Diff([]int{1}, deleteAll(t, s, retention, 10)); diff != "" {
			t.Errorf("DeleteExpired past retention (-want +got):\n%s", diff)
		}
		if got, err := s.ListEvents(ctx, store.EventQuery{After: 0, Limit: 10}); err != nil || len(got) != 1 || got[0].Sequence != 2 {
			t.Errorf("ListEvents = %+v, %v; want sequence 2 only", got, err)
		}
	})

	t.Run("ZeroRetentionKeeps", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		begin(t, s, claim("old", "body", "a"), store.Acquired)
		finish(t, s, store.Finish{Key: "old", Owner: "a", State: store.StateSucceeded})
		if _, err := s.AppendEvent(ctx, store.Event{ReceivedAt: t0, BodySHA256: sha256.Sum256(nil)}); err != nil {
			t.Fatal(err)
		}
		clk.Set(t0.Add(100 * keepTombstones))
		for _, r := range []store.Retention{{}, {Tombstones: keepTombstones}} {
			if got := deleteAll(t, s, r, 10); len(got) != 0 {
				t.Errorf("DeleteExpired(%+v) = %v, want nothing", r, got)
			}
		}
		get(t, s, "old")
		if n := rows(t, s, "events"); n != 1 {
			t.Errorf("%d events, want 1 kept", n)
		}
		// Records: yes; tombstones: forever.
		r := store.Retention{Records: keep}
		deleteAll(t, s, r, 10)
		clk.Add(store.TombstoneGrace + 100*keepTombstones)
		deleteAll(t, s, r, 10)
		if n := rows(t, s, "records"); n != 0 {
			t.Errorf("%d records, want 0", n)
		}
		if _, err := s.Tombstone(ctx, "old"); err != nil {
			t.Errorf("Tombstone(old) error = %v, want it kept", err)
		}
		begin(t, s, claim("old", "body", "b"), store.Expired)
	})

	// A tombstone retention shorter than the grace period must not leave a
	// tombstoned record without its tombstone: until the record is
	// deleted, its key is still expired.
	t.Run("ShortTombstoneRetention", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		r := store.Retention{Records: keep, Tombstones: time.Minute}
		begin(t, s, claim("k", "body", "a"), store.Acquired)
		finish(t, s, store.Finish{Key: "k", Owner: "a", State: store.StateSucceeded})
		marked := clk.Set(t0.Add(keep + time.Microsecond))
		deleteAll(t, s, r, 10)
		clk.Set(marked.Add(r.Tombstones + time.Second))
		deleteAll(t, s, r, 10)
		if got, err := s.Begin(ctx, claim("k", "body", "b")); err != nil || got.Outcome != store.Expired {
			t.Errorf("Begin(key tombstoned %v ago, tombstones kept %v) = %v, %v; want Expired", r.Tombstones+time.Second, r.Tombstones, got.Outcome, err)
		}
		clk.Set(marked.Add(store.TombstoneGrace + r.Tombstones + time.Second))
		deleteAll(t, s, r, 10)
		begin(t, s, claim("k", "body", "b"), store.Acquired)
	})

	// Retention on one replica races Begins on another: each Begin either
	// acquires the record (which retention then leaves alone) or finds it
	// expired (and its tombstone written), never both.
	t.Run("RetentionRacesBegin", func(t *testing.T) {
		t.Parallel()
		url := b.url(t)
		clk := newClock(t0)
		s := openStore(t, url, "sandbox", clk)
		s2 := s
		if b.persistent {
			s2 = openStore(t, url, "sandbox", clk)
		}
		const n = 60
		for i := range n {
			c := claim(fmt.Sprintf("k%02d", i), "body", "a")
			c.Window = 3 * keep // still open when the record expires
			makeUnknown(t, s, c, 0)
		}
		clk.Set(t0.Add(keep + time.Second))
		outcomes := make([]store.Outcome, n)
		var wg sync.WaitGroup
		errs := make(chan error, n+1)
		for i := range n {
			wg.Go(func() {
				b, err := s.Begin(ctx, claim(fmt.Sprintf("k%02d", i), "body", "b"))
				if err != nil {
					errs <- err
				}
				outcomes[i] = b.Outcome
			})
		}
		wg.Go(func() {
			for {
				n, err := s2.DeleteExpired(ctx, retention, 3)
				if err != nil {
					errs <- err
				}
				if n == 0 || err != nil {
					return
				}
			}
		})
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		clk.Add(store.TombstoneGrace)
		deleteAll(t, s2, retention, 10)
		count := map[store.Outcome]int{}
		for i, o := range outcomes {
			count[o]++
			k := fmt.Sprintf("k%02d", i)
			_, gerr := s.Get(ctx, k)
			_, terr := s.Tombstone(ctx, k)
			switch o {
			case store.Acquired:
				if gerr != nil || !errors.Is(terr, store.ErrNotFound) {
					t.Errorf("%s acquired: Get error %v, Tombstone error %v; want the record and no tombstone", k, gerr, terr)
				}
				finish(t, s, store.Finish{Key: k, Owner: "b", State: store.StateSucceeded})
			case store.Expired:
				if !errors.Is(gerr, store.ErrNotFound) || terr != nil {
					t.Errorf("%s expired: Get error %v, Tombstone error %v; want no record and a tombstone", k, gerr, terr)
				}
			default:
				t.Errorf("Begin(%s) = %v, want Acquired or Expired", k, o)
			}
		}
		t.Logf("outcomes: %v", count)
	})
}
