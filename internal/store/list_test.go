package store_test

import (
	"context"
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

// seedList writes n records one second apart (every fourth shares its
// predecessor's second), cycling through the states and three callers,
// and returns them as Get reads them.
func seedList(t *testing.T, s *store.Store, clk *clock, n int) []record.Record {
	t.Helper()
	var out []record.Record
	for i := range n {
		if i%4 != 3 {
			clk.Add(time.Second)
		}
		c := claim(fmt.Sprintf("list-%02d", i), fmt.Sprintf(`{"n":%d}`, i), fmt.Sprintf("o%d", i))
		c.Caller = fmt.Sprintf("spiffe://test/caller-%d", i%3)
		switch i % 4 {
		case 0:
			begin(t, s, c, record.Acquired)
			finish(t, s, c.Key, record.Outcome{Result: record.Paid, HTTPRequests: 1, ProviderStatus: 201, Reply: []byte(`{"id":"pay_` + c.Key + `","pad":"` + strings.Repeat("x", 1000) + `"}`)})
		case 1:
			makeUnknown(t, s, c, time.Minute)
		case 2:
			begin(t, s, c, record.Acquired)
			finish(t, s, c.Key, record.Outcome{Result: record.Refused, HTTPRequests: 1, ProviderStatus: 400, Reply: []byte(`{"error":"bad"}`), Error: "400"})
		case 3:
			begin(t, s, c, record.Acquired)
		}
	}
	for i := range n {
		out = append(out, get(t, s, fmt.Sprintf("list-%02d", i)))
	}
	return out
}

// listAll pages through q with q.Limit, and returns every record and the
// number of pages.
func listAll(t *testing.T, s *store.Store, q store.ListQuery) ([]record.Record, int) {
	t.Helper()
	var out []record.Record
	pages := 0
	for {
		p, err := s.ListRecords(context.Background(), q)
		if err != nil {
			t.Fatalf("ListRecords(%+v) error = %v", q, err)
		}
		pages++
		if len(p.Records) > q.Limit {
			t.Fatalf("ListRecords(limit %d) returned %d records", q.Limit, len(p.Records))
		}
		out = append(out, p.Records...)
		if !p.More {
			if p.Next == nil && len(p.Records) > 0 {
				t.Fatalf("ListRecords page of %d records has no Next", len(p.Records))
			}
			return out, pages
		}
		if len(p.Records) == 0 {
			t.Fatalf("ListRecords(%+v) returned an empty page with More", q)
		}
		q.After = p.Next
		if pages > 1000 {
			t.Fatal("ListRecords never ends")
		}
	}
}

func listKeys(rs []record.Record) []string {
	var ks []string
	for _, r := range rs {
		ks = append(ks, r.Key)
	}
	return ks
}

func testList(t *testing.T, fresh func(*testing.T) (*store.Store, *clock)) {
	ctx := context.Background()

	t.Run("ListFiltersAndPages", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		all := seedList(t, s, clk, 24)
		// Give up on the unknown records so far, then add two more that
		// have not.
		clk.Add(window + time.Second)
		giveUp(t, s, "settler/1")
		for i := range 2 {
			c := claim(fmt.Sprintf("late-%d", i), `{}`, "late")
			c.Caller = "spiffe://test/caller-0"
			makeUnknown(t, s, c, time.Minute)
			all = append(all, get(t, s, c.Key))
		}
		for i := range all {
			all[i] = get(t, s, all[i].Key)
		}

		// The whole list, in one page: it fixes the order (the tie-break
		// on keys is the backend's), which must follow CreatedAt.
		whole, _ := listAll(t, s, store.ListQuery{Limit: 1000})
		if len(whole) != len(all) {
			t.Fatalf("ListRecords(all) = %d records, want %d", len(whole), len(all))
		}
		for i := 1; i < len(whole); i++ {
			if whole[i].CreatedAt.Before(whole[i-1].CreatedAt) {
				t.Errorf("ListRecords(all)[%d] created %v before [%d]'s %v", i, whole[i].CreatedAt, i-1, whole[i-1].CreatedAt)
			}
		}
		for _, r := range whole {
			if r.Body != nil || r.Reply != nil {
				t.Errorf("ListRecords(%q) read Body %q, Reply %q; want neither", r.Key, r.Body, r.Reply)
			}
		}
		order := map[string]int{}
		for i, r := range whole {
			order[r.Key] = i
		}

		gaveUp, notGaveUp := true, false
		cases := []struct {
			name string
			q    store.ListQuery
			keep func(record.Record) bool
		}{
			{"all", store.ListQuery{}, func(record.Record) bool { return true }},
			{"unknown", store.ListQuery{States: []record.State{record.OutcomeUnknown}},
				func(r record.Record) bool { return r.State == record.OutcomeUnknown }},
			{"unknown or in progress", store.ListQuery{States: []record.State{record.OutcomeUnknown, record.InProgress}},
				func(r record.Record) bool {
					return r.State == record.OutcomeUnknown || r.State == record.InProgress
				}},
			{"caller", store.ListQuery{ByCaller: true, Caller: "spiffe://test/caller-1"},
				func(r record.Record) bool { return r.Caller == "spiffe://test/caller-1" }},
			{"caller and state", store.ListQuery{ByCaller: true, Caller: "spiffe://test/caller-0", States: []record.State{record.OutcomeUnknown}},
				func(r record.Record) bool {
					return r.Caller == "spiffe://test/caller-0" && r.State == record.OutcomeUnknown
				}},
			{"no caller", store.ListQuery{ByCaller: true, Caller: ""}, func(r record.Record) bool { return r.Caller == "" }},
			{"gave up", store.ListQuery{GaveUp: &gaveUp}, func(r record.Record) bool { return r.GaveUp }},
			{"not gave up, unknown", store.ListQuery{GaveUp: &notGaveUp, States: []record.State{record.OutcomeUnknown}},
				func(r record.Record) bool { return !r.GaveUp && r.State == record.OutcomeUnknown }},
			{"time range", store.ListQuery{CreatedAfter: all[4].CreatedAt, CreatedBefore: all[10].CreatedAt},
				func(r record.Record) bool {
					return !r.CreatedAt.Before(all[4].CreatedAt) && r.CreatedAt.Before(all[10].CreatedAt)
				}},
		}
		for _, tc := range cases {
			var want []string
			for _, r := range whole {
				if tc.keep(r) {
					want = append(want, r.Key)
				}
			}
			for _, limit := range []int{1, 3, 1000} {
				q := tc.q
				q.Limit = limit
				got, pages := listAll(t, s, q)
				if diff := cmp.Diff(want, listKeys(got)); diff != "" {
					t.Errorf("%s, limit %d: ListRecords keys (-want +got):\n%s", tc.name, limit, diff)
				}
				if limit == 1 && len(want) > 0 && pages < len(want) {
					t.Errorf("%s: %d pages of 1 for %d records", tc.name, pages, len(want))
				}
			}
		}
		if n := len(cases); n == 0 {
			t.Fatal("no cases")
		}
		// A listed record is the record as Get reads it (but for its
		// body, and its reply without WithReply).
		p, err := s.ListRecords(ctx, store.ListQuery{Limit: 1000, WithReply: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range p.Records {
			g := get(t, s, r.Key)
			g.Body = nil
			if diff := cmp.Diff(g, r, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".ReadAt" }, cmp.Ignore())); diff != "" {
				t.Errorf("ListRecords(%q) (-Get +List):\n%s", r.Key, diff)
			}
		}
	})

	t.Run("ListByteBound", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		seedList(t, s, clk, 16)
		succeeded := []record.State{record.Succeeded}
		// Each succeeded record's reply is over 1000 bytes: a 2500-byte
		// page holds two of them with their replies, and all four
		// without.
		p, err := s.ListRecords(ctx, store.ListQuery{States: succeeded, Limit: 100, MaxBytes: 2500, WithReply: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Records) != 2 || !p.More {
			t.Errorf("ListRecords(2500 bytes, with replies) = %d records, More %v; want 2, true", len(p.Records), p.More)
		}
		for _, r := range p.Records {
			if !strings.Contains(string(r.Reply), "pay_"+r.Key) {
				t.Errorf("ListRecords(with replies) %q reply = %.40q", r.Key, r.Reply)
			}
		}
		got, pages := listAll(t, s, store.ListQuery{States: succeeded, Limit: 100, MaxBytes: 2500, WithReply: true})
		if len(got) != 4 || pages != 2 {
			t.Errorf("paging by 2500 bytes: %d records in %d pages, want 4 in 2", len(got), pages)
		}
		p, err = s.ListRecords(ctx, store.ListQuery{States: succeeded, Limit: 100, MaxBytes: 2500})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Records) != 4 || p.More {
			t.Errorf("ListRecords(2500 bytes, no replies) = %d records, More %v; want 4, false", len(p.Records), p.More)
		}
		// A page holds its first record whatever its size.
		p, err = s.ListRecords(ctx, store.ListQuery{States: succeeded, Limit: 100, MaxBytes: 1, WithReply: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Records) != 1 || !p.More {
			t.Errorf("ListRecords(1 byte) = %d records, More %v; want 1, true", len(p.Records), p.More)
		}
	})

	t.Run("ListSkipsTombstoned", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		seedList(t, s, clk, 4)
		clk.Add(keep + time.Hour)
		deleteAll(t, s, store.Retention{Records: keep, Tombstones: keepTombstones}, 100)
		got, _ := listAll(t, s, store.ListQuery{Limit: 10})
		// The in-progress record is never expired; the rest are gone or
		// tombstoned.
		if diff := cmp.Diff([]string{"list-03"}, listKeys(got)); diff != "" {
			t.Errorf("ListRecords after retention (-want +got):\n%s", diff)
		}
	})
}

func testResolve(t *testing.T, fresh func(*testing.T) (*store.Store, *clock)) {
	ctx := context.Background()
	audit := store.AuditInfo{Evidence: "dashboard shows pay_1\nsettled", Actor: "spiffe://test/oncall", RequestID: "req-resolve"}
	resolve := func(s *store.Store, key string, to record.State, reply []byte) (store.Resolved, error) {
		return s.Resolve(ctx, key, record.Resolve{To: to, Reply: reply}, audit)
	}

	t.Run("ResolveSucceeded", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		c := claim("r1", `{"amount":1}`, "a")
		makeUnknown(t, s, c, time.Minute)
		at := clk.Add(window + time.Second)
		giveUp(t, s, "settler/1")
		if st, _ := s.Stats(ctx); st.Unsettled != 1 {
			t.Fatalf("Stats().Unsettled = %d before resolving, want 1", st.Unsettled)
		}
		reply := []byte(`{"id":"pay_1","amount":12345678901234567890}`)
		got, err := resolve(s, c.Key, record.Succeeded, reply)
		if err != nil {
			t.Fatalf("Resolve(unknown, succeeded) error = %v", err)
		}
		want := store.AuditEntry{CreatedAt: us(at), Actor: "spiffe://test/oncall", From: record.OutcomeUnknown,
			To: record.Succeeded, Evidence: "dashboard shows pay_1\nsettled", RequestID: "req-resolve",
			ReplyRecorded: true, GaveUp: true}
		if diff := cmp.Diff(want, got.Entry); diff != "" {
			t.Errorf("Resolve entry (-want +got):\n%s", diff)
		}
		r := get(t, s, c.Key)
		if r.State != record.Succeeded || string(r.Reply) != string(reply) || r.ProviderStatus != 0 ||
			r.GaveUp || !r.ResolvedAt.Equal(us(at)) || r.LastError != "" {
			t.Errorf("record after Resolve = %+v", r)
		}
		if diff := cmp.Diff(r, readAt(got.Record, r.ReadAt)); diff != "" {
			t.Errorf("Resolve record (-Get +Resolve):\n%s", diff)
		}
		entries, err := s.AuditEntries(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]store.AuditEntry{want}, entries); diff != "" {
			t.Errorf("AuditEntries (-want +got):\n%s", diff)
		}
		if st, _ := s.Stats(ctx); st.Unsettled != 0 {
			t.Errorf("Stats().Unsettled = %d after resolving, want 0", st.Unsettled)
		}
		// Calls with the key replay the resolution.
		b := begin(t, s, c, record.Replay)
		if string(b.Record.Reply) != string(reply) {
			t.Errorf("Begin after Resolve replays %q, want %q", b.Record.Reply, reply)
		}
		// Nothing to resolve again.
		if _, err := resolve(s, c.Key, record.NotCreated, nil); !errors.Is(err, store.ErrNotUnknown) {
			t.Errorf("Resolve(resolved) error = %v, want ErrNotUnknown", err)
		}
		// The audit trail can't be rewritten.
		for _, q := range []string{`UPDATE audit_entries SET evidence = 'nothing'`, `DELETE FROM audit_entries`} {
			if err := store.Exec(ctx, s, q); err == nil {
				t.Errorf("%s: no error, want the append-only refusal", q)
			}
		}
		if n, _ := store.CountRows(ctx, s, "audit_entries"); n != 1 {
			t.Errorf("audit entries = %d, want 1", n)
		}
	})

	t.Run("ResolveNotCreatedInWindow", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		c := claim("r2", `{"amount":2}`, "a")
		makeUnknown(t, s, c, time.Minute)
		clk.Add(time.Second)
		got, err := resolve(s, c.Key, record.NotCreated, nil)
		if err != nil {
			t.Fatalf("Resolve(unknown, not created) error = %v", err)
		}
		if got.Record.State != record.NotCreated || got.Record.ProviderStatus != 503 || got.Entry.ReplyRecorded || got.Entry.GaveUp {
			t.Errorf("Resolve(not created) = %+v", got)
		}
		// Settlement leaves it alone, even once it is due.
		clk.Add(time.Hour)
		if due := claimDue(t, s, "settler", 0, 10); len(due) != 0 {
			t.Errorf("SettleDue after a resolution = %v, want none", keys(due))
		}
		// The next call makes a new attempt, with a new window; a person's
		// word is not the provider's, so the attempt does not start the
		// key afresh.
		b := begin(t, s, c, record.Acquired)
		if b.Record.PriorState != record.OutcomeUnknown || !b.Record.SettleBy.Equal(us(clk.Now().Add(window))) {
			t.Errorf("Begin after NOT_CREATED: PriorState %v, SettleBy %v; want OutcomeUnknown, a new window", b.Record.PriorState, b.Record.SettleBy)
		}
		if r := finish(t, s, c.Key, refused(400)); r.State != record.OutcomeUnknown {
			t.Errorf("a refusal after a NOT_CREATED resolution: %v, want OutcomeUnknown", r.State)
		}
	})

	t.Run("ResolveRefusals", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		if _, err := resolve(s, "missing", record.Succeeded, nil); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Resolve(missing) error = %v, want ErrNotFound", err)
		}
		busy := claim("busy", `{}`, "a")
		begin(t, s, busy, record.Acquired)
		if got, err := resolve(s, busy.Key, record.NotCreated, nil); !errors.Is(err, store.ErrInFlight) || got.Record.State != record.InProgress {
			t.Errorf("Resolve(in progress) = %v, %v; want ErrInFlight and the record", got.Record.State, err)
		}
		done := claim("done", `{}`, "a")
		begin(t, s, done, record.Acquired)
		finish(t, s, done.Key, record.Outcome{Result: record.Paid, ProviderStatus: 200, Reply: []byte(`{}`)})
		if got, err := resolve(s, done.Key, record.NotCreated, nil); !errors.Is(err, store.ErrNotUnknown) || got.Record.State != record.Succeeded {
			t.Errorf("Resolve(succeeded) = %v, %v; want ErrNotUnknown and the record", got.Record.State, err)
		}
		// An unknown record whose last request may still be at the
		// provider: refused until its quiet period ends.
		q := quiet(claim("quiet", `{}`, "a"), time.Minute)
		begin(t, s, q, record.Acquired)
		finish(t, s, q.Key, record.Outcome{Result: record.Unknown, QuietFor: time.Minute, SettleAfter: time.Minute})
		if _, err := resolve(s, q.Key, record.NotCreated, nil); !errors.Is(err, store.ErrInFlight) {
			t.Errorf("Resolve(unknown, quiet) error = %v, want ErrInFlight", err)
		}
		clk.Add(time.Minute)
		if _, err := resolve(s, q.Key, record.NotCreated, nil); err != nil {
			t.Errorf("Resolve(unknown, quiet period over) error = %v", err)
		}
		if n, _ := store.CountRows(ctx, s, "audit_entries"); n != 1 {
			t.Errorf("audit entries = %d, want 1: refusals write none", n)
		}
	})

	t.Run("ResolveRacesSettlement", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		const n = 20
		for i := range n {
			makeUnknown(t, s, claim(fmt.Sprintf("race-%d", i), `{}`, "a"), 0)
		}
		clk.Add(time.Second)
		var wg sync.WaitGroup
		resolved := make([]bool, n)
		var claimed []record.Record
		var mu sync.Mutex
		for i := range n {
			wg.Add(2)
			go func() {
				defer wg.Done()
				_, err := resolve(s, fmt.Sprintf("race-%d", i), record.NotCreated, nil)
				switch {
				case err == nil:
					resolved[i] = true
				case errors.Is(err, store.ErrInFlight):
				default:
					t.Errorf("Resolve(race-%d) error = %v", i, err)
				}
			}()
			go func() {
				defer wg.Done()
				if i%2 == 1 {
					// A caller's retry with the key races the resolution.
					b, err := s.Begin(ctx, claim(fmt.Sprintf("race-%d", i), `{}`, "a"), nil)
					if err != nil {
						t.Errorf("Begin error = %v", err)
					}
					if b.Verdict == record.Acquired {
						mu.Lock()
						claimed = append(claimed, b.Record)
						mu.Unlock()
					}
					return
				}
				rs, _, err := s.SettleDue(ctx, record.Settle{Owner: fmt.Sprintf("settler-%d/1", i), LeaseTTL: lease}, nil, 1)
				if err != nil {
					t.Errorf("SettleDue error = %v", err)
				}
				mu.Lock()
				claimed = append(claimed, rs...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		got := keys(claimed)
		prior := map[string]record.State{}
		for _, r := range claimed {
			prior[r.Key] = r.PriorState
		}
		for i := range n {
			k := fmt.Sprintf("race-%d", i)
			if i%2 == 1 {
				// The caller's call always goes ahead: before the
				// resolution (which is then refused), or after it, as a
				// new attempt on a NOT_CREATED record, which a person's
				// word does not start afresh.
				if got[k] != 1 || prior[k] != record.OutcomeUnknown {
					t.Errorf("%s: resolved %v, sent %d times after %v; want once, after OutcomeUnknown", k, resolved[i], got[k], prior[k])
				}
				continue
			}
			if resolved[i] == (got[k] == 1) {
				t.Errorf("%s: resolved %v, claimed by settlement %d times; want exactly one", k, resolved[i], got[k])
			}
			r := get(t, s, k)
			want := record.InProgress
			if resolved[i] {
				want = record.NotCreated
			}
			if r.State != want {
				t.Errorf("%s: state %v, want %v", k, r.State, want)
			}
		}
	})

	t.Run("NotOwned", func(t *testing.T) {
		t.Parallel()
		s, _ := fresh(t)
		c := claim("owned", `{"amount":1}`, "a")
		begin(t, s, c, record.Acquired)
		finish(t, s, c.Key, record.Outcome{Result: record.Paid, ProviderStatus: 200, Reply: []byte(`{}`)})
		other := claim("owned", `{"amount":2}`, "b")
		other.OwnKeysOnly = true
		b := begin(t, s, other, record.NotOwned)
		if diff := cmp.Diff(record.Record{}, b.Record); diff != "" {
			t.Errorf("Begin(not owned) leaks the record:\n%s", diff)
		}
		same := c
		same.OwnKeysOnly = true
		begin(t, s, same, record.Replay)
	})

	t.Run("NotOwnedTombstone", func(t *testing.T) {
		t.Parallel()
		s, clk := fresh(t)
		c := claim("gone", `{"amount":1}`, "a")
		begin(t, s, c, record.Acquired)
		finish(t, s, c.Key, record.Outcome{Result: record.Paid, ProviderStatus: 200, Reply: []byte(`{}`)})
		clk.Add(keep + time.Hour)
		deleteAll(t, s, store.Retention{Records: keep, Tombstones: keepTombstones}, 10)
		clk.Add(store.TombstoneGrace + time.Hour)
		deleteAll(t, s, store.Retention{Records: keep, Tombstones: keepTombstones}, 10)
		if _, err := s.Get(ctx, c.Key); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Get(deleted) error = %v", err)
		}
		other := claim("gone", `{"amount":1}`, "b")
		other.OwnKeysOnly = true
		if b := begin(t, s, other, record.NotOwned); b.Tombstone != (store.Tombstone{}) {
			t.Errorf("Begin(another's tombstone) leaks %+v", b.Tombstone)
		}
		same := c
		same.OwnKeysOnly = true
		if b := begin(t, s, same, record.Expired); b.Tombstone.Caller != c.Caller || !b.Tombstone.CallerKnown {
			t.Errorf("Begin(own tombstone) tombstone caller %q (known %v), want %q", b.Tombstone.Caller, b.Tombstone.CallerKnown, c.Caller)
		}
	})
}

// TestPostgresListSnapshot: a list page's queries on PostgreSQL run in
// one read-only REPEATABLE READ transaction, so that they see one
// snapshot (its readers are its writer's pool, which once made the page
// take the options of SQLite in memory: none), with the store's statement
// timeout, straight to the server and through PgBouncer in transaction
// mode (where the timeout is the transaction's to set: attack34b).
func TestPostgresListSnapshot(t *testing.T) {
	t.Parallel()
	direct := storetest.PostgresURL(t)
	bouncer := storetest.StartPgBouncer(t, direct, 2)
	for _, c := range []struct{ name, url string }{
		{"direct", direct},
		{"pgbouncer", bouncer.URL(storetest.PostgresURL(t))},
	} {
		s, err := store.Open(context.Background(), c.url, "sandbox", store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		isolation, readOnly, timeout, err := store.SnapshotSettings(context.Background(), s)
		if err != nil {
			t.Fatal(err)
		}
		if isolation != "repeatable read" || readOnly != "on" || timeout != "30s" {
			t.Errorf("%s: a list page's transaction: isolation %q, read only %q, statement timeout %q; want repeatable read, on, 30s", c.name, isolation, readOnly, timeout)
		}
	}
}
