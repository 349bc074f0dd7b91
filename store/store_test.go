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

// t0 is the suite's clock; its nanoseconds check the microsecond truncation
// and its zone that times come back UTC.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.FixedZone("X", 3600))

const (
	lease  = 30 * time.Second
	window = 24 * time.Hour
)

func openStore(t *testing.T, url, env string) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), url, env, store.Options{})
	if err != nil {
		t.Fatalf("Open(%s) error = %v", env, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func claim(key, body, owner string, now time.Time) store.Claim {
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
		Now:        now,
		LeaseUntil: now.Add(lease),
		SettleBy:   now.Add(window),
	}
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

func us(t time.Time) time.Time { return t.Truncate(time.Microsecond).UTC() }

// makeUnknown leaves key OutcomeUnknown with the given NextSettleAt.
func makeUnknown(t *testing.T, s *store.Store, c store.Claim, next time.Time) store.Record {
	t.Helper()
	begin(t, s, c, store.Acquired)
	return finish(t, s, store.Finish{Key: c.Key, Owner: c.Owner, State: store.StateOutcomeUnknown, AddAttempts: 1,
		ProviderStatus: 503, Reply: []byte(`{"error":"unavailable"}`), LastError: "503", Code: 14, Now: c.Now, NextSettleAt: next})
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
	fresh := func(t *testing.T) *store.Store {
		t.Helper()
		return openStore(t, b.url(t), "sandbox")
	}

	t.Run("Backend", func(t *testing.T) {
		t.Parallel()
		s := fresh(t)
		if got := s.Backend(); got != b.name {
			t.Errorf("Backend() = %q, want %q", got, b.name)
		}
		if err := s.Ping(ctx); err != nil {
			t.Errorf("Ping() error = %v", err)
		}
	})

	t.Run("NewKeyAcquired", func(t *testing.T) {
		t.Parallel()
		s := fresh(t)
		c := claim("k1", `{"amount":1}`, "a", t0)
		got := begin(t, s, c, store.Acquired)
		want := store.Record{
			Key: c.Key, Body: c.Body, BodySHA256: c.BodySHA256, Currency: "EUR", Amount: 1234,
			State: store.StateInProgress, RequestID: "req-a", TraceID: "trace-a", Caller: "caller-a",
			CreatedAt: us(t0), UpdatedAt: us(t0), SettleBy: us(t0.Add(window)),
			LeaseOwner: "a", LeaseExpiresAt: us(t0.Add(lease)),
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
		s := fresh(t)
		c := claim("k", "body", "a", t0)
		first := begin(t, s, c, store.Acquired)

		// Same body while the lease holds: Busy, nothing changed.
		busy := begin(t, s, claim("k", "body", "b", t0.Add(lease-time.Microsecond)), store.Busy)
		if diff := cmp.Diff(first.Record, busy.Record); diff != "" {
			t.Errorf("Busy record changed (-before +after):\n%s", diff)
		}
		// Not the owner: lease lost, nothing written.
		if _, err := s.Finish(ctx, store.Finish{Key: "k", Owner: "b", State: store.StateSucceeded, Now: t0}); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Finish(wrong owner) error = %v, want ErrLeaseLost", err)
		}
		if _, err := s.Finish(ctx, store.Finish{Key: "nope", Owner: "a", State: store.StateSucceeded, Now: t0}); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Finish(no record) error = %v, want ErrLeaseLost", err)
		}
		if _, err := s.Finish(ctx, store.Finish{Key: "k", Owner: "a", State: store.StateInProgress, Now: t0}); err == nil {
			t.Errorf("Finish(InProgress) error = nil, want a refusal")
		}

		// Expired lease: taken over, Prior InProgress, window kept.
		later := t0.Add(lease)
		took := begin(t, s, claim("k", "body", "b", later), store.Acquired)
		if took.Prior != store.StateInProgress {
			t.Errorf("takeover Prior = %v, want InProgress", took.Prior)
		}
		if took.Record.LeaseOwner != "b" || !took.Record.LeaseExpiresAt.Equal(us(later.Add(lease))) {
			t.Errorf("takeover lease = %s until %v, want b until %v", took.Record.LeaseOwner, took.Record.LeaseExpiresAt, us(later.Add(lease)))
		}
		if !took.Record.SettleBy.Equal(first.Record.SettleBy) {
			t.Errorf("takeover SettleBy = %v, want kept %v", took.Record.SettleBy, first.Record.SettleBy)
		}
		if took.Record.RequestID != "req-a" {
			t.Errorf("takeover RequestID = %q, want the creator's req-a", took.Record.RequestID)
		}
		// The first owner's late Finish is refused.
		if _, err := s.Finish(ctx, store.Finish{Key: "k", Owner: "a", State: store.StateNotCreated, Now: later}); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Finish(old owner) error = %v, want ErrLeaseLost", err)
		}
		if r := get(t, s, "k"); r.State != store.StateInProgress || r.LeaseOwner != "b" {
			t.Errorf("after refused Finish: state %v owner %q, want InProgress b", r.State, r.LeaseOwner)
		}
	})

	t.Run("SucceededReplays", func(t *testing.T) {
		t.Parallel()
		s := fresh(t)
		c := claim("k", "body", "a", t0)
		begin(t, s, c, store.Acquired)
		now := t0.Add(time.Second)
		r := finish(t, s, store.Finish{Key: "k", Owner: "a", State: store.StateSucceeded, AddAttempts: 2,
			ProviderStatus: 201, Reply: []byte(`{"id":"p1"}`), Code: 0, Now: now})
		want := store.Record{
			Key: "k", Body: c.Body, BodySHA256: c.BodySHA256, Currency: "EUR", Amount: 1234,
			State: store.StateSucceeded, Attempts: 2, ProviderStatus: 201, Reply: []byte(`{"id":"p1"}`),
			RequestID: "req-a", TraceID: "trace-a", Caller: "caller-a",
			CreatedAt: us(t0), UpdatedAt: us(now), SettleBy: us(t0.Add(window)),
		}
		if diff := cmp.Diff(want, r); diff != "" {
			t.Errorf("Finish(Succeeded) record mismatch (-want +got):\n%s", diff)
		}
		// Even long after the window, a success replays.
		for _, at := range []time.Time{now, t0.Add(2 * window)} {
			rb := begin(t, s, claim("k", "body", "b", at), store.Replay)
			if diff := cmp.Diff(want, rb.Record); diff != "" {
				t.Errorf("Replay record mismatch (-want +got):\n%s", diff)
			}
		}
	})

	t.Run("ReusedInEveryState", func(t *testing.T) {
		t.Parallel()
		s := fresh(t)
		setups := map[string]func(key string){
			"InProgress": func(key string) { begin(t, s, claim(key, "body", "a", t0), store.Acquired) },
			"Succeeded": func(key string) {
				begin(t, s, claim(key, "body", "a", t0), store.Acquired)
				finish(t, s, store.Finish{Key: key, Owner: "a", State: store.StateSucceeded, Now: t0})
			},
			"NotCreated": func(key string) {
				begin(t, s, claim(key, "body", "a", t0), store.Acquired)
				finish(t, s, store.Finish{Key: key, Owner: "a", State: store.StateNotCreated, Now: t0})
			},
			"OutcomeUnknown": func(key string) { makeUnknown(t, s, claim(key, "body", "a", t0), t0) },
		}
		for name, setup := range setups {
			setup(name)
			before := get(t, s, name)
			for _, at := range []time.Time{t0, t0.Add(lease), t0.Add(2 * window)} {
				got := begin(t, s, claim(name, "other body", "b", at), store.Reused)
				if diff := cmp.Diff(before, got.Record); diff != "" {
					t.Errorf("%s: Reused record (-stored +got):\n%s", name, diff)
				}
			}
			if diff := cmp.Diff(before, get(t, s, name)); diff != "" {
				t.Errorf("%s: Reused changed the record (-before +after):\n%s", name, diff)
			}
		}
	})

	t.Run("NotCreatedStartsNewWindow", func(t *testing.T) {
		t.Parallel()
		s := fresh(t)
		begin(t, s, claim("k", "body", "a", t0), store.Acquired)
		finish(t, s, store.Finish{Key: "k", Owner: "a", State: store.StateNotCreated, AddAttempts: 1, ProviderStatus: 400, Now: t0})
		// Even after the first window closed.
		later := t0.Add(2 * window)
		c := claim("k", "body", "b", later)
		got := begin(t, s, c, store.Acquired)
		if got.Prior != store.StateNotCreated {
			t.Errorf("Prior = %v, want NotCreated", got.Prior)
		}
		if !got.Record.SettleBy.Equal(us(c.SettleBy)) || got.Record.State != store.StateInProgress || got.Record.LeaseOwner != "b" {
			t.Errorf("record = state %v owner %q SettleBy %v, want InProgress b %v", got.Record.State, got.Record.LeaseOwner, got.Record.SettleBy, us(c.SettleBy))
		}
		if got.Record.Attempts != 1 {
			t.Errorf("Attempts = %d, want 1 kept", got.Record.Attempts)
		}
	})

	t.Run("OutcomeUnknownWindow", func(t *testing.T) {
		t.Parallel()
		s := fresh(t)
		u := makeUnknown(t, s, claim("k", "body", "a", t0), t0.Add(time.Minute))
		// Before SettleBy: acquired, window kept.
		got := begin(t, s, claim("k", "body", "b", t0.Add(window-time.Microsecond)), store.Acquired)
		if got.Prior != store.StateOutcomeUnknown || !got.Record.SettleBy.Equal(u.SettleBy) {
			t.Errorf("Prior %v SettleBy %v, want OutcomeUnknown %v", got.Prior, got.Record.SettleBy, u.SettleBy)
		}
		finish(t, s, store.Finish{Key: "k", Owner: "b", State: store.StateOutcomeUnknown, Now: t0, NextSettleAt: t0.Add(time.Minute)})
		// At or after SettleBy: past the window, left alone.
		before := get(t, s, "k")
		pw := begin(t, s, claim("k", "body", "c", t0.Add(window)), store.PastWindow)
		if diff := cmp.Diff(before, pw.Record); diff != "" {
			t.Errorf("PastWindow record (-before +after):\n%s", diff)
		}
		if diff := cmp.Diff(before, get(t, s, "k")); diff != "" {
			t.Errorf("PastWindow changed the record (-before +after):\n%s", diff)
		}

		// An expired InProgress record past the window becomes OutcomeUnknown.
		begin(t, s, claim("ip", "body", "a", t0), store.Acquired)
		pw = begin(t, s, claim("ip", "body", "b", t0.Add(window)), store.PastWindow)
		if pw.Record.State != store.StateOutcomeUnknown || pw.Record.LeaseOwner != "" {
			t.Errorf("expired InProgress past window: state %v owner %q, want OutcomeUnknown and no lease", pw.Record.State, pw.Record.LeaseOwner)
		}
		if r := get(t, s, "ip"); r.State != store.StateOutcomeUnknown {
			t.Errorf("stored state %v, want OutcomeUnknown", r.State)
		}
		// Its old owner can't finish it any more.
		if _, err := s.Finish(ctx, store.Finish{Key: "ip", Owner: "a", State: store.StateNotCreated, Now: t0.Add(window)}); !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("Finish after PastWindow error = %v, want ErrLeaseLost", err)
		}
	})

	t.Run("ClaimDue", func(t *testing.T) {
		t.Parallel()
		s := fresh(t)
		now := t0.Add(time.Hour)
		makeUnknown(t, s, claim("due", "body", "a", t0), now)                                     // due exactly now
		makeUnknown(t, s, claim("not-yet", "body", "a", t0), now.Add(time.Second))                // not due
		makeUnknown(t, s, claim("closed", "body", "a", now.Add(-window)), now)                    // window closed at now
		begin(t, s, claim("expired", "body", "a", now.Add(-lease)), store.Acquired)               // lease ended at now
		begin(t, s, claim("leased", "body", "a", now), store.Acquired)                            // lease holds
		begin(t, s, claim("done", "body", "a", t0), store.Acquired)                               //
		finish(t, s, store.Finish{Key: "done", Owner: "a", State: store.StateSucceeded, Now: t0}) // nothing to settle

		got, err := s.ClaimDue(ctx, "settler", now, now.Add(lease), 10)
		if err != nil {
			t.Fatalf("ClaimDue() error = %v", err)
		}
		if diff := cmp.Diff(map[string]int{"due": 1, "expired": 1}, keys(got)); diff != "" {
			t.Errorf("ClaimDue() keys (-want +got):\n%s", diff)
		}
		for _, r := range got {
			if r.State != store.StateInProgress || r.LeaseOwner != "settler" || !r.LeaseExpiresAt.Equal(us(now.Add(lease))) {
				t.Errorf("claimed %q: state %v lease %q until %v, want InProgress settler until %v", r.Key, r.State, r.LeaseOwner, r.LeaseExpiresAt, us(now.Add(lease)))
			}
		}
		if again, err := s.ClaimDue(ctx, "other", now, now.Add(lease), 10); err != nil || len(again) != 0 {
			t.Errorf("second ClaimDue() = %v, %v; want nothing (leased)", keys(again), err)
		}
		// The settler finishes: SettleAttempts counts it.
		r := finish(t, s, store.Finish{Key: "due", Owner: "settler", State: store.StateOutcomeUnknown, AddAttempts: 1, Now: now, NextSettleAt: now.Add(time.Minute), Settlement: true})
		if r.SettleAttempts != 1 || r.Attempts != 2 || !r.NextSettleAt.Equal(us(now.Add(time.Minute))) {
			t.Errorf("after settlement: SettleAttempts %d Attempts %d NextSettleAt %v, want 1, 2, %v", r.SettleAttempts, r.Attempts, r.NextSettleAt, us(now.Add(time.Minute)))
		}
		// limit is honoured.
		for i := range 5 {
			makeUnknown(t, s, claim(fmt.Sprintf("many%d", i), "body", "a", t0), t0)
		}
		if got, err := s.ClaimDue(ctx, "settler", now, now.Add(lease), 3); err != nil || len(got) != 3 {
			t.Errorf("ClaimDue(limit 3) = %d records, %v; want 3", len(got), err)
		}
	})

	t.Run("ClaimDueConcurrentClaimers", func(t *testing.T) {
		t.Parallel()
		url := b.url(t)
		s := openStore(t, url, "sandbox")
		// A second Store on the same database stands in for another replica.
		s2 := s
		if b.persistent {
			s2 = openStore(t, url, "sandbox")
		}
		const n = 40
		for i := range n {
			makeUnknown(t, s, claim(fmt.Sprintf("k%02d", i), "body", "a", t0), t0)
		}
		now := t0.Add(time.Minute)
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
					got, err := st.ClaimDue(ctx, owner, now, now.Add(lease), 3)
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
		s := fresh(t)
		end := t0.Add(window)
		makeUnknown(t, s, claim("unknown", "body", "a", t0), t0)                   // window closed at end
		begin(t, s, claim("expired", "body", "a", t0), store.Acquired)             // lease long gone
		begin(t, s, claim("leased", "body", "a", t0), store.Acquired)              //
		begin(t, s, claim("open", "body", "a", t0.Add(time.Hour)), store.Acquired) // window still open at end
		finish(t, s, store.Finish{Key: "open", Owner: "a", State: store.StateOutcomeUnknown, Now: t0, NextSettleAt: t0})
		begin(t, s, claim("notcreated", "body", "a", t0), store.Acquired)
		finish(t, s, store.Finish{Key: "notcreated", Owner: "a", State: store.StateNotCreated, Now: t0})
		// "leased" renews its lease past the window's end.
		if _, err := s.Begin(ctx, claim("leased", "body", "a", end.Add(-time.Second))); err != nil {
			t.Fatal(err)
		}

		got, err := s.GiveUp(ctx, end, 10)
		if err != nil {
			t.Fatalf("GiveUp() error = %v", err)
		}
		if diff := cmp.Diff(map[string]int{"unknown": 1, "expired": 1}, keys(got)); diff != "" {
			t.Errorf("GiveUp() keys (-want +got):\n%s", diff)
		}
		for _, r := range got {
			if r.State != store.StateOutcomeUnknown || !r.GaveUp || r.LeaseOwner != "" {
				t.Errorf("gave up %q: state %v GaveUp %v owner %q, want OutcomeUnknown, true, none", r.Key, r.State, r.GaveUp, r.LeaseOwner)
			}
		}
		if again, err := s.GiveUp(ctx, end, 10); err != nil || len(again) != 0 {
			t.Errorf("second GiveUp() = %v, %v; want nothing (each once ever)", keys(again), err)
		}
		// Given up is past the window: only "open" may still be settled.
		if got, err := s.ClaimDue(ctx, "settler", end, end.Add(lease), 10); err != nil || !cmp.Equal(keys(got), map[string]int{"open": 1}) {
			t.Errorf("ClaimDue after GiveUp = %v, %v; want open only", keys(got), err)
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
		s := fresh(t)
		const n = 16
		outcomes := make(chan store.Outcome, n)
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				b, err := s.Begin(ctx, claim("one", "body", fmt.Sprintf("o%d", i), t0))
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
		s := fresh(t)
		const n = 24
		for i := range n {
			begin(t, s, claim(fmt.Sprintf("pre%d", i), "body", "a", t0), store.Acquired)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 3*n)
		for i := range n {
			wg.Go(func() {
				key := fmt.Sprintf("new%d", i)
				b, err := s.Begin(ctx, claim(key, "body", "b", t0))
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
					ProviderStatus: 200, Reply: []byte(fmt.Sprintf(`{"n":%d}`, i)), Now: t0})
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

	// FinishLater's outcome is durable by the time done is called, and Close
	// waits for it.
	t.Run("FinishLater", func(t *testing.T) {
		t.Parallel()
		url := b.url(t)
		s, err := store.Open(ctx, url, "sandbox", store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		const n = 8
		for i := range n {
			begin(t, s, claim(fmt.Sprintf("k%d", i), "body", "a", t0), store.Acquired)
		}
		var mu sync.Mutex
		results := map[string]error{}
		for i := range n {
			key := fmt.Sprintf("k%d", i)
			s.FinishLater(store.Finish{Key: key, Owner: "a", State: store.StateSucceeded, AddAttempts: 1, ProviderStatus: 200,
				Reply: []byte(`{}`), Now: t0}, func(r store.Record, err error) {
				if err == nil && r.State != store.StateSucceeded {
					err = fmt.Errorf("record state %v", r.State)
				}
				if err == nil {
					r2, gerr := s.Get(ctx, key)
					if gerr != nil || r2.State != store.StateSucceeded {
						err = fmt.Errorf("Get after done = %v, %v; want Succeeded", r2.State, gerr)
					}
				}
				mu.Lock()
				results[key] = err
				mu.Unlock()
			})
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close() error = %v", err)
		}
		if len(results) != n {
			t.Fatalf("Close returned with %d of %d FinishLater done", len(results), n)
		}
		for k, err := range results {
			if err != nil {
				t.Errorf("FinishLater(%q): %v", k, err)
			}
		}
		if !b.persistent {
			return
		}
		s = openStore(t, url, "sandbox")
		for i := range n {
			if r := get(t, s, fmt.Sprintf("k%d", i)); r.State != store.StateSucceeded {
				t.Errorf("after reopening, record k%d = %v, want Succeeded", i, r.State)
			}
		}
	})

	t.Run("ExactKeys", func(t *testing.T) {
		t.Parallel()
		s := fresh(t)
		// An incompressible 10 KB key, too: PostgreSQL can't index one in a
		// btree directly.
		random := make([]byte, 7<<10)
		rand.Read(random)
		ks := []string{base64.StdEncoding.EncodeToString(random), "abc", "ABC", "abc ", " abc", "abc  ", "é", "e\u0301", "日本語", "ß", "ss", "İ", "i", "😀",
			strings.Repeat("k", 10<<10), strings.Repeat("k", 10<<10) + " ", `quote'"\`}
		for i, k := range ks {
			begin(t, s, claim(k, fmt.Sprintf("body%d", i), "a", t0), store.Acquired)
		}
		for i, k := range ks {
			r := get(t, s, k)
			if r.Key != k || string(r.Body) != fmt.Sprintf("body%d", i) {
				t.Errorf("Get(key %d) = key %.20q body %q, want %.20q body%d", i, r.Key, r.Body, k, i)
			}
			// The same key again finds its own record.
			begin(t, s, claim(k, fmt.Sprintf("body%d", i), "b", t0), store.Busy)
		}
		// A NUL byte: stored exactly, or refused with ErrKeyNotStorable
		// (always in PostgreSQL, whose text can't hold it).
		for _, k := range []string{"a\x00b", "a\x00c"} {
			bg, err := s.Begin(ctx, claim(k, "nul "+k, "a", t0))
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
			}
		}
	})

	t.Run("EnvironmentStamp", func(t *testing.T) {
		t.Parallel()
		if !b.persistent {
			t.Skip("each Open of this backend is a new database")
		}
		url := b.url(t)
		s := openStore(t, url, "sandbox")
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
		s = openStore(t, url, "sandbox") // the right one still opens
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
		s := openStore(t, url, "sandbox")
		begin(t, s, claim("k", "body", "a", t0), store.Acquired)
		want := finish(t, s, store.Finish{Key: "k", Owner: "a", State: store.StateSucceeded, ProviderStatus: 200, Reply: []byte("{}"), Now: t0})
		e, err := s.AppendEvent(ctx, store.Event{ReceivedAt: t0, Body: []byte("x"), BodySHA256: sha256.Sum256([]byte("x"))})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close() error = %v", err)
		}
		s = openStore(t, url, "sandbox")
		if diff := cmp.Diff(want, get(t, s, "k")); diff != "" {
			t.Errorf("record after reopen (-before +after):\n%s", diff)
		}
		if got, err := s.ListEvents(ctx, store.EventQuery{After: 0, Limit: 10}); err != nil || len(got) != 1 || !cmp.Equal(e, got[0]) {
			t.Errorf("ListEvents after reopen = %+v, %v; want [%+v]", got, err, e)
		}
	})

	t.Run("DuplicatesWithinRetention", func(t *testing.T) {
		t.Parallel()
		s, err := store.Open(ctx, b.url(t), "sandbox", store.Options{Retention: time.Hour})
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
		s := fresh(t)
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
		s := fresh(t)
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
		done := make(chan struct{})
		wg.Go(func() {
			defer close(done)
			var last int64
			for last < total {
				select {
				case <-ctx.Done():
					return
				default:
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

	t.Run("DeleteBefore", func(t *testing.T) {
		t.Parallel()
		s := fresh(t)
		old, cut := t0, t0.Add(window)
		for i := range 5 {
			k := fmt.Sprintf("old%d", i)
			begin(t, s, claim(k, "body", "a", old), store.Acquired)
			finish(t, s, store.Finish{Key: k, Owner: "a", State: store.StateSucceeded, Now: old})
		}
		begin(t, s, claim("old-inprogress", "body", "a", old), store.Acquired)
		begin(t, s, claim("new", "body", "a", cut), store.Acquired)
		finish(t, s, store.Finish{Key: "new", Owner: "a", State: store.StateNotCreated, Now: cut})
		for i := range 3 {
			body := fmt.Sprint(i)
			at := old
			if i == 2 {
				at = cut
			}
			if _, err := s.AppendEvent(ctx, store.Event{ReceivedAt: at, Body: []byte(body), BodySHA256: sha256.Sum256([]byte(body))}); err != nil {
				t.Fatal(err)
			}
		}
		var batches []int
		for {
			n, err := s.DeleteBefore(ctx, cut, 2)
			if err != nil {
				t.Fatalf("DeleteBefore() error = %v", err)
			}
			if n == 0 {
				break
			}
			batches = append(batches, n)
		}
		// 5 records and 2 events, at most 2 of each per call.
		if diff := cmp.Diff([]int{4, 2, 1}, batches); diff != "" {
			t.Errorf("DeleteBefore batches (-want +got):\n%s", diff)
		}
		for _, k := range []string{"old-inprogress", "new"} {
			get(t, s, k)
		}
		if _, err := s.Get(ctx, "old0"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Get(old0) after DeleteBefore error = %v, want ErrNotFound", err)
		}
		if got, err := s.ListEvents(ctx, store.EventQuery{After: 0, Limit: 10}); err != nil || len(got) != 1 || got[0].Sequence != 3 {
			t.Errorf("ListEvents after DeleteBefore = %+v, %v; want sequence 3 only", got, err)
		}
		// Sequences keep counting after deletions.
		if e, err := s.AppendEvent(ctx, store.Event{ReceivedAt: cut, BodySHA256: sha256.Sum256(nil)}); err != nil || e.Sequence != 4 {
			t.Errorf("AppendEvent after DeleteBefore = %d, %v; want sequence 4", e.Sequence, err)
		}
		// A deleted key starts afresh.
		begin(t, s, claim("old0", "other body", "b", cut), store.Acquired)
	})

	t.Run("Stats", func(t *testing.T) {
		t.Parallel()
		s := fresh(t)
		begin(t, s, claim("ip", "body", "a", t0), store.Acquired)
		for i, st := range []store.State{store.StateSucceeded, store.StateNotCreated, store.StateOutcomeUnknown, store.StateOutcomeUnknown} {
			k := fmt.Sprintf("%v-%d", st, i)
			begin(t, s, claim(k, "body", "a", t0), store.Acquired)
			finish(t, s, store.Finish{Key: k, Owner: "a", State: st, Now: t0, NextSettleAt: t0})
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

	testInbox(t, b)
}
