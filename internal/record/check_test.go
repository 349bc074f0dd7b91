package record

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"
)

// The checker. It drives this package's rules (Step, Tell, TellFrom, and
// through Step MayTakeOver) through every schedule of a model of
// paymentsd up to a bound, and checks on every step:
//
//   - I1: a key whose 2xx any caller was told is never sent to the
//     provider again;
//   - I2: a caller told OK gets a record that ends SUCCEEDED with that
//     reply, whatever any person does later (checked when nothing more can
//     happen; a SUCCEEDED record with another reply at once); told
//     NOT_CREATED, the provider never created the payment;
//   - I3: at most one request per key is at the provider at a time;
//   - I4: no resolution is accepted that contradicts what a caller was
//     told.
//
// It also counts, as no violation, the sends of a key after the provider
// wrote a 2xx for it; and fails TestCheck if one of them was made by a
// process whose own outbox held that 2xx, not yet written (the Pending
// fact's promise).
//
// The model (check_model_test.go) makes every decision as the engine does,
// by calling the rules, and nothing else:
//
//   - Processes (replicas, 2). Each has an outbox, the requests it waits
//     on, and the calls it serves. A call claims its key (Claim, with the
//     facts Settled: its process's store writes have been healthy for the
//     takeover grace; Pending: its outbox holds an entry for the key;
//     AnswerBy: its caller's deadline), sends only on Acquired, and hands
//     the outcome to its outbox, which writes it (Outcome, with the store's
//     Row fact) until Written, Late or LeaseLost. The call answers its
//     caller as Tell says, when it says it (OK only once the 2xx is
//     committed; at the deadline what is known then); a Busy call waits
//     for the record to change and is answered as TellFrom says, or claims
//     again. A claim whose caller left before its commit was known is
//     released if it committed (Outcome{NothingSent}, through the outbox);
//     so is one whose commit's acknowledgement was lost. Settlement in
//     every process considers each record (Settle, Pending from its own
//     outbox) and sends on Acquired.
//   - The store holds the committed records and the journal rows Step's
//     effects write, applying Step for every write. Its clock is the
//     model's.
//   - The provider keeps, per key, the requests at it and whether the
//     payment exists. A request it answers creates the payment if there is
//     none (2xx); for a key it has created, it answers the first payment
//     again (reuseFirst) or 409, which proves nothing (reuse409); with
//     Refusals it may refuse a request before any work (401). It answers
//     every request within the quiet period from its start: the promise
//     QuietUntil relies on.
//   - One caller per key calls with a deadline and retries, with the same
//     key, after an unknown outcome, in progress or not sent, until told
//     OK or NOT_CREATED, or out of calls.
//   - A careless person resolves every key in doubt (OUTCOME_UNKNOWN, and
//     Step accepts it) as NOT_CREATED; in the patient bound the person may
//     instead resolve it SUCCEEDED with the payment as they found it (not
//     byte for byte the reply paymentsd received), and the caller's
//     deadline comes past the lease, the quiet period and the grace, so
//     that a 2xx can land late while its caller still waits (a call told
//     OK with a 2xx that landed late is told the record's reply, as the
//     engine reads it back).
//   - Time passes in ticks: a lease lasts 2, the quiet period 3 (counted
//     from a request's start), a caller's deadline comes 1 after its call,
//     the takeover grace is 1, settlement may re-send at once, and the
//     settlement window (60) outlasts every schedule unless a bound says
//     otherwise. A sender gives up its request when its lease ends. Time
//     does not pass while a request would outlive its quiet period, nor
//     while a process that saw no store fault this tick has an outbox
//     entry to write: a healthy outbox lands promptly, as the takeover
//     grace assumes (bound.SlowOutbox lifts this: a process may stall).
//
// Faults, each one of the bound's Faults: a store operation fails (nothing
// written), loses its acknowledgement (written, its author hears it
// failed), or hangs (it commits, as it then finds the record, or fails at
// a later step: it ran late, queued in a pooler, or its commit was stuck;
// only a live process commits it); a process crashes and
// restarts with a new name, its outbox, calls and waits lost, its
// requests left at the provider; the provider's reply is lost. A store
// fault, and a hang while it lasts, is an outage its process saw: its
// Settled fact is false for the grace after it. With Rollback, an
// asynchronous failover loses the commits the replica has not caught up
// with (a step of its own, not a fault, catches it up).
//
// The bound: replicas, keys, calls a caller makes, faults, and the number
// of steps (the depth: every step counts, a tick too). The search
// (check_explore_test.go) is breadth first and exhaustive up to the
// depth; it visits each state once, counting as one the states that
// differ only in which process or key is which, in when they happen, in
// the names of incarnations and claims, or in spent faults and calls (one
// that has spent less does all the other does and more)
// (check_symmetry_test.go); and it finds the shortest schedule to each
// violation. TestCheck runs the default bound (checkBounds: one key to
// depth 12, two keys to depth 12, in both provider modes: 370,000 states,
// half a minute of CPU under -race); PAYMENTS_CHECK_DEEP=1 runs a deeper
// one (7.4 million states, 3 minutes of CPU without -race, 1 GB).
//
// A bound's rules switch rules back to the ones they replaced, so that
// tests show what the checker finds with them (TestCheckFinds,
// TestCheckPendingFact).
//
// A schedule is printed a step a line, each step's name quoted: to replay
// one, copy the quoted names into checkReplays below, with the bound and
// rules it was found under and the invariant it breaks, and run
// go test -run 'TestCheckReplay/<name>' ./internal/record.

// checkTimes are the model's times, in ticks.
var checkTimes = times{Lease: 2, Quiet: 3, Grace: 1, Deadline: 1, SettleAfter: 0, Window: 60}

// checkBounds are the bounds TestCheck explores, in both provider modes:
// one key whose caller retries (3 calls), and two keys each called once,
// whose records share processes, their health, crashes and the faults;
// deep, further, with a process's outbox that may stall, and two keys
// whose callers retry.
func checkBounds(deep bool) []bound {
	oneKey := bound{Name: "one key", Replicas: 2, Keys: 1, Calls: 3, Faults: 3, Depth: 12, Refusals: true, Times: checkTimes}
	twoKeys := bound{Name: "two keys", Replicas: 2, Keys: 2, Calls: 1, Faults: 3, Depth: 12, Times: checkTimes}
	// A caller who waits past the lease, the quiet period and the grace
	// (a long deadline, or none), and a person who may also resolve a key
	// SUCCEEDED with the payment as they found it.
	patient := oneKey
	patient.Name, patient.PersonFinds = "one key, a patient caller, the person finds payments", true
	patient.Times.Deadline = 8
	if !deep {
		return []bound{oneKey, twoKeys, patient}
	}
	patient.Depth = 16
	oneKey.Depth, twoKeys.Depth = 18, 18
	stalls := oneKey
	stalls.Name, stalls.SlowOutbox, stalls.Depth = "one key, stalling outboxes", true, 16
	retries := twoKeys
	retries.Name, retries.Calls, retries.Depth = "two keys, retrying", 3, 9
	return []bound{oneKey, twoKeys, stalls, retries, patient}
}

func checkDeep() bool { return os.Getenv("PAYMENTS_CHECK_DEEP") == "1" }

func TestCheck(t *testing.T) {
	for _, b := range checkBounds(checkDeep()) {
		for _, mode := range []providerMode{reuseFirst, reuse409} {
			b := b
			b.Mode = mode
			t.Run(b.Name+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				rep := explore(&b, nil)
				t.Logf("%s: %v", b.summary(), rep)
				for _, f := range rep.findings {
					t.Errorf("%s: %s\n%s", f.violation, f.why, describe(&b, f.schedule))
				}
				if rep.ownPaid != 0 {
					t.Errorf("%d sends of a key whose 2xx the sender's own outbox held, want 0; the first:\n%s", rep.ownPaid, describe(&b, rep.ownPaidExample))
				}
				if rep.resentExample != nil {
					t.Logf("a send after a provider-written 2xx (no violation), the first of %d:\n%s", rep.resent, describe(&b, rep.resentExample))
				}
			})
		}
	}
}

// summary is b as a log line has it.
func (b bound) summary() string {
	s := fmt.Sprintf("%s: %d replicas, %d keys, %d calls, %d faults", b.Name, b.Replicas, b.Keys, b.Calls, b.Faults)
	if b.Off != 0 {
		s += fmt.Sprintf(" (no %v)", b.Off)
	}
	s += fmt.Sprintf(", depth %d, %v", b.Depth, b.Mode)
	if b.Refusals {
		s += ", refusals"
	}
	if b.Rollback {
		s += ", failovers lose commits"
	}
	if b.PersonFinds {
		s += ", the person finds payments"
	}
	if b.Times.Deadline != checkTimes.Deadline {
		s += fmt.Sprintf(", deadline %d", b.Times.Deadline)
	}
	if b.Times.Window != checkTimes.Window {
		s += fmt.Sprintf(", window %d", b.Times.Window)
	}
	if b.Rules != (rules{}) {
		s += fmt.Sprintf(", rules %+v", b.Rules)
	}
	return s
}

// checkFinding is a rule switched back to what it replaced, the bound the
// checker finds it broken in, and the invariant it breaks.
type checkFinding struct {
	name string
	b    bound
	want invariant
	// also, if set, says what more the schedule must show.
	also func(b *bound, schedule []act) bool
	why  string
}

func checkFindings() []checkFinding {
	base := bound{Replicas: 2, Keys: 1, Calls: 3, Faults: 3, Depth: 24, Times: checkTimes}
	with := func(name string, f func(*bound)) bound {
		b := base
		b.Name = name
		f(&b)
		return b
	}
	return []checkFinding{
		{
			name: "finding 3, the writer cut off alone",
			b:    with("finding 3, the writer cut off alone", func(b *bound) { b.Rules.OKAtDeadline = true }),
			want: "I1",
			why:  "a caller told OK at its deadline while the 2xx isn't committed, whose process's writes then hang, sees the key sent again by a replica that saw no outage",
		},
		{
			name: "finding 3, the replica dies",
			b: with("finding 3, the replica dies", func(b *bound) {
				b.Rules.OKAtDeadline = true
				b.Off = faultHang
				b.Mode = reuse409
				b.Times.Window = b.Times.Lease + b.Times.Quiet
			}),
			want: "I4",
			why:  "a caller told OK at its deadline while the 2xx isn't committed, whose process then dies, sees a person's NOT_CREATED resolution accepted",
		},
		{
			name: "finding 1, a failover loses commits",
			b: with("finding 1, a failover loses commits", func(b *bound) {
				b.Rollback = true
				b.Off, b.NoPerson, b.Calls = faultFail|faultAckLost|faultHang|faultCrash, true, 2
			}),
			want: "I1",
			also: fellBackToUnknown,
			why:  "a failover that loses commits takes a record told OK back to an earlier OUTCOME_UNKNOWN attempt, and settlement sends it again",
		},
		{
			name: "a claim runs after its caller left",
			b: with("a claim runs after its caller left", func(b *bound) {
				b.Rules.NoAnswerBy = true
				b.Refusals = true
				b.Off, b.NoPerson, b.Calls, b.Faults = faultFail|faultAckLost|faultLostReply, true, 2, 2
			}),
			want: "I2",
			why:  "a claim queued past its caller's deadline acquires the record the caller has since been told NOT_CREATED of, and settlement sends it once its process is cut off",
		},
		{
			name: "a wait answered from a person's resolution",
			b:    with("a wait answered from a person's resolution", func(b *bound) { b.Rules.AnswerResolved = true }),
			want: "I2",
			why:  "a call that waited on another claim is told NOT_CREATED from a person's resolution, and the provider had created the payment",
		},
		{
			name: "a late 2xx told with its own reply",
			b: with("a late 2xx told with its own reply", func(b *bound) {
				b.Rules.LateOwnReply = true
				b.PersonFinds, b.Mode = true, reuse409
				// A caller that waits past the lease, the quiet period and
				// the grace (a long deadline, or none).
				b.Times.Deadline = 8
				b.Off, b.Calls, b.Faults, b.Depth = faultAckLost|faultLostReply|faultCrash, 1, 1, 14
			}),
			want: "I2",
			why:  "a caller waiting for its 2xx's commit, which lands late on a record a person resolved SUCCEEDED meanwhile with the payment as found, is told OK with its own reply, not the record's",
		},
	}
}

func findingBound(t *testing.T, name string) bound {
	t.Helper()
	for _, f := range checkFindings() {
		if f.name == name {
			return f.b
		}
	}
	t.Fatalf("no finding %q", name)
	return bound{}
}

// TestCheckFinds shows, for each rule the checker proves, a schedule that
// breaks an invariant once the rule is switched back to what it replaced:
// each case fails if the checker finds none. The schedule is logged, and
// replayed.
func TestCheckFinds(t *testing.T) {
	for _, tc := range checkFindings() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := tc.b
			rep := explore(&b, func(f finding) bool {
				return f.violation == tc.want && (tc.also == nil || tc.also(&b, f.schedule))
			})
			if len(rep.findings) == 0 || rep.findings[0].violation != tc.want {
				t.Fatalf("%s: the checker found no %s violation (%v); it must: %s", b.summary(), tc.want, rep, tc.why)
			}
			f := rep.findings[0]
			t.Logf("%s: %v\n%s: %s\n%s", b.summary(), rep, f.violation, f.why, describe(&b, f.schedule))
			v, at, err := replay(&b, names(f.schedule))
			if err != nil || v != tc.want || at != len(f.schedule) && at != len(f.schedule)+1 {
				t.Errorf("replaying the schedule found = %s at step %d (%v), want %s at step %d", v, at, err, tc.want, len(f.schedule))
			}
		})
	}
}

// checkReplays are schedules the checker printed, to be replayed: in the
// bound of the finding named, each breaks the invariant want at its last
// step; and, if fixed, none with the rules as written (the steps that
// follow the fix's effect may then not be possible at all).
var checkReplays = []struct {
	finding string
	steps   []string
	want    invariant
	fixed   bool
}{
	{
		finding: "finding 3, the writer cut off alone",
		steps: []string{
			"caller k0 calls p1",
			"provider answers k0",
			"outbox p1 writes k0 (hangs)",
			"tick", // told OK at the deadline, the 2xx not committed
			"tick",
			"tick",
			"tick",
			"tick",
			"settlement p2 claims k0",
		},
		want:  "I1",
		fixed: true,
	},
	{
		finding: "finding 3, the replica dies",
		steps: []string{
			"caller k0 calls p1",
			"provider answers k0",
			"outbox p1 writes k0 (fails: nothing written)",
			"tick", // told OK at the deadline, the 2xx not committed
			"p1 crashes and restarts",
			"tick",
			"tick",
			"tick",
			"tick",
			"settlement p1 claims k0", // the window has closed: given up
			"person resolves k0 not_created",
		},
		want:  "I4",
		fixed: true,
	},
	{
		finding: "finding 1, a failover loses commits",
		steps: []string{
			"caller k0 calls p1",
			"tick",
			"tick", // the request cut off at its lease's end
			"provider answers k0",
			"outbox p1 writes k0", // OUTCOME_UNKNOWN
			"tick",
			"replica catches up",
			"caller k0 calls p1",
			"provider answers k0",
			"outbox p1 writes k0", // SUCCEEDED, the caller told OK
			"failover loses unreplicated commits",
			"settlement p1 claims k0",
		},
		want: "I1",
		// The rules as written need a store that loses no acknowledged
		// commit: the same schedule breaks I1 with them.
		fixed: false,
	},
	{
		finding: "a claim runs after its caller left",
		steps: []string{
			"caller k0 calls p1 (hangs)",
			"tick",
			"caller k0 calls p1",
			"provider refuses k0",
			"outbox p1 writes k0", // NOT_CREATED, and the caller told so
			"hung op #0 commits",  // the first call's claim acquires the key
			"tick",
			"outbox p1 writes k0 (hangs)", // its release
			"tick",
			"tick",
			"tick",
			"tick",
			"settlement p2 claims k0",
			"provider answers k0",
		},
		want:  "I2",
		fixed: true,
	},
	{
		finding: "a wait answered from a person's resolution",
		steps: []string{
			"caller k0 calls p1",
			"tick",
			"tick",
			"provider answers k0",
			"outbox p1 writes k0 (commits, acknowledgement lost)",
			"tick",
			"caller k0 calls p1", // busy: p1's outbox holds the outcome
			"outbox p1 writes k0",
			"person resolves k0 not_created",
			"caller k0 rereads",
		},
		want:  "I2",
		fixed: true,
	},
	{
		finding: "a late 2xx told with its own reply",
		steps: []string{
			"caller k0 calls p1",
			"tick",
			"provider answers k0",
			"outbox p1 writes k0 (hangs)", // the caller waits on
			"tick",
			"tick",
			"tick",
			"tick",
			"settlement p2 claims k0", // the lease and quiet period over
			"provider answers k0",     // 409
			"outbox p2 writes k0",
			"person resolves k0 succeeded",
			"hung op #0 commits", // late: the record keeps the person's payment
		},
		want:  "I2",
		fixed: true,
	},
}

func TestCheckReplay(t *testing.T) {
	for _, tc := range checkReplays {
		t.Run(tc.finding, func(t *testing.T) {
			t.Parallel()
			b := findingBound(t, tc.finding)
			v, at, err := replay(&b, tc.steps)
			if err != nil || v != tc.want || at != len(tc.steps) {
				t.Errorf("replay(%s) = %s at step %d (%v), want %s at step %d", b.summary(), v, at, err, tc.want, len(tc.steps))
			}
			b.Rules = rules{}
			v, at, err = replay(&b, tc.steps)
			switch {
			case tc.fixed && v == tc.want:
				t.Errorf("replay(%s) with the rules as written = %s at step %d, want no violation", b.summary(), v, at)
			case !tc.fixed && v != tc.want:
				t.Errorf("replay(%s) with the rules as written = %s at step %d (%v), want %s", b.summary(), v, at, err, tc.want)
			}
		})
	}
}

// TestCheckPendingFact shows what the Pending fact is for: a process
// whose own outbox holds a 2xx for a key, not yet written, never sends the
// key again. With IgnorePending it does (no invariant breaks, for no
// caller was told: a send after a provider-written 2xx the checker counts).
func TestCheckPendingFact(t *testing.T) {
	b := bound{Name: "pending", Replicas: 2, Keys: 1, Calls: 3, Faults: 2, Depth: 11, NoPerson: true,
		Off: faultFail | faultCrash | faultLostReply, Times: checkTimes}
	ignoring := b
	ignoring.Rules.IgnorePending = true
	rep := explore(&ignoring, nil)
	t.Logf("%s: %v", ignoring.summary(), rep)
	if rep.ownPaid == 0 {
		t.Fatalf("%s: no process sent a key whose 2xx its own outbox held; with IgnorePending, one must", ignoring.summary())
	}
	t.Logf("the first such send:\n%s", describe(&ignoring, rep.ownPaidExample))
	rep = explore(&b, nil)
	t.Logf("%s: %v", b.summary(), rep)
	if rep.ownPaid != 0 {
		t.Errorf("%s: %d sends of a key whose 2xx the sender's own outbox held, want 0; the first:\n%s", b.summary(), rep.ownPaid, describe(&b, rep.ownPaidExample))
	}
}

// TestCheckLateSettlementAsksItsOutbox replays what the deep bound found
// when a settlement that ran late brought the Pending fact as it was when
// it was issued: the settlement claim hangs (a pooler queues it); meanwhile
// its process's call gets a 2xx whose write hangs, and the other process
// takes the record over; the settlement then runs, acquires the record
// and sends the key whose 2xx its own outbox holds. Asked as the
// statement runs (SettleDue asks the outbox in its transaction), the
// outbox holds it back.
func TestCheckLateSettlementAsksItsOutbox(t *testing.T) {
	steps := []string{
		"caller k0 calls p1",
		"tick",
		"tick",
		"provider answers k0",
		"outbox p1 writes k0",
		"tick",
		"settlement p1 claims k0 (hangs)",
		"caller k0 calls p1",
		"tick",
		"provider answers k0",
		"outbox p1 writes k0 (hangs)",
		"tick",
		"tick",
		"tick",
		"tick",
		"caller k0 calls p2 (commits, acknowledgement lost)",
		"outbox p2 writes k0",
		"hung op #0 commits",
	}
	for _, tc := range []struct {
		name    string
		rules   rules
		ownPaid bool
	}{
		{"facts as issued", rules{IssuedFacts: true}, true},
		{"facts as the statement runs", rules{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := bound{Name: tc.name, Replicas: 2, Keys: 1, Calls: 3, Faults: 3, Depth: len(steps), Times: checkTimes, Rules: tc.rules}
			s := initial(&b)
			var n state
			var res result
			for i, name := range steps {
				var a act
				found := false
				for _, a = range s.actions(&b, nil) {
					if found = a.String() == name; found {
						break
					}
				}
				if !found {
					t.Fatalf("%s: step %d, %q, is not possible then", b.summary(), i+1, name)
				}
				res = s.next(&n, &b, a, true)
				s = n
			}
			if res.ownPaid != tc.ownPaid {
				t.Errorf("%s: the last step (%s) sent a key whose 2xx its sender's outbox held = %v, want %v",
					b.summary(), strings.Join(res.notes, "; "), res.ownPaid, tc.ownPaid)
			}
		})
	}
}

// fellBackToUnknown reports whether, in schedule, a failover takes a
// record back to OUTCOME_UNKNOWN.
func fellBackToUnknown(b *bound, schedule []act) bool {
	s := initial(b)
	var n state
	for _, a := range schedule {
		s.next(&n, b, a, false)
		s = n
		if a.kind == actRollback {
			for k := range b.Keys {
				if s.store[k].state == OutcomeUnknown {
					return true
				}
			}
		}
	}
	return false
}

func TestCheckStateHasNoPadding(t *testing.T) {
	if a := unsafe.Alignof(state{}); a != 1 {
		t.Fatalf("state's alignment = %d, want 1 (one-byte fields only, so that it hashes as its bytes)", a)
	}
}
