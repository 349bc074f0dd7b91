package record

import (
	"bytes"
	"fmt"
	"testing"
	"time"
)

// Table tests of each path through Step, Tell, TellFrom and MayTakeOver.
// The checker (check_test.go) drives the same functions through every
// fault schedule; these say what each transition is, one at a time.

var (
	t0      = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	body    = []byte(`{"amount":100}`)
	bodySum = [32]byte{1}
	lease   = 30 * time.Second
	quiet   = 30 * time.Second
	window  = 10 * time.Minute
)

func at(d time.Duration) time.Time { return t0.Add(d) }

// held is a record InProgress under owner, claimed at t0 by a call.
func held(owner string, prior State) *Record {
	return &Record{
		Key: "k", Body: body, BodySHA256: bodySum, State: InProgress, Caller: "alice",
		CreatedAt: t0, UpdatedAt: t0, SettleBy: at(window),
		LeaseOwner: owner, LeaseExpiresAt: at(lease), QuietUntil: at(lease + quiet),
		PriorState: prior, AttemptSeq: 1, AttemptKind: ByCall, AttemptRequestID: "r1", AttemptStartedAt: t0,
	}
}

// ended is a record no one holds, in state st, last changed at t0.
func ended(st State, prior State) *Record {
	r := held("", prior)
	r.State, r.LeaseOwner, r.LeaseExpiresAt, r.QuietUntil = st, "", time.Time{}, time.Time{}
	return r
}

func with(r *Record, f func(*Record)) *Record {
	f(r)
	return r
}

func claimBy(owner string) Claim {
	return Claim{
		Request: Request{Key: "k", Body: body, BodySHA256: bodySum, RequestID: "r2", Caller: "alice"},
		Owner:   owner, LeaseTTL: lease, Window: window, Quiet: quiet, Settled: true,
	}
}

func claimWith(owner string, f func(*Claim)) Claim {
	c := claimBy(owner)
	f(&c)
	return c
}

func settleBy(owner string) Settle {
	return Settle{Owner: owner, LeaseTTL: lease, Quiet: quiet, Settled: true}
}

func settleWith(owner string, f func(*Settle)) Settle {
	s := settleBy(owner)
	f(&s)
	return s
}

// describe names an event for a failure message.
func describeEvent(ev Event) string {
	switch ev := ev.(type) {
	case Claim:
		return fmt.Sprintf("Claim{Owner: %q, Settled: %v, Pending: %v}", ev.Owner, ev.Settled, ev.Pending)
	case Settle:
		return fmt.Sprintf("Settle{Owner: %q, Settled: %v, Pending: %v}", ev.Owner, ev.Settled, ev.Pending)
	case Outcome:
		return fmt.Sprintf("Outcome{Owner: %q, Result: %v, Row: %v}", ev.Owner, ev.Result, ev.Row != nil)
	case Resolve:
		return fmt.Sprintf("Resolve{To: %v}", ev.To)
	}
	return "?"
}

type transition struct {
	name    string
	rec     *Record
	ev      Event
	now     time.Time
	verdict Verdict
	write   Write
	// state, if set, is the record's state after.
	state State
	// check, if set, checks more of what Step returned.
	check func(t *testing.T, n Record, eff Effect)
}

func runTransitions(t *testing.T, cases []transition) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var before Record
			if tc.rec != nil {
				before = *tc.rec
			}
			n, eff := Step(tc.rec, tc.ev, tc.now)
			ev := describeEvent(tc.ev)
			if eff.Verdict != tc.verdict {
				t.Errorf("Step(%s) verdict = %v, want %v", ev, eff.Verdict, tc.verdict)
			}
			if eff.Write != tc.write {
				t.Errorf("Step(%s) write = %v, want %v", ev, eff.Write, tc.write)
			}
			if tc.state != 0 && n.State != tc.state {
				t.Errorf("Step(%s) state = %v, want %v", ev, n.State, tc.state)
			}
			if tc.rec != nil && (tc.rec.State != before.State || tc.rec.LeaseOwner != before.LeaseOwner || tc.rec.AttemptSeq != before.AttemptSeq) {
				t.Errorf("Step(%s) changed the record it was given", ev)
			}
			if eff.Write == WriteNone && eff.Verdict != NotOwned && tc.rec != nil && (n.State != tc.rec.State || n.LeaseOwner != tc.rec.LeaseOwner || !n.UpdatedAt.Equal(tc.rec.UpdatedAt)) {
				t.Errorf("Step(%s) with no write returned a changed record", ev)
			}
			if tc.check != nil {
				tc.check(t, n, eff)
			}
		})
	}
}

func TestStepClaim(t *testing.T) {
	runTransitions(t, []transition{
		{name: "new key inserted", rec: nil, ev: claimBy("a/1"), now: t0, verdict: Acquired, write: WriteInsert, state: InProgress,
			check: func(t *testing.T, n Record, _ Effect) {
				if n.LeaseOwner != "a/1" || !n.LeaseExpiresAt.Equal(at(lease)) || !n.QuietUntil.Equal(at(lease+quiet)) || !n.SettleBy.Equal(at(window)) {
					t.Errorf("Step(Claim) of a new key = owner %q, lease %v, quiet %v, settle by %v; want a/1, t0+lease, t0+lease+quiet, t0+window",
						n.LeaseOwner, n.LeaseExpiresAt, n.QuietUntil, n.SettleBy)
				}
				if n.AttemptSeq != 1 || n.AttemptKind != ByCall || !n.Fresh() {
					t.Errorf("Step(Claim) of a new key: attempt %d %v fresh %v, want 1 call fresh", n.AttemptSeq, n.AttemptKind, n.Fresh())
				}
			}},
		{name: "after its caller left", rec: nil, ev: claimWith("a/1", func(c *Claim) { c.AnswerBy = t0 }), now: t0, verdict: Left, write: WriteNone},
		{name: "after its caller left, an existing record", rec: ended(NotCreated, 0), ev: claimWith("a/1", func(c *Claim) { c.AnswerBy = at(-time.Second) }),
			now: t0, verdict: Left, write: WriteNone},
		{name: "before its caller leaves", rec: nil, ev: claimWith("a/1", func(c *Claim) { c.AnswerBy = at(time.Second) }), now: t0, verdict: Acquired, write: WriteInsert},
		{name: "another caller's key", rec: ended(Succeeded, 0), ev: claimWith("a/1", func(c *Claim) { c.OwnKeysOnly, c.Caller = true, "bob" }),
			now: t0, verdict: NotOwned, write: WriteNone,
			check: func(t *testing.T, n Record, _ Effect) {
				if n.Key != "" || n.Reply != nil {
					t.Errorf("Step(Claim) of another caller's key returned its record")
				}
			}},
		{name: "tombstoned", rec: with(ended(Succeeded, 0), func(r *Record) { r.TombstonedAt = t0 }), ev: claimBy("a/1"), now: at(time.Hour), verdict: Expired, write: WriteNone},
		{name: "another request", rec: ended(Succeeded, 0), ev: claimWith("a/1", func(c *Claim) { c.BodySHA256 = [32]byte{2} }), now: t0, verdict: Reused, write: WriteNone},
		{name: "succeeded", rec: ended(Succeeded, 0), ev: claimBy("a/1"), now: t0, verdict: Replay, write: WriteNone},
		{name: "own outbox holds an outcome", rec: ended(OutcomeUnknown, 0), ev: claimWith("a/1", func(c *Claim) { c.Pending = true }), now: at(time.Hour), verdict: Busy, write: WriteNone},
		{name: "held", rec: held("b/1", 0), ev: claimBy("a/1"), now: at(lease - time.Microsecond), verdict: Busy, write: WriteNone},
		{name: "expired, held by its own process", rec: held("a/7", 0), ev: claimBy("a/1"), now: at(time.Hour), verdict: Busy, write: WriteNone},
		{name: "expired, claimant not settled", rec: held("b/1", 0), ev: claimWith("a/1", func(c *Claim) { c.Settled = false }), now: at(time.Hour), verdict: Busy, write: WriteNone},
		{name: "expired, still quiet", rec: held("b/1", 0), ev: claimBy("a/1"), now: at(lease), verdict: Quiet, write: WriteNone},
		{name: "expired, taken over", rec: held("b/1", 0), ev: claimBy("a/1"), now: at(lease + quiet), verdict: Acquired, write: WriteTakeOver, state: InProgress,
			check: func(t *testing.T, n Record, eff Effect) {
				if eff.Ended == nil || !eff.Ended.Abandoned || eff.Ended.Owner != "b/1" || eff.Ended.State != OutcomeUnknown {
					t.Errorf("Step(Claim) takeover ended = %+v, want b/1's attempt abandoned, unknown", eff.Ended)
				}
				if n.PriorState != InProgress || n.Fresh() || n.AttemptSeq != 2 || n.LeaseOwner != "a/1" {
					t.Errorf("Step(Claim) takeover: prior %v, attempt %d, owner %q; want in_progress (not fresh), 2, a/1", n.PriorState, n.AttemptSeq, n.LeaseOwner)
				}
			}},
		{name: "expired, past the window", rec: held("b/1", 0), ev: claimBy("a/1"), now: at(window), verdict: PastWindow, write: WriteAbandon, state: OutcomeUnknown,
			check: func(t *testing.T, n Record, eff Effect) {
				if eff.Ended == nil || !eff.Ended.Abandoned || n.LeaseOwner != "" || n.QuietUntil != at(lease+quiet) {
					t.Errorf("Step(Claim) past the window: ended %+v, owner %q, quiet until %v; want b/1 abandoned, no owner, quiet kept", eff.Ended, n.LeaseOwner, n.QuietUntil)
				}
			}},
		{name: "unknown, past the window", rec: ended(OutcomeUnknown, 0), ev: claimBy("a/1"), now: at(window), verdict: PastWindow, write: WriteNone},
		{name: "unknown, window closes before a send could end", rec: ended(OutcomeUnknown, 0), ev: claimWith("a/1", func(c *Claim) { c.MinSend = time.Minute }),
			now: at(window - time.Minute), verdict: PastWindow, write: WriteNone},
		{name: "unknown, quiet", rec: with(ended(OutcomeUnknown, 0), func(r *Record) { r.QuietUntil = at(time.Minute) }), ev: claimBy("a/1"),
			now: at(time.Minute - time.Microsecond), verdict: Quiet, write: WriteNone},
		{name: "unknown, acquired", rec: ended(OutcomeUnknown, 0), ev: claimBy("a/1"), now: at(time.Minute), verdict: Acquired, write: WriteAcquire, state: InProgress,
			check: func(t *testing.T, n Record, eff Effect) {
				if eff.Ended != nil || n.PriorState != OutcomeUnknown || n.Fresh() || !n.SettleBy.Equal(at(window)) {
					t.Errorf("Step(Claim) of an unknown record: ended %v, prior %v, settle by %v; want none, outcome_unknown, the window kept", eff.Ended, n.PriorState, n.SettleBy)
				}
			}},
		{name: "not created, a fresh start", rec: with(ended(NotCreated, 0), func(r *Record) { r.GaveUp = true }), ev: claimBy("a/1"), now: at(time.Hour),
			verdict: Acquired, write: WriteAcquire, state: InProgress,
			check: func(t *testing.T, n Record, _ Effect) {
				if !n.Fresh() || n.GaveUp || !n.SettleBy.Equal(at(time.Hour+window)) {
					t.Errorf("Step(Claim) of a not-created record: fresh %v, gave up %v, settle by %v; want fresh, not given up, a new window", n.Fresh(), n.GaveUp, n.SettleBy)
				}
			}},
		{name: "not created by a person", rec: with(ended(NotCreated, OutcomeUnknown), func(r *Record) { r.ResolvedAt = at(time.Minute) }), ev: claimBy("a/1"),
			now: at(time.Hour), verdict: Acquired, write: WriteAcquire, state: InProgress,
			check: func(t *testing.T, n Record, _ Effect) {
				if n.Fresh() || n.PriorState != OutcomeUnknown {
					t.Errorf("Step(Claim) of a record a person resolved not created: prior %v, want outcome_unknown (a person's word is not the provider's)", n.PriorState)
				}
			}},
	})
}

func TestStepSettle(t *testing.T) {
	due := at(time.Minute)
	runTransitions(t, []transition{
		{name: "no record", rec: nil, ev: settleBy("a/1"), now: due, verdict: NotDue, write: WriteNone},
		{name: "tombstoned", rec: with(ended(OutcomeUnknown, 0), func(r *Record) { r.TombstonedAt = t0 }), ev: settleBy("a/1"), now: due, verdict: NotDue, write: WriteNone},
		{name: "own outbox holds an outcome", rec: ended(OutcomeUnknown, 0), ev: settleWith("a/1", func(s *Settle) { s.Pending = true }), now: due, verdict: NotDue, write: WriteNone},
		{name: "succeeded", rec: ended(Succeeded, 0), ev: settleBy("a/1"), now: due, verdict: NotDue, write: WriteNone},
		{name: "not created", rec: ended(NotCreated, 0), ev: settleBy("a/1"), now: due, verdict: NotDue, write: WriteNone},
		{name: "unknown, past the window", rec: ended(OutcomeUnknown, 0), ev: settleBy("a/1"), now: at(window), verdict: GaveUp, write: WriteGiveUp, state: OutcomeUnknown,
			check: func(t *testing.T, n Record, _ Effect) {
				if !n.GaveUp {
					t.Errorf("Step(Settle) past the window: gave up %v, want true", n.GaveUp)
				}
			}},
		{name: "unknown, given up before", rec: with(ended(OutcomeUnknown, 0), func(r *Record) { r.GaveUp = true }), ev: settleBy("a/1"), now: at(window), verdict: NotDue, write: WriteNone},
		{name: "unknown, not yet due", rec: with(ended(OutcomeUnknown, 0), func(r *Record) { r.NextSettleAt = due }), ev: settleBy("a/1"), now: due.Add(-time.Microsecond), verdict: NotDue, write: WriteNone},
		{name: "unknown, quiet", rec: with(ended(OutcomeUnknown, 0), func(r *Record) { r.QuietUntil = due }), ev: settleBy("a/1"), now: due.Add(-time.Microsecond), verdict: NotDue, write: WriteNone},
		{name: "unknown, too little window left", rec: ended(OutcomeUnknown, 0), ev: settleWith("a/1", func(s *Settle) { s.MinSend = time.Minute }), now: at(window - time.Minute), verdict: NotDue, write: WriteNone},
		{name: "unknown, re-sent", rec: ended(OutcomeUnknown, 0), ev: settleBy("a/1"), now: due, verdict: Acquired, write: WriteAcquire, state: InProgress,
			check: func(t *testing.T, n Record, _ Effect) {
				if n.AttemptKind != BySettlement || n.AttemptRequestID != "" || n.LeaseOwner != "a/1" {
					t.Errorf("Step(Settle) acquired: kind %v, request %q, owner %q; want settlement, none, a/1", n.AttemptKind, n.AttemptRequestID, n.LeaseOwner)
				}
			}},
		{name: "held", rec: held("b/1", 0), ev: settleBy("a/1"), now: at(lease - time.Microsecond), verdict: NotDue, write: WriteNone},
		{name: "expired, held by its own process", rec: held("a/7", 0), ev: settleBy("a/1"), now: at(time.Hour), verdict: NotDue, write: WriteNone},
		{name: "expired, not settled", rec: held("b/1", 0), ev: settleWith("a/1", func(s *Settle) { s.Settled = false }), now: at(time.Hour), verdict: NotDue, write: WriteNone},
		{name: "expired, past the window", rec: held("b/1", 0), ev: settleBy("a/1"), now: at(window), verdict: GaveUp, write: WriteAbandon, state: OutcomeUnknown,
			check: func(t *testing.T, n Record, eff Effect) {
				if !n.GaveUp || eff.Ended == nil || !eff.Ended.Abandoned {
					t.Errorf("Step(Settle) of an expired record past the window: gave up %v, ended %+v; want given up, b/1 abandoned", n.GaveUp, eff.Ended)
				}
			}},
		{name: "expired, quiet", rec: held("b/1", 0), ev: settleBy("a/1"), now: at(lease), verdict: NotDue, write: WriteNone},
		{name: "expired, too little window left", rec: held("b/1", 0), ev: settleWith("a/1", func(s *Settle) { s.MinSend = window }), now: at(lease + quiet), verdict: NotDue, write: WriteNone},
		{name: "expired, taken over", rec: held("b/1", 0), ev: settleBy("a/1"), now: at(lease + quiet), verdict: Acquired, write: WriteTakeOver, state: InProgress,
			check: func(t *testing.T, n Record, eff Effect) {
				if eff.Ended == nil || eff.Ended.Owner != "b/1" || n.AttemptKind != BySettlement {
					t.Errorf("Step(Settle) takeover: ended %+v, kind %v; want b/1's attempt, settlement", eff.Ended, n.AttemptKind)
				}
			}},
	})
}

func TestStepOutcome(t *testing.T) {
	now := at(10 * time.Second)
	out := func(owner string, r Result, f func(*Outcome)) Outcome {
		o := Outcome{Owner: owner, Result: r, HTTPRequests: 1, SettleAfter: time.Second}
		if r == Paid {
			o.ProviderStatus, o.Reply = 201, []byte(`{"id":"pay_1"}`)
		}
		if f != nil {
			f(&o)
		}
		return o
	}
	row := func(abandoned bool) func(*Outcome) {
		return func(o *Outcome) { o.Row = &Attempt{Number: 1, Owner: o.Owner, Abandoned: abandoned} }
	}
	runTransitions(t, []transition{
		{name: "no record", rec: nil, ev: out("a/1", Paid, nil), now: now, verdict: LeaseLost, write: WriteNone},
		{name: "paid", rec: held("a/1", 0), ev: out("a/1", Paid, nil), now: now, verdict: Written, write: WriteFinish, state: Succeeded,
			check: func(t *testing.T, n Record, eff Effect) {
				if n.LeaseOwner != "" || !bytes.Equal(n.Reply, []byte(`{"id":"pay_1"}`)) || n.Requests != 1 || eff.Ended == nil || eff.Ended.State != Succeeded {
					t.Errorf("Step(Outcome) paid: owner %q, reply %s, attempts %d, ended %+v", n.LeaseOwner, n.Reply, n.Requests, eff.Ended)
				}
			}},
		{name: "refused, fresh", rec: held("a/1", 0), ev: out("a/1", Refused, nil), now: now, verdict: Written, write: WriteFinish, state: NotCreated},
		{name: "refused after an attempt that may have created it", rec: held("a/1", OutcomeUnknown), ev: out("a/1", Refused, nil), now: now,
			verdict: Written, write: WriteFinish, state: OutcomeUnknown,
			check: func(t *testing.T, n Record, _ Effect) {
				if !n.NextSettleAt.Equal(now.Add(time.Second)) {
					t.Errorf("Step(Outcome) refused, not fresh: next settle %v, want now+1s", n.NextSettleAt)
				}
			}},
		{name: "unknown", rec: held("a/1", 0), ev: out("a/1", Unknown, func(o *Outcome) { o.QuietFor = 20 * time.Second }), now: now,
			verdict: Written, write: WriteFinish, state: OutcomeUnknown,
			check: func(t *testing.T, n Record, _ Effect) {
				if !n.QuietUntil.Equal(now.Add(20*time.Second)) || !n.NextSettleAt.Equal(now.Add(time.Second)) {
					t.Errorf("Step(Outcome) unknown: quiet until %v, next settle %v; want now+20s, now+1s", n.QuietUntil, n.NextSettleAt)
				}
			}},
		{name: "nothing sent, fresh", rec: held("a/1", 0), ev: out("a/1", NothingSent, func(o *Outcome) { o.HTTPRequests = 0 }), now: now,
			verdict: Written, write: WriteFinish, state: NotCreated,
			check: func(t *testing.T, n Record, eff Effect) {
				if eff.Ended != nil || n.AttemptSeq != 0 || n.QuietUntil != (time.Time{}) {
					t.Errorf("Step(Outcome) nothing sent: ended %+v, attempt %d, quiet until %v; want no row, 0, none", eff.Ended, n.AttemptSeq, n.QuietUntil)
				}
			}},
		{name: "nothing sent after an attempt that may have created it", rec: held("a/1", InProgress), ev: out("a/1", NothingSent, func(o *Outcome) { o.HTTPRequests = 0 }),
			now: now, verdict: Written, write: WriteFinish, state: OutcomeUnknown},
		{name: "a repeat after an unknown commit", rec: ended(Succeeded, 0), ev: out("a/1", Paid, row(false)), now: now, verdict: Written, write: WriteNone, state: Succeeded},
		{name: "not a 2xx, lease lost", rec: held("b/1", 0), ev: out("a/1", Unknown, row(true)), now: now, verdict: LeaseLost, write: WriteNone},
		{name: "a 2xx that left no trace", rec: ended(OutcomeUnknown, 0), ev: out("a/1", Paid, nil), now: now, verdict: LeaseLost, write: WriteNone},
		{name: "a 2xx on a tombstone", rec: with(ended(OutcomeUnknown, 0), func(r *Record) { r.TombstonedAt = t0 }), ev: out("a/1", Paid, row(true)), now: now,
			verdict: LeaseLost, write: WriteNone},
		{name: "a late 2xx", rec: ended(OutcomeUnknown, 0), ev: out("a/1", Paid, row(true)), now: now, verdict: Late, write: WriteLate, state: Succeeded,
			check: func(t *testing.T, n Record, eff Effect) {
				if eff.Rewritten == nil || eff.Rewritten.Abandoned || eff.Rewritten.State != Succeeded || eff.Ended != nil {
					t.Errorf("Step(Outcome) late: rewritten %+v, ended %+v; want a1's row succeeded, none ended", eff.Rewritten, eff.Ended)
				}
			}},
		{name: "a late 2xx while another holds it", rec: held("b/1", OutcomeUnknown), ev: out("a/1", Paid, row(true)), now: now, verdict: Late, write: WriteLate, state: Succeeded,
			check: func(t *testing.T, n Record, eff Effect) {
				if eff.Ended == nil || eff.Ended.Owner != "b/1" || !eff.Ended.Abandoned || n.LeaseOwner != "" {
					t.Errorf("Step(Outcome) late over a holder: ended %+v, owner %q; want b/1's attempt abandoned, no owner", eff.Ended, n.LeaseOwner)
				}
			}},
		{name: "a late 2xx on a succeeded record", rec: with(ended(Succeeded, 0), func(r *Record) { r.Reply = []byte(`{"id":"pay_0"}`) }), ev: out("a/1", Paid, row(true)), now: now,
			verdict: Late, write: WriteLate, state: Succeeded,
			check: func(t *testing.T, n Record, _ Effect) {
				if !bytes.Equal(n.Reply, []byte(`{"id":"pay_0"}`)) {
					t.Errorf("Step(Outcome) late on a succeeded record: reply %s, want the first", n.Reply)
				}
			}},
	})
}

func TestStepResolve(t *testing.T) {
	now := at(time.Hour)
	runTransitions(t, []transition{
		{name: "no record", rec: nil, ev: Resolve{To: NotCreated}, now: now, verdict: NoRecord, write: WriteNone},
		{name: "tombstoned", rec: with(ended(OutcomeUnknown, 0), func(r *Record) { r.TombstonedAt = t0 }), ev: Resolve{To: NotCreated}, now: now, verdict: NoRecord, write: WriteNone},
		{name: "in flight", rec: held("a/1", 0), ev: Resolve{To: NotCreated}, now: now, verdict: InFlight, write: WriteNone},
		{name: "succeeded", rec: ended(Succeeded, 0), ev: Resolve{To: NotCreated}, now: now, verdict: NotUnknown, write: WriteNone},
		{name: "not created", rec: ended(NotCreated, 0), ev: Resolve{To: Succeeded}, now: now, verdict: NotUnknown, write: WriteNone},
		{name: "quiet", rec: with(ended(OutcomeUnknown, 0), func(r *Record) { r.QuietUntil = now.Add(time.Second) }), ev: Resolve{To: NotCreated}, now: now, verdict: InFlight, write: WriteNone},
		{name: "changed since the person looked", rec: ended(OutcomeUnknown, 0), ev: Resolve{To: NotCreated, UnchangedSince: at(-time.Second)}, now: now, verdict: Changed, write: WriteNone},
		{name: "not created", rec: with(ended(OutcomeUnknown, 0), func(r *Record) { r.GaveUp = true }), ev: Resolve{To: NotCreated, UnchangedSince: t0}, now: now,
			verdict: Resolved, write: WriteResolve, state: NotCreated,
			check: func(t *testing.T, n Record, _ Effect) {
				if !n.Resolved() || n.GaveUp {
					t.Errorf("Step(Resolve) not created: resolved %v, gave up %v; want resolved, not given up", n.Resolved(), n.GaveUp)
				}
			}},
		{name: "succeeded with the payment", rec: ended(OutcomeUnknown, 0), ev: Resolve{To: Succeeded, Reply: []byte(`{"id":"pay_9"}`)}, now: now,
			verdict: Resolved, write: WriteResolve, state: Succeeded,
			check: func(t *testing.T, n Record, _ Effect) {
				if !bytes.Equal(n.Reply, []byte(`{"id":"pay_9"}`)) || n.ProviderStatus != 0 {
					t.Errorf("Step(Resolve) succeeded: reply %s, status %d; want the person's reply, 0", n.Reply, n.ProviderStatus)
				}
			}},
	})
}

func TestStepResolveRefusesOtherStates(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Errorf("Step(Resolve{To: OutcomeUnknown}) did not panic")
		}
	}()
	Step(ended(OutcomeUnknown, 0), Resolve{To: OutcomeUnknown}, t0)
}

func TestTell(t *testing.T) {
	acquired := func(r Result, f func(*Call)) Call {
		c := Call{Claim: ClaimAcquired, Fresh: true, Sent: true, Result: r}
		if f != nil {
			f(&c)
		}
		return c
	}
	for _, tc := range []struct {
		name string
		call Call
		want Told
	}{
		{"queued, waiting", Call{Claim: ClaimQueued}, Wait},
		{"queued at the deadline", Call{Claim: ClaimQueued, SawMaybe: true, Due: true}, TellNotSent},
		{"running, waiting", Call{Claim: ClaimRunning, SawMaybe: true}, Wait},
		{"running at the deadline, read a record that may hold a payment", Call{Claim: ClaimRunning, SawMaybe: true, Due: true}, TellUnknown},
		{"running at the deadline", Call{Claim: ClaimRunning, Due: true}, TellNotSent},
		{"failed", Call{Claim: ClaimFailed}, TellNotSent},
		{"failed, read a record that may hold a payment", Call{Claim: ClaimFailed, SawMaybe: true}, TellUnknown},
		{"commit unknown", Call{Claim: ClaimUnknown}, TellNotSent},
		{"commit unknown, read a record that may hold a payment", Call{Claim: ClaimUnknown, SawMaybe: true}, TellUnknown},
		{"acquired, at the provider", Call{Claim: ClaimAcquired}, Wait},
		{"acquired, at the provider at the deadline", Call{Claim: ClaimAcquired, Due: true}, TellInProgress},
		{"paid, committed", acquired(Paid, func(c *Call) { c.Written = true }), TellPaid},
		{"paid, committing", acquired(Paid, nil), Wait},
		{"paid, committing at the deadline", acquired(Paid, func(c *Call) { c.Due = true }), TellUnknown},
		{"paid, lost", acquired(Paid, func(c *Call) { c.Lost = true }), TellUnknown},
		{"refused, committed", acquired(Refused, func(c *Call) { c.Written = true }), TellNotCreated},
		{"refused, not fresh", acquired(Refused, func(c *Call) { c.Written, c.Fresh = true, false }), TellUnknown},
		{"refused, committing", acquired(Refused, nil), Wait},
		{"refused, committing at the deadline", acquired(Refused, func(c *Call) { c.Due = true }), TellUnknown},
		{"refused, committing past patience", acquired(Refused, func(c *Call) { c.Patience = true }), TellUnknown},
		{"refused, lost", acquired(Refused, func(c *Call) { c.Lost = true }), TellUnknown},
		{"nothing sent, committed", acquired(NothingSent, func(c *Call) { c.Written = true }), TellNotCreated},
		{"nothing sent, not fresh", acquired(NothingSent, func(c *Call) { c.Fresh = false }), TellUnknown},
		{"unknown", acquired(Unknown, nil), TellUnknown},
		{"unknown, committed", acquired(Unknown, func(c *Call) { c.Written = true }), TellUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := Tell(tc.call); got != tc.want {
				t.Errorf("Tell(%+v) = %v, want %v", tc.call, got, tc.want)
			}
		})
	}
}

func TestTellFrom(t *testing.T) {
	for _, tc := range []struct {
		name string
		rec  *Record
		want Told
	}{
		{"succeeded", ended(Succeeded, 0), TellPaid},
		{"not created", ended(NotCreated, 0), Wait},
		{"not created by a person", with(ended(NotCreated, OutcomeUnknown), func(r *Record) { r.ResolvedAt = at(time.Minute) }), Wait},
		{"not created since a person's resolution", with(ended(NotCreated, OutcomeUnknown), func(r *Record) {
			r.ResolvedAt, r.AttemptStartedAt = at(time.Minute), at(time.Hour)
		}), Wait},
		{"unknown", ended(OutcomeUnknown, 0), TellUnknown},
		{"in progress", held("a/1", 0), Wait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := TellFrom(tc.rec); got != tc.want {
				t.Errorf("TellFrom(%v record) = %v, want %v", tc.rec.State, got, tc.want)
			}
		})
	}
}

func TestMayTakeOver(t *testing.T) {
	for _, tc := range []struct {
		name             string
		claimant, holder string
		settled, want    bool
	}{
		{"another process, settled", "a/1", "b/1", true, true},
		{"another process, not settled", "a/1", "b/1", false, false},
		{"its own process", "a/1", "a/2", true, false},
		{"a claimant with no process part", "c1", "a/1", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := MayTakeOver(tc.claimant, tc.holder, tc.settled); got != tc.want {
				t.Errorf("MayTakeOver(%q, %q, %v) = %v, want %v", tc.claimant, tc.holder, tc.settled, got, tc.want)
			}
		})
	}
}
