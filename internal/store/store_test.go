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

	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/store/storetest"
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
func claim(key, body, owner string) record.Claim {
	return record.Claim{
		Request: record.Request{
			Key:        key,
			Body:       []byte(body),
			BodySHA256: sha256.Sum256([]byte(body)),
			Currency:   "EUR",
			Amount:     1234,
			RequestID:  "req-" + owner,
			TraceID:    "trace-" + owner,
			Caller:     "caller-" + owner,
		},
		Owner:    owner,
		LeaseTTL: lease,
		Window:   window,
	}
}

// quiet is claim with a quiet period q.
func quiet(c record.Claim, q time.Duration) record.Claim {
	c.Quiet = q
	return c
}

func begin(t *testing.T, s *store.Store, c record.Claim, want record.Verdict) *store.Began {
	t.Helper()
	b, err := s.Begin(context.Background(), c, nil)
	if err != nil {
		t.Fatalf("Begin(%q, owner %s) error = %v", c.Key, c.Owner, err)
	}
	if b.Verdict != want {
		t.Fatalf("Begin(%q, owner %s) verdict = %v, want %v (record %+v)", c.Key, c.Owner, b.Verdict, want, b.Record)
	}
	return b
}

// finish writes o as the outcome of the attempt that holds key's record
// now (o.Owner is its holder, if unset), wants it Written, and returns the
// record after it, as Get reads it.
func finish(t *testing.T, s *store.Store, key string, o record.Outcome) record.Record {
	t.Helper()
	held := get(t, s, key)
	if o.Owner == "" {
		o.Owner = held.LeaseOwner
	}
	finishAs(t, s, held, o, record.Written)
	return get(t, s, key)
}

// finishAs writes o as the outcome of the attempt that claimed claimed,
// and wants the verdict want.
func finishAs(t *testing.T, s *store.Store, claimed record.Record, o record.Outcome, want record.Verdict) {
	t.Helper()
	v, err := s.Finish(context.Background(), &claimed, o)
	if err != nil || v != want {
		t.Fatalf("Finish(%q, owner %s, %v) = %v, %v; want %v", claimed.Key, o.Owner, o.Result, v, err, want)
	}
}

// Outcomes.
func paid(status int, reply string) record.Outcome {
	return record.Outcome{Result: record.Paid, HTTPRequests: 1, ProviderStatus: status, Reply: []byte(reply)}
}

func refused(status int) record.Outcome {
	return record.Outcome{Result: record.Refused, HTTPRequests: 1, ProviderStatus: status, Reply: []byte(`{"error":"refused"}`),
		Error: "refused", Code: 3}
}

func unknown(settleAfter time.Duration) record.Outcome {
	return record.Outcome{Result: record.Unknown, SettleAfter: settleAfter}
}

func get(t *testing.T, s *store.Store, key string) record.Record {
	t.Helper()
	r, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%q) error = %v", key, err)
	}
	return r
}

// settleDue runs a pass of settlement for owner, with the suite's lease and
// a quiet period q, acquiring at most acquire records.
func settleDue(t *testing.T, s *store.Store, owner string, q time.Duration, acquire int) (acquired, gaveUp []record.Record) {
	t.Helper()
	acquired, gaveUp, err := s.SettleDue(context.Background(), record.Settle{Owner: owner, LeaseTTL: lease, Quiet: q}, nil, acquire)
	if err != nil {
		t.Fatalf("SettleDue(%s) error = %v", owner, err)
	}
	return acquired, gaveUp
}

// claimDue is the records a pass of settlement acquires.
func claimDue(t *testing.T, s *store.Store, owner string, q time.Duration, acquire int) []record.Record {
	t.Helper()
	acquired, _ := settleDue(t, s, owner, q, acquire)
	return acquired
}

// giveUp is the records a pass of settlement that acquires nothing gives
// up on, for owner.
func giveUp(t *testing.T, s *store.Store, owner string) []record.Record {
	t.Helper()
	_, gaveUp := settleDue(t, s, owner, 0, 0)
	return gaveUp
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
func readAt(r record.Record, now time.Time) record.Record {
	r.ReadAt = us(now)
	return r
}

// makeUnknown leaves c.Key OutcomeUnknown, as an unanswered attempt by
// c.Owner at the clock's time, due for settlement settleAfter later and
// with no quiet period.
func makeUnknown(t *testing.T, s *store.Store, c record.Claim, settleAfter time.Duration) record.Record {
	t.Helper()
	begin(t, s, c, record.Acquired)
	return finish(t, s, c.Key, record.Outcome{Result: record.Unknown, HTTPRequests: 1, ProviderStatus: 503,
		Reply: []byte(`{"error":"unavailable"}`), Error: "503", Code: 14, SettleAfter: settleAfter})
}

func keys(rs []record.Record) map[string]int {
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
		got := begin(t, s, c, record.Acquired)
		want := record.Record{
			Key: c.Key, Body: c.Body, BodySHA256: c.BodySHA256, Currency: "EUR", Amount: 1234,
			State: record.InProgress, RequestID: "req-a", TraceID: "trace-a", Caller: "caller-a",
			CreatedAt: us(t0), UpdatedAt: us(t0), SettleBy: us(t0.Add(window)),
			LeaseOwner: "a", LeaseExpiresAt: us(t0.Add(lease)),
			QuietUntil: us(t0.Add(lease + 7*time.Second)), AttemptStartedAt: us(t0), ReadAt: us(t0),
			AttemptSeq: 1, AttemptKind: record.ByCall, AttemptRequestID: "req-a",
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
		first := begin(t, s, claim("k", "body", "a"), record.Acquired)

		// Same body while the lease holds: Busy, nothing changed.
		at := clk.Set(t0.Add(lease - time.Microsecond))
		busy := begin(t, s, claim("k", "body", "b"), record.Busy)
		if diff := cmp.Diff(readAt(first.Record, at), busy.Record); diff != "" {
			t.Errorf("Busy record changed (-before +after):\n%s", diff)
		}
		// Not the owner: lease lost, nothing written.
		finishAs(t, s, first.Record, record.Outcome{Owner: "b", Result: record.Paid}, record.LeaseLost)
		finishAs(t, s, record.Record{Key: "nope"}, record.Outcome{Owner: "a", Result: record.Paid}, record.LeaseLost)
		if _, err := s.Finish(ctx, &first.Record, record.Outcome{Owner: "a"}); err == nil {
			t.Errorf("Finish(no result) error = nil, want a refusal")
		}
		if diff := cmp.Diff(readAt(first.Record, at), get(t, s, "k")); diff != "" {
			t.Errorf("refused Finishes changed the record (-before +after):\n%s", diff)
		}

		// Expired lease: taken over, PriorState InProgress, window kept.
		later := clk.Set(t0.Add(lease))
		took := begin(t, s, claim("k", "body", "b"), record.Acquired)
		if took.Record.PriorState != record.InProgress {
			t.Errorf("takeover PriorState %v, want InProgress", took.Record.PriorState)
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
		if diff := cmp.Diff(took.Record, get(t, s, "k")); diff != "" {
			t.Errorf("takeover: stored record (-Begin +Get):\n%s", diff)
		}
		// The first owner's late refusal is refused.
		finishAs(t, s, first.Record, record.Outcome{Owner: "a", Result: record.Refused}, record.LeaseLost)
		if r := get(t, s, "k"); r.State != record.InProgress || r.LeaseOwner != "b" {
			t.Errorf("after refused Finish: state %v owner %q, want InProgress b", r.State, r.LeaseOwner)
		}
	})

	t.Run("SucceededReplays", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		c := claim("k", "body", "a")
		began := begin(t, s, c, record.Acquired)
		now := clk.Set(t0.Add(time.Second))
		o := record.Outcome{Owner: "a", Result: record.Paid, HTTPRequests: 2, ProviderStatus: 201, Reply: []byte(`{"id":"p1"}`), SettleAfter: time.Hour}
		finishAs(t, s, began.Record, o, record.Written)
		r := get(t, s, "k")
		want := record.Record{
			Key: "k", Body: c.Body, BodySHA256: c.BodySHA256, Currency: "EUR", Amount: 1234,
			State: record.Succeeded, Requests: 2, ProviderStatus: 201, Reply: []byte(`{"id":"p1"}`),
			RequestID: "req-a", TraceID: "trace-a", Caller: "caller-a",
			CreatedAt: us(t0), UpdatedAt: us(now), SettleBy: us(t0.Add(window)),
			AttemptStartedAt: us(t0), ReadAt: us(now),
			AttemptSeq: 1, AttemptKind: record.ByCall, AttemptRequestID: "req-a",
		}
		if diff := cmp.Diff(want, r); diff != "" {
			t.Errorf("Finish(Paid) record mismatch (-want +got):\n%s", diff)
		}
		wantAttempts := []record.Attempt{{Number: 1, Kind: record.ByCall, Owner: "a", RequestID: "req-a",
			StartedAt: us(t0), EndedAt: us(now), ProviderStatus: 201, HTTPRequests: 2, Reply: []byte(`{"id":"p1"}`),
			State: record.Succeeded}}
		if as, err := s.Attempts(ctx, r); err != nil || !cmp.Equal(wantAttempts, as) {
			t.Errorf("Attempts() = %v (-want +got):\n%s", err, cmp.Diff(wantAttempts, as))
		}
		// Even long after the window, a success replays.
		for _, at := range []time.Time{now, t0.Add(2 * window)} {
			clk.Set(at)
			rb := begin(t, s, claim("k", "body", "b"), record.Replay)
			if diff := cmp.Diff(readAt(want, at), rb.Record); diff != "" {
				t.Errorf("Replay record mismatch (-want +got):\n%s", diff)
			}
		}
	})

	t.Run("ReusedInEveryState", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		setups := map[string]func(key string){
			"InProgress": func(key string) { begin(t, s, claim(key, "body", "a"), record.Acquired) },
			"Succeeded": func(key string) {
				begin(t, s, claim(key, "body", "a"), record.Acquired)
				finish(t, s, key, paid(200, `{}`))
			},
			"NotCreated": func(key string) {
				begin(t, s, claim(key, "body", "a"), record.Acquired)
				finish(t, s, key, refused(400))
			},
			"OutcomeUnknown": func(key string) { makeUnknown(t, s, claim(key, "body", "a"), 0) },
			"Quiet": func(key string) {
				begin(t, s, claim(key, "body", "a"), record.Acquired)
				finish(t, s, key, record.Outcome{Result: record.Unknown, QuietFor: 3 * window})
			},
		}
		for name, setup := range setups {
			clk.Set(t0)
			setup(name)
			before := get(t, s, name)
			for _, at := range []time.Time{t0, t0.Add(lease), t0.Add(2 * window)} {
				clk.Set(at)
				got := begin(t, s, claim(name, "other body", "b"), record.Reused)
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
		begin(t, s, claim("k", "body", "a"), record.Acquired)
		finish(t, s, "k", refused(400))
		// Even after the first window closed.
		later := clk.Set(t0.Add(2 * window))
		got := begin(t, s, claim("k", "body", "b"), record.Acquired)
		if got.Record.PriorState != record.NotCreated {
			t.Errorf("PriorState %v, want NotCreated", got.Record.PriorState)
		}
		if !got.Record.SettleBy.Equal(us(later.Add(window))) || got.Record.State != record.InProgress || got.Record.LeaseOwner != "b" {
			t.Errorf("record = state %v owner %q SettleBy %v, want InProgress b %v", got.Record.State, got.Record.LeaseOwner, got.Record.SettleBy, us(later.Add(window)))
		}
		if got.Record.Requests != 1 {
			t.Errorf("Attempts = %d, want 1 kept", got.Record.Requests)
		}
		// Its refusal proves nothing of the attempt before it, which
		// started the key afresh too: it is NotCreated again.
		if r := finish(t, s, "k", refused(400)); r.State != record.NotCreated {
			t.Errorf("refusal of a fresh attempt: %v, want NotCreated", r.State)
		}
	})

	// A refusal proves nothing about an earlier attempt that may have
	// created the payment: the record stays unknown.
	t.Run("RefusalAfterUnknownStaysUnknown", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		makeUnknown(t, s, claim("k", "body", "a"), 0)
		now := clk.Add(time.Second)
		begin(t, s, claim("k", "body", "b"), record.Acquired)
		o := refused(400)
		o.SettleAfter = time.Minute
		r := finish(t, s, "k", o)
		if r.State != record.OutcomeUnknown || !r.NextSettleAt.Equal(us(now.Add(time.Minute))) || r.ProviderStatus != 400 {
			t.Errorf("refusal after an unknown attempt: %v, next settlement %v, status %d; want OutcomeUnknown, %v, 400",
				r.State, r.NextSettleAt, r.ProviderStatus, us(now.Add(time.Minute)))
		}
	})

	t.Run("OutcomeUnknownWindow", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		u := makeUnknown(t, s, claim("k", "body", "a"), time.Minute)
		// Before SettleBy: acquired, window kept.
		clk.Set(t0.Add(window - time.Microsecond))
		got := begin(t, s, claim("k", "body", "b"), record.Acquired)
		if got.Record.PriorState != record.OutcomeUnknown || !got.Record.SettleBy.Equal(u.SettleBy) {
			t.Errorf("PriorState %v SettleBy %v, want OutcomeUnknown %v", got.Record.PriorState, got.Record.SettleBy, u.SettleBy)
		}
		finish(t, s, "k", unknown(time.Minute))
		// At or after SettleBy: past the window, left alone.
		before := get(t, s, "k")
		at := clk.Set(t0.Add(window))
		pw := begin(t, s, claim("k", "body", "c"), record.PastWindow)
		if diff := cmp.Diff(readAt(before, at), pw.Record); diff != "" {
			t.Errorf("PastWindow record (-before +after):\n%s", diff)
		}
		if diff := cmp.Diff(readAt(before, at), get(t, s, "k")); diff != "" {
			t.Errorf("PastWindow changed the record (-before +after):\n%s", diff)
		}

		// An expired InProgress record past the window becomes OutcomeUnknown.
		clk.Set(t0)
		ip := begin(t, s, claim("ip", "body", "a"), record.Acquired)
		clk.Set(t0.Add(window))
		pw = begin(t, s, claim("ip", "body", "b"), record.PastWindow)
		if pw.Record.State != record.OutcomeUnknown || pw.Record.LeaseOwner != "" {
			t.Errorf("expired InProgress past window: state %v owner %q, want OutcomeUnknown and no lease", pw.Record.State, pw.Record.LeaseOwner)
		}
		if diff := cmp.Diff(pw.Record, get(t, s, "ip")); diff != "" {
			t.Errorf("PastWindow: stored record (-Begin +Get):\n%s", diff)
		}
		// Its old owner can't finish it any more.
		finishAs(t, s, ip.Record, record.Outcome{Owner: "a", Result: record.Refused}, record.LeaseLost)
	})

	t.Run("SettleDue", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		now := t0.Add(time.Hour)
		makeUnknown(t, s, claim("due", "body", "a"), time.Hour)                 // due exactly now
		makeUnknown(t, s, claim("not-yet", "body", "a"), time.Hour+time.Second) // not due
		clk.Set(now.Add(-window))
		makeUnknown(t, s, claim("closed", "body", "a"), window) // window closed at now
		clk.Set(now.Add(-lease))
		begin(t, s, claim("expired", "body", "a"), record.Acquired) // lease ended at now
		clk.Set(now)
		begin(t, s, claim("leased", "body", "a"), record.Acquired) // lease holds
		clk.Set(t0)
		begin(t, s, claim("done", "body", "a"), record.Acquired)
		finish(t, s, "done", paid(200, `{}`)) // nothing to settle

		clk.Set(now)
		const q = 5 * time.Second
		got, gave := settleDue(t, s, "settler", q, 10)
		if diff := cmp.Diff(map[string]int{"due": 1, "expired": 1}, keys(got)); diff != "" {
			t.Errorf("SettleDue() acquired (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(map[string]int{"closed": 1}, keys(gave)); diff != "" {
			t.Errorf("SettleDue() gave up (-want +got):\n%s", diff)
		}
		prior := map[string]record.State{"due": record.OutcomeUnknown, "expired": record.InProgress}
		for _, r := range got {
			if r.State != record.InProgress || r.LeaseOwner != "settler" || !r.LeaseExpiresAt.Equal(us(now.Add(lease))) || r.AttemptKind != record.BySettlement {
				t.Errorf("acquired %q: state %v lease %q until %v kind %v, want InProgress settler until %v, settlement", r.Key, r.State, r.LeaseOwner, r.LeaseExpiresAt, r.AttemptKind, us(now.Add(lease)))
			}
			if !r.QuietUntil.Equal(us(now.Add(lease+q))) || !r.AttemptStartedAt.Equal(us(now)) || r.PriorState != prior[r.Key] || !r.ReadAt.Equal(us(now)) {
				t.Errorf("acquired %q: QuietUntil %v AttemptStartedAt %v PriorState %v ReadAt %v, want %v %v %v %v", r.Key,
					r.QuietUntil, r.AttemptStartedAt, r.PriorState, r.ReadAt, us(now.Add(lease+q)), us(now), prior[r.Key], us(now))
			}
			if diff := cmp.Diff(r, get(t, s, r.Key)); diff != "" {
				t.Errorf("acquired %q: stored record (-returned +stored):\n%s", r.Key, diff)
			}
		}
		for _, r := range gave {
			if diff := cmp.Diff(r, get(t, s, r.Key)); diff != "" {
				t.Errorf("gave up %q: stored record (-returned +stored):\n%s", r.Key, diff)
			}
		}
		if again, gave := settleDue(t, s, "other", 0, 10); len(again)+len(gave) != 0 {
			t.Errorf("second SettleDue() = %v, %v; want nothing (leased, given up)", keys(again), keys(gave))
		}
		// The settler finishes: SettleAttempts counts it.
		o := unknown(time.Minute)
		o.HTTPRequests = 1
		r := finish(t, s, "due", o)
		if r.SettleAttempts != 1 || r.Requests != 2 || !r.NextSettleAt.Equal(us(now.Add(time.Minute))) {
			t.Errorf("after settlement: SettleAttempts %d Attempts %d NextSettleAt %v, want 1, 2, %v", r.SettleAttempts, r.Requests, r.NextSettleAt, us(now.Add(time.Minute)))
		}
		// acquire is honoured.
		clk.Set(t0)
		for i := range 5 {
			makeUnknown(t, s, claim(fmt.Sprintf("many%d", i), "body", "a"), 0)
		}
		clk.Set(now)
		if got := claimDue(t, s, "settler", 0, 3); len(got) != 3 {
			t.Errorf("SettleDue(acquire 3) = %d records; want 3", len(got))
		}
		if got := claimDue(t, s, "settler", 0, 0); len(got) != 0 {
			t.Errorf("SettleDue(acquire 0) = %d records; want none", len(got))
		}
	})

	t.Run("SettleDueConcurrentClaimers", func(t *testing.T) {
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
			owner := fmt.Sprintf("replica%d/1", w)
			wg.Go(func() {
				for {
					got, _, err := st.SettleDue(ctx, record.Settle{Owner: owner, LeaseTTL: lease}, nil, 3)
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
							errs <- fmt.Errorf("%s acquired by %s and %s", r.Key, prev, owner)
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
			t.Errorf("acquired %d records, want %d", len(seen), n)
		}
	})

	// Candidates that Step leaves alone (a quiet period, a lease of the
	// settler's own process, a key its outbox holds) never keep settlement
	// from the one that is due behind them.
	t.Run("SettleDueNotStarved", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		const n = 80
		for i := range n {
			k := fmt.Sprintf("quiet%02d", i)
			begin(t, s, claim(k, "body", "a"), record.Acquired)
			finish(t, s, k, record.Outcome{Result: record.Unknown, QuietFor: time.Hour})
			k = fmt.Sprintf("own%02d", i)
			begin(t, s, claim(k, "body", "p/"+k), record.Acquired)
			k = fmt.Sprintf("pending%02d", i)
			makeUnknown(t, s, claim(k, "body", "a"), 0)
		}
		clk.Add(time.Second)
		makeUnknown(t, s, claim("due", "body", "a"), 0)
		begin(t, s, claim("expired", "body", "q/1"), record.Acquired)
		clk.Add(lease)
		pending := func(key string) bool { return strings.HasPrefix(key, "pending") }
		got, gave, err := s.SettleDue(ctx, record.Settle{Owner: "p/settler", LeaseTTL: lease}, pending, 1)
		if err != nil || len(got) != 1 || len(gave) != 0 {
			t.Fatalf("SettleDue() = %v, %v, %v; want one record", keys(got), keys(gave), err)
		}
		got2, _, err := s.SettleDue(ctx, record.Settle{Owner: "p/settler", LeaseTTL: lease}, pending, 1)
		if err != nil || len(got2) != 1 {
			t.Fatalf("second SettleDue() = %v, %v; want one record", keys(got2), err)
		}
		if diff := cmp.Diff(map[string]int{"due": 1, "expired": 1}, keys(append(got, got2...))); diff != "" {
			t.Errorf("SettleDue() past what it leaves (-want +got):\n%s", diff)
		}
	})

	t.Run("GiveUp", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		end := t0.Add(window)
		makeUnknown(t, s, claim("unknown", "body", "a"), 0)         // window closed at end
		begin(t, s, claim("expired", "body", "a"), record.Acquired) // lease long gone
		begin(t, s, claim("leased", "body", "a"), record.Acquired)  //
		clk.Set(t0.Add(time.Hour))
		begin(t, s, claim("open", "body", "a"), record.Acquired) // window still open at end
		finish(t, s, "open", unknown(0))
		clk.Set(t0)
		begin(t, s, claim("notcreated", "body", "a"), record.Acquired)
		finish(t, s, "notcreated", refused(400))
		// "leased" renews its lease past the window's end.
		clk.Set(end.Add(-time.Second))
		begin(t, s, claim("leased", "body", "a"), record.Acquired)

		clk.Set(end)
		got := giveUp(t, s, "settler/1")
		if diff := cmp.Diff(map[string]int{"unknown": 1, "expired": 1}, keys(got)); diff != "" {
			t.Errorf("SettleDue(acquire 0) gave up (-want +got):\n%s", diff)
		}
		for _, r := range got {
			if r.State != record.OutcomeUnknown || !r.GaveUp || r.LeaseOwner != "" || !r.UpdatedAt.Equal(us(end)) || !r.ReadAt.Equal(us(end)) {
				t.Errorf("gave up %q: state %v GaveUp %v owner %q UpdatedAt %v ReadAt %v, want OutcomeUnknown, true, none, %v, %v",
					r.Key, r.State, r.GaveUp, r.LeaseOwner, r.UpdatedAt, r.ReadAt, us(end), us(end))
			}
		}
		if again := giveUp(t, s, "settler/1"); len(again) != 0 {
			t.Errorf("second give-up pass = %v; want nothing (each once ever)", keys(again))
		}
		// Given up is past the window: only "open" may still be settled.
		if got, gave := settleDue(t, s, "settler/2", 0, 10); !cmp.Equal(keys(got), map[string]int{"open": 1}) || len(gave) != 0 {
			t.Errorf("SettleDue after giving up = %v, %v; want open only", keys(got), keys(gave))
		}
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatalf("Stats() error = %v", err)
		}
		if st.Unsettled != 2 {
			t.Errorf("Stats().Unsettled = %d, want 2", st.Unsettled)
		}
	})

	// Release ends claims whose commit was unknown to their claimant,
	// which sent nothing: a fresh key is NotCreated, one an earlier
	// attempt may have paid is unknown again, due for settlement. Neither
	// leaves a journal row: no request was sent.
	t.Run("Release", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		begin(t, s, claim("fresh", "body", "p/1"), record.Acquired)
		makeUnknown(t, s, claim("again", "body", "a"), 0)
		begin(t, s, claim("again", "body", "p/1"), record.Acquired)
		begin(t, s, claim("other", "body", "p/2"), record.Acquired)
		now := clk.Add(time.Second)
		if n, err := s.Release(ctx, "p/1", time.Minute); err != nil || n != 2 {
			t.Fatalf("Release(p/1) = %d, %v; want 2", n, err)
		}
		if r := get(t, s, "fresh"); r.State != record.NotCreated || r.LeaseOwner != "" || r.AttemptSeq != 0 {
			t.Errorf("released fresh = %v held by %q, attempt %d; want NotCreated, unheld, no attempt", r.State, r.LeaseOwner, r.AttemptSeq)
		}
		r := get(t, s, "again")
		if r.State != record.OutcomeUnknown || r.LeaseOwner != "" || !r.NextSettleAt.Equal(us(now.Add(time.Minute))) || r.AttemptSeq != 1 {
			t.Errorf("released again = %v held by %q, next settlement %v, attempt %d; want OutcomeUnknown, unheld, %v, 1",
				r.State, r.LeaseOwner, r.NextSettleAt, r.AttemptSeq, us(now.Add(time.Minute)))
		}
		if as, err := s.Attempts(ctx, r); err != nil || len(as) != 1 || as[0].Owner != "a" {
			t.Errorf("attempts of again = %+v, %v; want a's only", as, err)
		}
		if r := get(t, s, "other"); r.State != record.InProgress || r.LeaseOwner != "p/2" {
			t.Errorf("other = %v held by %q, want p/2's", r.State, r.LeaseOwner)
		}
		if n, err := s.Release(ctx, "p/1", time.Minute); err != nil || n != 0 {
			t.Errorf("Release(p/1) again = %d, %v; want 0", n, err)
		}
	})

	// Every write is the record Step returned, and leaves the journal rows
	// Step's effect names: the record a Get reads and the attempts it
	// lists are what record.Step says, for each kind of write.
	t.Run("WritesAreStepsEffect", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		// check compares key's record with n, and its attempts with what
		// they were (before) changed by eff.
		check := func(what, key string, n record.Record, eff record.Effect, before []record.Attempt) {
			t.Helper()
			got := get(t, s, key)
			if diff := cmp.Diff(readAt(n, clk.Now()), got); diff != "" {
				t.Errorf("%s (%v): stored record (-Step +Get):\n%s", what, eff.Write, diff)
			}
			var want []record.Attempt
			for _, a := range before {
				if a.InFlight {
					continue
				}
				if r := eff.Rewritten; r != nil && a.Owner == r.Owner && a.Number == r.Number {
					a = *r
				}
				want = append(want, a)
			}
			if eff.Ended != nil {
				want = append(want, *eff.Ended)
			}
			if n.State == record.InProgress {
				want = append(want, n.InFlight())
			}
			as, err := s.Attempts(ctx, got)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, as, cmp.Comparer(func(a, b []byte) bool { return string(a) == string(b) })); diff != "" {
				t.Errorf("%s (%v): journal (-Step +stored):\n%s", what, eff.Write, diff)
			}
		}
		journal := func(key string) []record.Attempt {
			r, err := s.Get(ctx, key)
			if errors.Is(err, store.ErrNotFound) {
				return nil
			}
			as, err := s.Attempts(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			return as
		}
		step := func(r *record.Record, ev record.Event) (record.Record, record.Effect) {
			return record.Step(r, ev, clk.Now())
		}

		// WriteInsert.
		c := claim("k", "body", "p/1")
		n, eff := step(nil, c)
		b := begin(t, s, c, record.Acquired)
		if diff := cmp.Diff(n, b.Record); diff != "" {
			t.Errorf("Begin(new key) record (-Step +Begin):\n%s", diff)
		}
		check("a new key", "k", n, eff, nil)

		// WriteFinish, an unknown outcome.
		clk.Add(time.Second)
		o := record.Outcome{Owner: "p/1", Result: record.Unknown, HTTPRequests: 2, ProviderStatus: 503, Reply: []byte(`{"e":1}`),
			Error: "503", Code: 14, SettleAfter: time.Second}
		before := journal("k")
		n, eff = step(&b.Record, o)
		finishAs(t, s, b.Record, o, record.Written)
		check("an unknown outcome", "k", n, eff, before)

		// WriteAcquire, by settlement.
		clk.Add(time.Second)
		r, before := get(t, s, "k"), journal("k")
		n, eff = step(&r, record.Settle{Owner: "q/1", LeaseTTL: lease, Quiet: time.Second, Settled: true})
		settled := claimDue(t, s, "q/1", time.Second, 1)
		if len(settled) != 1 || !cmp.Equal(n, settled[0]) {
			t.Fatalf("SettleDue() = %+v, want Step's %+v", settled, n)
		}
		check("settlement's claim", "k", n, eff, before)

		// WriteTakeOver.
		clk.Add(lease + time.Second)
		r, before = get(t, s, "k"), journal("k")
		c = claim("k", "body", "r/1")
		c.Settled = true
		n, eff = step(&r, c)
		begin(t, s, c, record.Acquired)
		check("a takeover", "k", n, eff, before)

		// WriteLate: settlement's 2xx after its lease, with r/1 in flight.
		clk.Add(time.Second)
		r, before = get(t, s, "k"), journal("k")
		o = paid(201, `{"id":"late"}`)
		o.Owner = "q/1"
		for _, a := range before {
			if a.Owner == "q/1" {
				o.Row = &a
			}
		}
		n, eff = step(&r, o)
		o.Row = nil
		finishAs(t, s, settled[0], o, record.Late)
		check("a late 2xx", "k", n, eff, before)
		// Then r/1's refusal: nothing is written.
		r, before = get(t, s, "k"), journal("k")
		finishAs(t, s, r, record.Outcome{Owner: "r/1", Result: record.Refused}, record.LeaseLost)
		check("a refusal after the lease", "k", r, record.Effect{}, before)

		// WriteFinish, nothing sent: no row.
		b = begin(t, s, claim("n", "body", "p/2"), record.Acquired)
		clk.Add(time.Second)
		o = record.Outcome{Owner: "p/2", Result: record.NothingSent, Error: "too busy", Code: 8}
		n, eff = step(&b.Record, o)
		finishAs(t, s, b.Record, o, record.Written)
		check("nothing sent", "n", n, eff, journal("n"))

		// WriteAbandon, by a claim past the window.
		c = claim("w", "body", "p/3")
		c.Window = lease + time.Second
		begin(t, s, c, record.Acquired)
		clk.Add(lease + time.Second)
		r, before = get(t, s, "w"), journal("w")
		c = claim("w", "body", "s/1")
		c.Settled = true
		n, eff = step(&r, c)
		begin(t, s, c, record.PastWindow)
		check("a claim past the window", "w", n, eff, before)

		// WriteGiveUp.
		clk.Add(time.Second)
		r, before = get(t, s, "w"), journal("w")
		n, eff = step(&r, record.Settle{Owner: "q/2", LeaseTTL: lease, Settled: true})
		if gave := giveUp(t, s, "q/2"); len(gave) != 1 || !cmp.Equal(n, gave[0]) {
			t.Errorf("give-up pass = %+v, want Step's %+v", gave, n)
		}
		check("giving up", "w", n, eff, before)

		// WriteResolve.
		clk.Add(time.Second)
		r, before = get(t, s, "w"), journal("w")
		res := record.Resolve{To: record.Succeeded, Reply: []byte(`{"id":"found"}`), UnchangedSince: r.UpdatedAt}
		n, eff = step(&r, res)
		got, err := s.Resolve(ctx, "w", res, store.AuditInfo{Actor: "a", Evidence: "e"})
		if err != nil || !cmp.Equal(n, got.Record) {
			t.Errorf("Resolve() = %+v, %v; want Step's %+v", got.Record, err, n)
		}
		check("a resolution", "w", n, eff, before)
	})

	t.Run("ConcurrentBeginOneKey", func(t *testing.T) {
		t.Parallel()
		s, _ := fresh(t)
		const n = 16
		verdicts := make(chan record.Verdict, n)
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				b, err := s.Begin(ctx, claim("one", "body", fmt.Sprintf("o%d", i)), nil)
				if err != nil {
					errs <- err
					return
				}
				verdicts <- b.Verdict
			})
		}
		wg.Wait()
		close(verdicts)
		close(errs)
		for err := range errs {
			t.Errorf("Begin error = %v", err)
		}
		count := map[record.Verdict]int{}
		for v := range verdicts {
			count[v]++
		}
		if diff := cmp.Diff(map[record.Verdict]int{record.Acquired: 1, record.Busy: n - 1}, count); diff != "" {
			t.Errorf("verdicts (-want +got):\n%s", diff)
		}
	})

	// Concurrent writes are committed together (group commit in SQLite):
	// each still gets its own verdict, a lost lease is only its own
	// Finish's, and every acquired record is there once Begin returns.
	t.Run("ConcurrentBeginsAndFinishesDistinctKeys", func(t *testing.T) {
		t.Parallel()
		s, _ := fresh(t)
		const n = 24
		pre := make([]record.Record, n)
		for i := range n {
			pre[i] = begin(t, s, claim(fmt.Sprintf("pre%d", i), "body", "a"), record.Acquired).Record
		}
		var wg sync.WaitGroup
		errs := make(chan error, 3*n)
		for i := range n {
			wg.Go(func() {
				key := fmt.Sprintf("new%d", i)
				b, err := s.Begin(ctx, claim(key, "body", "b"), nil)
				if err != nil || b.Verdict != record.Acquired || b.Record.Key != key || b.Record.State != record.InProgress {
					errs <- fmt.Errorf("Begin(%q) = %v %q %v, %v; want Acquired InProgress", key, b.Verdict, b.Record.Key, b.Record.State, err)
				}
			})
			wg.Go(func() {
				owner := "a"
				if i%3 == 0 {
					owner = "not-the-owner"
				}
				o := paid(200, fmt.Sprintf(`{"n":%d}`, i))
				o.Owner = owner
				v, err := s.Finish(ctx, &pre[i], o)
				switch {
				case owner != "a" && (err != nil || v != record.LeaseLost):
					errs <- fmt.Errorf("Finish(%q, wrong owner) = %v, %v; want LeaseLost", pre[i].Key, v, err)
				case owner == "a" && (err != nil || v != record.Written):
					errs <- fmt.Errorf("Finish(%q) = %v, %v; want Written", pre[i].Key, v, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		for i := range n {
			if r := get(t, s, fmt.Sprintf("new%d", i)); r.State != record.InProgress || r.LeaseOwner != "b" {
				t.Errorf("record new%d = %v owned by %q, want InProgress owned by b", i, r.State, r.LeaseOwner)
			}
			r := get(t, s, fmt.Sprintf("pre%d", i))
			switch {
			case i%3 == 0 && r.State != record.InProgress:
				t.Errorf("record pre%d = %v, want InProgress", i, r.State)
			case i%3 != 0 && (r.State != record.Succeeded || string(r.Reply) != fmt.Sprintf(`{"n":%d}`, i)):
				t.Errorf("record pre%d = %v %s, want Succeeded with its own reply", i, r.State, r.Reply)
			}
		}
		if s.Commits() == 0 {
			t.Error("Commits() = 0 after writes")
		}
	})

	// Finish's outcome is durable when it returns, with its journal row.
	t.Run("FinishDurable", func(t *testing.T) {
		t.Parallel()
		url := b.url(t)
		clk := newClock(t0)
		s, err := store.Open(ctx, url, "sandbox", store.Options{Now: clk.Now, TakeoverGrace: -1})
		if err != nil {
			t.Fatal(err)
		}
		const n = 8
		claimed := make([]record.Record, n)
		for i := range n {
			claimed[i] = begin(t, s, claim(fmt.Sprintf("k%d", i), "body", "a"), record.Acquired).Record
		}
		clk.Set(t0.Add(time.Second))
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				o := paid(200, `{}`)
				o.Owner = "a"
				var v record.Verdict
				if v, errs[i] = s.Finish(ctx, &claimed[i], o); errs[i] == nil && v != record.Written {
					errs[i] = fmt.Errorf("verdict %v, want Written", v)
				}
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("Finish(k%d) error = %v", i, err)
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
			if r.State != record.Succeeded || !r.UpdatedAt.Equal(us(t0.Add(time.Second))) {
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
			begin(t, s, claim(k, fmt.Sprintf("body%d", i), "a"), record.Acquired)
		}
		for i, k := range ks {
			r := get(t, s, k)
			if r.Key != k || string(r.Body) != fmt.Sprintf("body%d", i) {
				t.Errorf("Get(key %d) = key %.20q body %q, want %.20q body%d", i, r.Key, r.Body, k, i)
			}
			// The same key again finds its own record.
			begin(t, s, claim(k, fmt.Sprintf("body%d", i), "b"), record.Busy)
		}
		// A NUL byte: stored exactly, or refused with ErrKeyNotStorable
		// (always in PostgreSQL, whose text can't hold it).
		for _, k := range []string{"a\x00b", "a\x00c"} {
			bg, err := s.Begin(ctx, claim(k, "nul "+k, "a"), nil)
			switch {
			case errors.Is(err, store.ErrKeyNotStorable):
			case err != nil:
				t.Errorf("Begin(NUL key) error = %v, want nil or ErrKeyNotStorable", err)
			case b.name == "postgres":
				t.Errorf("Begin(NUL key) on PostgreSQL = %v, want ErrKeyNotStorable", bg.Verdict)
			case bg.Verdict != record.Acquired:
				t.Errorf("Begin(NUL key %q) = %v, want Acquired", k, bg.Verdict)
			default:
				if r := get(t, s, k); r.Key != k || string(r.Body) != "nul "+k {
					t.Errorf("Get(NUL key %q) = key %q body %q", k, r.Key, r.Body)
				}
				ks = append(ks, k)
			}
		}
		// Each key's journal row is its own, and its tombstone refuses
		// that key and no other.
		for i, k := range ks {
			r := finish(t, s, k, paid(200, fmt.Sprintf(`{"n":%d}`, i)))
			if as, err := s.Attempts(ctx, r); err != nil || len(as) != 1 || string(as[0].Reply) != fmt.Sprintf(`{"n":%d}`, i) {
				t.Errorf("Attempts(key %d) = %+v, %v; want its one row", i, as, err)
			}
		}
		clk.Set(t0.Add(keep + time.Second))
		deleteAll(t, s, store.Retention{Records: keep, Tombstones: keepTombstones}, 10)
		for i, k := range ks {
			want := sha256.Sum256([]byte(k))
			if got := begin(t, s, claim(k, "other body", "b"), record.Expired); got.Tombstone.KeySHA256 != want {
				t.Errorf("Begin(key %d) after retention: tombstone of another key", i)
			}
		}
		begin(t, s, claim("abcd", "body", "b"), record.Acquired) // a key never used
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
		begin(t, s, quiet(claim("k", "body", "a"), time.Minute), record.Acquired)
		want := finish(t, s, "k", record.Outcome{Result: record.Unknown, ProviderStatus: 503, Reply: []byte("{}"),
			SettleAfter: time.Second, QuietFor: time.Minute})
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
		begin(t, s, claim("ip", "body", "a"), record.Acquired)
		for i, st := range []record.State{record.Succeeded, record.NotCreated, record.OutcomeUnknown, record.OutcomeUnknown} {
			k := fmt.Sprintf("%v-%d", st, i)
			begin(t, s, claim(k, "body", "a"), record.Acquired)
			finish(t, s, k, record.Outcome{Result: resultOf(st)})
		}
		if _, err := s.AppendEvent(ctx, store.Event{ReceivedAt: t0, BodySHA256: sha256.Sum256(nil)}); err != nil {
			t.Fatal(err)
		}
		got, err := s.Stats(ctx)
		if err != nil {
			t.Fatalf("Stats() error = %v", err)
		}
		want := store.Stats{ByState: map[record.State]int64{
			record.InProgress: 1, record.Succeeded: 1, record.NotCreated: 1, record.OutcomeUnknown: 2,
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
	// An attempt that ended without the provider's answer leaves the key
	// quiet for Finish.QuietFor: Begin answers Quiet and changes nothing,
	// settlement leaves it alone, and both go on once it has passed.
	t.Run("QuietAfterUnansweredAttempt", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		begin(t, s, claim("k", "body", "a"), record.Acquired)
		done := clk.Set(t0.Add(time.Second))
		u := finish(t, s, "k", record.Outcome{Result: record.Unknown, HTTPRequests: 1, QuietFor: 20 * time.Second})
		end := done.Add(20 * time.Second)
		if !u.QuietUntil.Equal(us(end)) || !u.NextSettleAt.Equal(us(done)) || u.LeaseOwner != "" {
			t.Errorf("Finish(QuietFor 20s): QuietUntil %v NextSettleAt %v owner %q, want %v, %v, none", u.QuietUntil, u.NextSettleAt, u.LeaseOwner, us(end), us(done))
		}
		for _, at := range []time.Time{done, end.Add(-time.Microsecond)} {
			clk.Set(at)
			q := begin(t, s, claim("k", "body", "b"), record.Quiet)
			if diff := cmp.Diff(readAt(u, at), q.Record); diff != "" {
				t.Errorf("Quiet record at %v (-stored +got):\n%s", at, diff)
			}
			if got := claimDue(t, s, "settler", 0, 10); len(got) != 0 {
				t.Errorf("SettleDue at %v while quiet = %v, want nothing", at, keys(got))
			}
		}
		if diff := cmp.Diff(readAt(u, clk.Now()), get(t, s, "k")); diff != "" {
			t.Errorf("Quiet changed the record (-before +after):\n%s", diff)
		}
		clk.Set(end)
		got := begin(t, s, claim("k", "body", "b"), record.Acquired)
		if got.Record.PriorState != record.OutcomeUnknown || got.Record.LeaseOwner != "b" || !got.Record.QuietUntil.Equal(us(end.Add(lease))) {
			t.Errorf("Begin once quiet passed: PriorState %v owner %q QuietUntil %v, want OutcomeUnknown, b, %v", got.Record.PriorState, got.Record.LeaseOwner, got.Record.QuietUntil, us(end.Add(lease)))
		}
	})

	// A claimant that dies mid-call leaves its request presumed at the
	// provider until its lease ends plus Claim.Quiet.
	t.Run("QuietAfterLeaseOfDeadHolder", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		const q = 10 * time.Second
		first := begin(t, s, quiet(claim("k", "body", "a"), q), record.Acquired)
		end := t0.Add(lease + q)
		for _, at := range []time.Time{t0.Add(lease), end.Add(-time.Microsecond)} {
			clk.Set(at)
			got := begin(t, s, claim("k", "body", "b"), record.Quiet)
			if diff := cmp.Diff(readAt(first.Record, at), got.Record); diff != "" {
				t.Errorf("Quiet record at %v (-stored +got):\n%s", at, diff)
			}
			if got, gave := settleDue(t, s, "settler", 0, 10); len(got)+len(gave) != 0 {
				t.Errorf("SettleDue at %v while quiet = %v, %v; want nothing (window open)", at, keys(got), keys(gave))
			}
		}
		clk.Set(end)
		took := begin(t, s, claim("k", "body", "b"), record.Acquired)
		if took.Record.PriorState != record.InProgress || took.Record.LeaseOwner != "b" {
			t.Errorf("Begin once quiet passed: PriorState %v owner %q, want InProgress, b", took.Record.PriorState, took.Record.LeaseOwner)
		}
		finishAs(t, s, first.Record, record.Outcome{Owner: "a", Result: record.Refused}, record.LeaseLost)
	})

	// Finish sets QuietUntil from QuietFor, or clears what Begin presumed.
	t.Run("FinishSetsOrClearsQuiet", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		for _, tc := range []struct {
			name     string
			state    record.State
			quietFor time.Duration
			want     time.Duration // 0: no quiet period
			then     record.Verdict
		}{
			{"answered", record.OutcomeUnknown, 0, 0, record.Acquired},
			{"negative", record.OutcomeUnknown, -time.Second, 0, record.Acquired},
			{"unanswered", record.OutcomeUnknown, 15 * time.Second, 15 * time.Second, record.Quiet},
			// NotCreated starts the key afresh, whatever QuietUntil says.
			{"not created", record.NotCreated, 15 * time.Second, 15 * time.Second, record.Acquired},
			{"succeeded", record.Succeeded, 15 * time.Second, 15 * time.Second, record.Replay},
		} {
			now := clk.Set(t0)
			begin(t, s, quiet(claim(tc.name, "body", "a"), time.Hour), record.Acquired)
			r := finish(t, s, tc.name, record.Outcome{Result: resultOf(tc.state), QuietFor: tc.quietFor})
			want := time.Time{}
			if tc.want > 0 {
				want = us(now.Add(tc.want))
			}
			if !r.QuietUntil.Equal(want) {
				t.Errorf("%s: Finish(QuietFor %v) QuietUntil = %v, want %v", tc.name, tc.quietFor, r.QuietUntil, want)
			}
			got := begin(t, s, claim(tc.name, "body", "b"), tc.then)
			if tc.then == record.Acquired && !got.Record.QuietUntil.Equal(us(now.Add(lease))) {
				t.Errorf("%s: reacquired QuietUntil = %v, want %v", tc.name, got.Record.QuietUntil, us(now.Add(lease)))
			}
		}
	})

	t.Run("SettleDueSkipsQuiet", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		const q = 10 * time.Second
		makeUnknown(t, s, claim("loud", "body", "a"), 0)
		begin(t, s, claim("quiet", "body", "a"), record.Acquired)
		finish(t, s, "quiet", record.Outcome{Result: record.Unknown, QuietFor: time.Minute})
		begin(t, s, quiet(claim("held", "body", "a"), time.Minute), record.Acquired) // its holder dies

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
				t.Errorf("SettleDue at t0+%v keys (-want +got):\n%s", step.at, diff)
			}
			for _, r := range got {
				if !r.QuietUntil.Equal(us(now.Add(lease + q))) {
					t.Errorf("SettleDue at t0+%v: %s QuietUntil %v, want %v", step.at, r.Key, r.QuietUntil, us(now.Add(lease+q)))
				}
			}
		}
		// A settler that died leaves the key quiet for Begin too.
		clk.Set(t0.Add(lease + time.Minute + lease))
		begin(t, s, claim("held", "body", "b"), record.Quiet)
		clk.Set(t0.Add(lease + time.Minute + lease + q))
		begin(t, s, claim("held", "body", "b"), record.Acquired)
	})

	t.Run("PastWindowWinsOverQuiet", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		begin(t, s, claim("unknown", "body", "a"), record.Acquired)
		begin(t, s, quiet(claim("ip", "body", "a"), 2*window), record.Acquired)
		clk.Set(t0.Add(window - time.Second))
		u := finish(t, s, "unknown", record.Outcome{Result: record.Unknown, QuietFor: time.Hour})
		end := clk.Set(t0.Add(window))
		if got := begin(t, s, claim("unknown", "body", "b"), record.PastWindow); !cmp.Equal(readAt(u, end), got.Record) {
			t.Errorf("PastWindow record = %+v, want unchanged %+v", got.Record, u)
		}
		got := begin(t, s, claim("ip", "body", "b"), record.PastWindow)
		if got.Record.State != record.OutcomeUnknown || got.Record.LeaseOwner != "" {
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
		check := func(what string, r record.Record) {
			t.Helper()
			if want := us(clk.Now()); !r.ReadAt.Equal(want) || r.ReadAt.Location() != time.UTC {
				t.Errorf("%s: ReadAt = %v, want %v", what, r.ReadAt, want)
			}
		}
		step := func() { clk.Add(time.Second + 7*time.Nanosecond) }
		check("Begin Acquired", begin(t, s, claim("k", "body", "a"), record.Acquired).Record)
		step()
		check("Begin Busy", begin(t, s, claim("k", "body", "b"), record.Busy).Record)
		check("Begin Reused", begin(t, s, claim("k", "other", "b"), record.Reused).Record)
		check("Get", get(t, s, "k"))
		step()
		check("Finish", finish(t, s, "k", record.Outcome{Result: record.Unknown, QuietFor: 10 * time.Second}))
		step()
		check("Begin Quiet", begin(t, s, claim("k", "body", "b"), record.Quiet).Record)
		clk.Add(10 * time.Second)
		got := claimDue(t, s, "settler", 0, 10)
		if len(got) != 1 {
			t.Fatalf("SettleDue = %v, want k", keys(got))
		}
		check("SettleDue", got[0])
		finish(t, s, "k", record.Outcome{Result: record.Unknown})
		clk.Set(t0.Add(window))
		check("Begin PastWindow", begin(t, s, claim("k", "body", "b"), record.PastWindow).Record)
		gave := giveUp(t, s, "settler/1")
		if len(gave) != 1 {
			t.Fatalf("give-up pass = %v; want k", keys(gave))
		}
		check("SettleDue GaveUp", gave[0])
		begin(t, s, claim("s", "body", "a"), record.Acquired)
		finish(t, s, "s", record.Outcome{Result: record.Paid})
		step()
		check("Begin Replay", begin(t, s, claim("s", "body", "b"), record.Replay).Record)
		// Acquiring an existing record, and closing an abandoned one.
		begin(t, s, claim("n", "body", "a"), record.Acquired)
		finish(t, s, "n", record.Outcome{Result: record.Refused})
		step()
		check("Begin Acquired (NotCreated)", begin(t, s, claim("n", "body", "b"), record.Acquired).Record)
		clk.Add(window)
		check("Begin PastWindow (abandoned)", begin(t, s, claim("n", "body", "c"), record.PastWindow).Record)
	})

	t.Run("PriorStateAndAttemptStartedAt", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		check := func(what string, b *store.Began, prior record.State, started time.Time) {
			t.Helper()
			if b.Record.PriorState != prior || !b.Record.AttemptStartedAt.Equal(us(started)) {
				t.Errorf("%s: PriorState %v AttemptStartedAt %v, want %v, %v", what, b.Record.PriorState, b.Record.AttemptStartedAt, prior, us(started))
			}
		}
		check("new key", begin(t, s, claim("k", "body", "a"), record.Acquired), 0, t0)
		clk.Add(time.Second)
		// Finish keeps both.
		r := finish(t, s, "k", record.Outcome{Result: record.Unknown})
		if r.PriorState != 0 || !r.AttemptStartedAt.Equal(us(t0)) {
			t.Errorf("after Finish: PriorState %v AttemptStartedAt %v, want 0, %v", r.PriorState, r.AttemptStartedAt, us(t0))
		}
		now := clk.Add(time.Second)
		check("from OutcomeUnknown", begin(t, s, claim("k", "body", "b"), record.Acquired), record.OutcomeUnknown, now)
		now = clk.Add(lease)
		check("from expired InProgress", begin(t, s, claim("k", "body", "d"), record.Acquired), record.InProgress, now)
		// Outcomes that acquire nothing change neither.
		clk.Add(time.Second)
		if b := begin(t, s, claim("k", "body", "e"), record.Busy); !b.Record.AttemptStartedAt.Equal(us(now)) || b.Record.PriorState != record.InProgress {
			t.Errorf("Busy: PriorState %v AttemptStartedAt %v, want InProgress, %v", b.Record.PriorState, b.Record.AttemptStartedAt, us(now))
		}
		// SettleDue sets both, too.
		finish(t, s, "k", record.Outcome{Result: record.Unknown})
		now = clk.Add(time.Second)
		got := claimDue(t, s, "settler", 0, 10)
		if len(got) != 1 || got[0].PriorState != record.OutcomeUnknown || !got[0].AttemptStartedAt.Equal(us(now)) {
			t.Errorf("SettleDue = %+v, want k with PriorState OutcomeUnknown, AttemptStartedAt %v", got, us(now))
		}
		// A key started afresh.
		begin(t, s, claim("n", "body", "a"), record.Acquired)
		finish(t, s, "n", refused(400))
		now = clk.Add(time.Second)
		check("from NotCreated", begin(t, s, claim("n", "body", "c"), record.Acquired), record.NotCreated, now)
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
			begin(t, s, claim(k, "body", "a"), record.Acquired)
			finish(t, s, k, record.Outcome{Result: record.Paid})
		}
		begin(t, s, claim("old-inprogress", "body", "a"), record.Acquired)
		cut := clk.Set(t0.Add(keep + time.Second))
		begin(t, s, claim("new", "body", "a"), record.Acquired)
		finish(t, s, "new", record.Outcome{Result: record.Refused})
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
			begin(t, s, claim(k, "body", "b"), record.Expired)
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
			state  record.State
			gaveUp bool
		}{
			{record.Succeeded, false},
			{record.NotCreated, false},
			{record.OutcomeUnknown, true},
		} {
			t.Run(tc.state.String(), func(t *testing.T) {
				t.Parallel()
				s, clk := fresh(t)
				c := claim("k", `{"amount":1}`, "a")
				begin(t, s, c, record.Acquired)
				clk.Set(t0.Add(time.Second))
				last := finish(t, s, "k", record.Outcome{Result: resultOf(tc.state)})
				if tc.gaveUp {
					clk.Set(t0.Add(window))
					gave := giveUp(t, s, "settler/1")
					if len(gave) != 1 {
						t.Fatalf("give-up pass = %v; want k", keys(gave))
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
						got := begin(t, s, claim("k", body, "b"), record.Expired)
						if diff := cmp.Diff(want, got.Tombstone); diff != "" {
							t.Errorf("%s: Begin(%s) Tombstone (-want +got):\n%s", when, body, diff)
						}
					}
					if got, gave := settleDue(t, s, "settler", 0, 10); len(got)+len(gave) != 0 {
						t.Errorf("%s: SettleDue = %v, %v; want nothing", when, keys(got), keys(gave))
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
		first := begin(t, s, c, record.Acquired).Record
		clk.Add(lease)
		begin(t, s, claim("k", "body", "b"), record.Acquired) // a's attempt abandoned
		finish(t, s, "k", record.Outcome{Result: record.Unknown, HTTPRequests: 1})
		marked := clk.Set(t0.Add(lease + keep + time.Second))
		if diff := cmp.Diff([]int{1}, deleteAll(t, s, retention, 10)); diff != "" {
			t.Errorf("DeleteExpired (-want +got):\n%s", diff)
		}
		begin(t, s, claim("k", "body", "b"), record.Expired)
		if got, gave := settleDue(t, s, "settler", 0, 10); len(got)+len(gave) != 0 {
			t.Errorf("SettleDue = %v, %v; want nothing", keys(got), keys(gave))
		}
		// Even a late 2xx: the key has expired.
		finishAs(t, s, first, record.Outcome{Owner: "a", Result: record.Paid}, record.LeaseLost)
		clk.Set(marked.Add(store.TombstoneGrace))
		if diff := cmp.Diff([]int{1}, deleteAll(t, s, retention, 10)); diff != "" {
			t.Errorf("DeleteExpired after the grace period (-want +got):\n%s", diff)
		}
		begin(t, s, claim("k", "body", "b"), record.Expired)
	})

	// Retention never tombstones an InProgress record, however old: its
	// holder may be sending. Once settlement gives up on it, it is an
	// unknown record like any other.
	t.Run("InProgressNeverTombstoned", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		begin(t, s, claim("k", "body", "a"), record.Acquired)
		clk.Set(t0.Add(10 * keep))
		if got := deleteAll(t, s, retention, 10); len(got) != 0 {
			t.Errorf("DeleteExpired = %v, want nothing", got)
		}
		if r := get(t, s, "k"); r.State != record.InProgress {
			t.Errorf("state = %v, want InProgress", r.State)
		}
		giveUp(t, s, "settler/1")
		if got := deleteAll(t, s, retention, 10); len(got) != 0 {
			t.Errorf("DeleteExpired just after giving up = %v, want nothing", got)
		}
		clk.Add(keep + time.Microsecond)
		if diff := cmp.Diff([]int{1}, deleteAll(t, s, retention, 10)); diff != "" {
			t.Errorf("DeleteExpired a retention after giving up (-want +got):\n%s", diff)
		}
		if ts, err := s.Tombstone(ctx, "k"); err != nil || ts.State != record.OutcomeUnknown || !ts.GaveUp {
			t.Errorf("Tombstone = %+v, %v; want OutcomeUnknown, given up", ts, err)
		}
	})

	t.Run("TombstonesExpire", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		begin(t, s, claim("k", "body", "a"), record.Acquired)
		finish(t, s, "k", record.Outcome{Result: record.Paid})
		marked := clk.Set(t0.Add(keep + time.Microsecond))
		deleteAll(t, s, retention, 10)
		clk.Set(marked.Add(keepTombstones))
		if diff := cmp.Diff([]int{1}, deleteAll(t, s, retention, 10)); diff != "" { // the record
			t.Errorf("DeleteExpired at the end of tombstone retention (-want +got):\n%s", diff)
		}
		begin(t, s, claim("k", "body", "b"), record.Expired)
		now := clk.Set(marked.Add(keepTombstones + time.Microsecond))
		if diff := cmp.Diff([]int{1}, deleteAll(t, s, retention, 10)); diff != "" {
			t.Errorf("DeleteExpired past tombstone retention (-want +got):\n%s", diff)
		}
		if _, err := s.Tombstone(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Tombstone after it expired: error = %v, want ErrNotFound", err)
		}
		// The key is forgotten: it starts afresh, with any body.
		got := begin(t, s, claim("k", "another body", "b"), record.Acquired)
		if got.Record.PriorState != 0 || !got.Record.CreatedAt.Equal(us(now)) || got.Record.Requests != 0 {
			t.Errorf("Begin after the tombstone expired: PriorState %v CreatedAt %v Attempts %d, want a new record", got.Record.PriorState, got.Record.CreatedAt, got.Record.Requests)
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
		begin(t, s, claim("old", "body", "a"), record.Acquired)
		finish(t, s, "old", record.Outcome{Result: record.Paid})
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
		begin(t, s, claim("old", "body", "b"), record.Expired)
	})

	// A tombstone retention shorter than the grace period must not leave a
	// tombstoned record without its tombstone: until the record is
	// deleted, its key is still expired.
	t.Run("ShortTombstoneRetention", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		r := store.Retention{Records: keep, Tombstones: time.Minute}
		begin(t, s, claim("k", "body", "a"), record.Acquired)
		finish(t, s, "k", record.Outcome{Result: record.Paid})
		marked := clk.Set(t0.Add(keep + time.Microsecond))
		deleteAll(t, s, r, 10)
		clk.Set(marked.Add(r.Tombstones + time.Second))
		deleteAll(t, s, r, 10)
		if got, err := s.Begin(ctx, claim("k", "body", "b"), nil); err != nil || got.Verdict != record.Expired {
			t.Errorf("Begin(key tombstoned %v ago, tombstones kept %v) = %v, %v; want Expired", r.Tombstones+time.Second, r.Tombstones, got.Verdict, err)
		}
		clk.Set(marked.Add(store.TombstoneGrace + r.Tombstones + time.Second))
		deleteAll(t, s, r, 10)
		begin(t, s, claim("k", "body", "b"), record.Acquired)
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
		outcomes := make([]*store.Began, n)
		var wg sync.WaitGroup
		errs := make(chan error, n+1)
		for i := range n {
			wg.Go(func() {
				b, err := s.Begin(ctx, claim(fmt.Sprintf("k%02d", i), "body", "b"), nil)
				if err != nil {
					errs <- err
				}
				outcomes[i] = b
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
		count := map[record.Verdict]int{}
		for i, o := range outcomes {
			count[o.Verdict]++
			k := fmt.Sprintf("k%02d", i)
			_, gerr := s.Get(ctx, k)
			_, terr := s.Tombstone(ctx, k)
			switch o.Verdict {
			case record.Acquired:
				if gerr != nil || !errors.Is(terr, store.ErrNotFound) {
					t.Errorf("%s acquired: Get error %v, Tombstone error %v; want the record and no tombstone", k, gerr, terr)
				}
				finishAs(t, s, o.Record, record.Outcome{Owner: "b", Result: record.Paid}, record.Written)
			case record.Expired:
				if !errors.Is(gerr, store.ErrNotFound) || terr != nil {
					t.Errorf("%s expired: Get error %v, Tombstone error %v; want no record and a tombstone", k, gerr, terr)
				}
			default:
				t.Errorf("Begin(%s) = %v, want Acquired or Expired", k, o.Verdict)
			}
		}
		t.Logf("outcomes: %v", count)
	})
}

// resultOf is the result of an attempt that leaves a fresh record in
// state st.
func resultOf(st record.State) record.Result {
	switch st {
	case record.Succeeded:
		return record.Paid
	case record.NotCreated:
		return record.Refused
	}
	return record.Unknown
}
