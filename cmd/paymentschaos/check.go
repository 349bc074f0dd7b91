package main

import (
	"bytes"
	"fmt"
	"slices"
	"sort"
	"time"

	"google.golang.org/grpc/codes"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
	"example.com/paymentsd/paymentsclient"
)

// Kinds of violation: each is a contradiction between what paymentsd (or
// its client) said or did about money and what the provider saw. The
// first ones are the invariants of issue 30 (invariantOf).
const (
	// I1: the key reached the provider again after a caller had been told
	// OK for it.
	violToldOKSentAgain = "told_ok_sent_again"
	// I2: an OK told to a caller whose key is not SUCCEEDED on record at
	// the end, whatever a person did meanwhile.
	violOKNotOnRecord = "ok_not_on_record"
	// I2: an OK told to a caller with a reply other than the record's.
	violOKReplyDiffers = "ok_reply_differs"
	// I2: PAYMENT_NOT_CREATED (or paymentsclient's ErrNotCreated) for a
	// key the provider created.
	violFalseNotCreated = "false_not_created"
	// I3: two requests with the key at the provider at once.
	violOverlap = "overlap"
	// I4: a person's resolution that paymentsd accepted, and that
	// contradicts what a caller had been told: NOT_CREATED of a key told
	// OK, or SUCCEEDED of a key told NOT_CREATED.
	violResolutionContradicts = "resolution_contradicts_caller"

	// The provider made more than one payment for the key.
	violChargedTwice = "charged_twice"
	// The key reached the provider again after a 2xx for it had been
	// delivered to a replica that lived on, with nothing else to explain
	// it (resendLived); with -strict, after any delivered 2xx.
	violSentAfter2xx = "sent_after_2xx"
	// The record says NOT_CREATED; the provider made the payment, and no
	// person resolved it so.
	violRecordNotCreated = "record_not_created_but_charged"
	// The record says SUCCEEDED; the provider made no payment.
	violRecordNoCharge = "record_succeeded_without_charge"
	// The provider saw the key; paymentsd has no record of it.
	violNoRecord = "sent_without_record"
	// A final refusal (key reused, expired, not owned, invalid) of a valid
	// request with the caller's own key.
	violRefused = "unexpected_refusal"
	// Still IN_PROGRESS, or OUTCOME_UNKNOWN with settlement still due,
	// when the wait for settlement ended.
	violUnsettled = "unsettled"
)

// violationKinds lists every kind, in the order the report prints them.
var violationKinds = []string{
	violToldOKSentAgain, violOKNotOnRecord, violOKReplyDiffers, violFalseNotCreated, violOverlap, violResolutionContradicts,
	violChargedTwice, violSentAfter2xx, violRecordNotCreated, violRecordNoCharge, violNoRecord, violRefused, violUnsettled,
}

// The invariants of issue 30, which the payment engine must keep under
// every fault.
const (
	invI1 = "I1" // a key whose 2xx any caller was told is never sent to the provider again
	invI2 = "I2" // told OK: the record ends SUCCEEDED with that reply; told NOT_CREATED: the provider never created it
	invI3 = "I3" // at most one request per key at the provider at a time
	invI4 = "I4" // no resolution is accepted that contradicts what a caller was told
)

// invariants lists them in order, with what each says.
var invariants = []struct{ name, says string }{
	{invI1, "a key told OK was sent to the provider again"},
	{invI2, "told OK, the record is not SUCCEEDED with that reply; or told NOT_CREATED of a payment"},
	{invI3, "two requests for one key at the provider at once"},
	{invI4, "a resolution accepted that contradicts what a caller was told"},
}

// invariantOf is the invariant a kind of violation breaks, if any.
var invariantOf = map[string]string{
	violToldOKSentAgain:       invI1,
	violOKNotOnRecord:         invI2,
	violOKReplyDiffers:        invI2,
	violFalseNotCreated:       invI2,
	violOverlap:               invI3,
	violResolutionContradicts: invI4,
}

// Why a key reached the provider again after a 2xx for it had been
// delivered to a replica. All but resendLived have a cause outside the
// replica that read the 2xx, and are reported, not counted (unless
// -strict): whether a caller was told OK, which is I1 whatever the
// reason, is judged apart.
const (
	// The replica the 2xx was for was SIGKILLed while its request was at
	// the provider.
	resendKilledAtProvider = "replica_killed_with_request_at_provider"
	// It was SIGKILLed after the delivery, before it could have committed
	// the 2xx: within -commit-grace of it, or of the store's return.
	resendKilledCommitWindow = "replica_killed_in_commit_window"
	// It answered the call that carried the request, after the delivery,
	// that the outcome was unknown: its deadline cut the request off
	// before it read the 2xx (a 2xx written to the connection is not a
	// 2xx read from it).
	resendUnread = "replica_never_read_the_2xx"
	// A person's NOT_CREATED resolution, accepted in between, let the key
	// be sent again as a new attempt.
	resendResolved = "resolved_not_created_by_a_person"
	// The store may lose acknowledged commits in a failover (asynchronous
	// or non-strict synchronous replication), and one came in between.
	resendCommitLost = "commit_lost_in_failover"
	// It was cut off from the store (replica-partition) from before it
	// could have committed the 2xx until after the key was sent again: to
	// the others it looked dead (docs/durability.md's "a replica cut off
	// from the database alone").
	resendCutOff = "replica_cut_off_from_the_store"
	// None of these: the replica lived on with the 2xx. A violation.
	resendLived = "replica_lived_on"
)

// resendReasons lists them in the order the report prints them.
var resendReasons = []string{resendKilledAtProvider, resendKilledCommitWindow, resendUnread, resendResolved, resendCommitLost, resendCutOff, resendLived}

// violation is one key's contradiction of one kind (or, in Resends, one
// key's re-send and its reason).
type violation struct {
	Kind   string `json:"kind"`
	Key    string `json:"key"`
	Detail string `json:"detail"`
}

// keyFacts is what the fake provider saw of a key.
type keyFacts struct {
	Stats   simulator.KeyStats
	History []simulator.KeyRequest
}

// record is paymentsd's record of a key, as read after settlement.
type record struct {
	Found  bool
	State  paymentsv1.PaymentState
	Reply  []byte // payment_json
	GaveUp bool   // settlement gave up (past the window)
	Err    string // the lookup failed: nothing is known
	// Resolutions are the record's audit entries: the resolutions
	// paymentsd accepted, by the store's clock.
	Resolutions []recordedResolution
	// Read2xx are the start times of the attempts whose provider status
	// on record is a 2xx: a replica read the 2xx, and its outbox wrote
	// it (at once, or late), by the store's clock.
	Read2xx []time.Time
}

// recordedResolution is an accepted resolution, as the record's audit
// shows it.
type recordedResolution struct {
	At         time.Time
	NotCreated bool
}

// fault is one fault the run injected.
type fault struct {
	Kind string `json:"kind"`
	// Target is what it struck: a replica's listener name ("r0"), a
	// Patroni node, or "" for the only one.
	Target string `json:"target,omitempty"`
	// Start is when it struck; Undone is when whatever it stopped runs
	// again (zero if undoing it failed).
	Start, Undone time.Time `json:"-"`
	// Kills are the replicas a compound fault SIGKILLed while it lasted.
	Kills []kill `json:"-"`
	Err   string `json:"error,omitempty"`
}

// kill is a replica SIGKILLed inside a compound fault, or sent SIGTERM:
// then At is when it exited (drained, or SIGKILLed once its grace was
// over: Killed), and Termed when it was sent SIGTERM.
type kill struct {
	Target string
	At     time.Time
	Termed time.Time
	Killed bool
}

// faultPaymentsdKill is the fault whose target, a replica, may die
// holding a 2xx it had not committed.
const faultPaymentsdKill = "paymentsd-kill"

// checkInput is everything a check judges.
type checkInput struct {
	Calls    []call
	Provider map[string]keyFacts
	Records  map[string]record
	Faults   []fault
	// Resolutions are those a person asked for (-careless), accepted or
	// not.
	Resolutions []resolution
	// Begin is when the run began, and End when the callers stopped.
	Begin, End time.Time
	// CommitGrace is how long a replica may take to commit a 2xx once the
	// store is up: a kill of the receiver within it explains a re-send.
	CommitGrace time.Duration
	// LosesCommits: the store may lose acknowledged commits in a failover
	// (Patroni with asynchronous or non-strict synchronous replication).
	LosesCommits bool
	// Strict counts every re-send after a 2xx as a violation, whatever
	// happened to its receiver.
	Strict bool
}

// checkResult is a check's verdict and figures.
type checkResult struct {
	Violations []violation `json:"violations"`
	// Resends are the keys sent again after a 2xx was delivered, one per
	// key, each with its reason as Kind.
	Resends []violation `json:"resends"`
	Keys    keyCounts   `json:"keys"`
	Calls   callCounts  `json:"calls"`
	Faults  []faultStats
	// Outside is the latency of calls that overlap no fault's window.
	Outside latency `json:"outside_faults"`
	// WithoutOK is the longest time in the run in which no call was
	// answered OK.
	WithoutOK gap `json:"longest_without_ok"`
	// Resolutions counts what the person asked and what paymentsd did.
	Resolutions resolutionCounts `json:"resolutions"`
}

// gap is a stretch of the run, in seconds from its start.
type gap struct {
	Seconds float64 `json:"s"`
	From    float64 `json:"from_s"`
	To      float64 `json:"to_s"`
}

// resolutionCounts sums a person's resolutions.
type resolutionCounts struct {
	Asked    int            `json:"asked"`
	Accepted int            `json:"accepted"`
	Refused  map[string]int `json:"refused"`
	// WrongNotCreated counts keys the person got paymentsd to record
	// NOT_CREATED (an accepted resolution in the record's audit) although
	// the provider had made the payment: the person's error, which
	// paymentsd could refuse only if it knew of a 2xx.
	WrongNotCreated int `json:"wrong_not_created"`
}

// keyCounts classifies the keys by what their callers were finally told,
// and what the record says of those left in doubt.
type keyCounts struct {
	Total      int `json:"total"`
	OK         int `json:"ok"`
	NotCreated int `json:"not_created"`
	// InDoubt: the caller gave up without a verdict (or was stopped).
	InDoubt int `json:"in_doubt"`
	// Settled: of those, SUCCEEDED or NOT_CREATED on record afterwards,
	// or never recorded (so never sent).
	Settled int `json:"settled_afterwards"`
	// Charged is how many keys the provider made a payment for.
	Charged int `json:"charged"`
	// BySettlement counts keys whose record settlement settled: the
	// provider got a request for the key while none of its calls was open
	// (so paymentsd's settlement sent it), and the record is SUCCEEDED or
	// NOT_CREATED.
	BySettlement int `json:"settled_by_settlement"`
}

type callCounts struct {
	// Total counts gRPC calls to CreateMultiCardPayment, the raw callers'
	// and paymentsclient's attempts.
	Total  int `json:"total"`
	Failed int `json:"failed"`
	// Clients counts paymentsclient.Create calls.
	Clients int `json:"client_creates"`
	// REST counts the calls of Total made over REST, and Left those whose
	// caller went away before the answer.
	REST int `json:"rest,omitempty"`
	Left int `json:"rest_left,omitempty"`
}

// latency is a latency distribution in milliseconds.
type latency struct {
	Calls int     `json:"calls"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
}

// faultStats is what a fault cost callers.
type faultStats struct {
	fault
	// Recovered is the end of the first successful call that started after
	// the fault was undone: the fault's window runs from Start to it (or to
	// the next fault, or the end of the run).
	Recovered time.Time `json:"-"`
	// Calls counts the gRPC calls that overlap the window, and Failed
	// those that failed.
	Calls  int `json:"calls"`
	Failed int `json:"failed"`
	// FailedBy counts the failed calls by "CODE REASON".
	FailedBy map[string]int `json:"failed_by"`
	// LongestFailedRun is the longest run of consecutive failed calls (by
	// start), and LongestFailedRunSeconds its span, from the first one's
	// start to the last one's end.
	LongestFailedRun        int     `json:"longest_failed_run_calls"`
	LongestFailedRunSeconds float64 `json:"longest_failed_run_s"`
	// Unavailable is the longest stretch of the window in which no call
	// succeeded, in seconds.
	Unavailable float64 `json:"unavailable_s"`
	During      latency `json:"during"`
	// InDoubt counts keys with a call in the window whose caller ended
	// without a verdict; Settled, those SUCCEEDED or NOT_CREATED on record
	// afterwards, or never recorded.
	InDoubt int `json:"in_doubt"`
	Settled int `json:"settled_afterwards"`
	// BySettlement counts keys settled by settlement (keyCounts) whose
	// settlement request came after this fault began and before the next.
	BySettlement int `json:"settled_by_settlement"`
}

// check judges a run's history against the provider's facts and
// paymentsd's records.
func check(in checkInput) checkResult {
	res := checkResult{Resolutions: resolutionCounts{Refused: make(map[string]int)}}
	seen := make(map[[2]string]bool) // kind, key: one violation of a kind per key
	flag := func(kind, key, format string, args ...any) {
		if seen[[2]string{kind, key}] {
			return
		}
		seen[[2]string{kind, key}] = true
		res.Violations = append(res.Violations, violation{kind, key, fmt.Sprintf(format, args...)})
	}

	byKey := make(map[string][]call)
	var keys []string
	for _, c := range in.Calls {
		if _, ok := byKey[c.Key]; !ok {
			keys = append(keys, c.Key)
		}
		byKey[c.Key] = append(byKey[c.Key], c)
	}
	for k := range in.Provider {
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k) // the provider saw a key no caller used
		}
	}
	sort.Strings(keys)
	asked := make(map[string][]resolution)
	for _, r := range in.Resolutions {
		asked[r.Key] = append(asked[r.Key], r)
		res.Resolutions.Asked++
		if r.Accepted {
			res.Resolutions.Accepted++
		} else {
			res.Resolutions.Refused[r.Refusal]++
		}
	}

	outcome := make(map[string]string) // key → verdictOK, verdictNotCreated or verdictUnknown
	var settledAt []time.Time          // settlement's first request of each key it settled
	for _, key := range keys {
		calls, facts, rec := byKey[key], in.Provider[key], in.Records[key]
		charged := slices.IndexFunc(facts.History, func(kr simulator.KeyRequest) bool { return kr.Charged })
		resolvedNotCreated := slices.ContainsFunc(rec.Resolutions, func(r recordedResolution) bool { return r.NotCreated })

		// What paymentsd told callers against its record (I2).
		for _, c := range calls {
			switch {
			case c.ok() && (!rec.Found || rec.State != paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED):
				flag(violOKNotOnRecord, key, "%s told OK with %s at %s; the record is %s", c.Kind, c.Reply, offset(in, c.End), describe(rec))
			case c.ok() && !bytes.Equal(c.Reply, rec.Reply):
				flag(violOKReplyDiffers, key, "%s told OK with %s at %s; the record holds %s", c.Kind, c.Reply, offset(in, c.End), rec.Reply)
			case c.Verdict == verdictRefused:
				flag(violRefused, key, "%s answered %s %s at %s", c.Kind, c.Code, c.Reason, offset(in, c.End))
			}
		}

		// NOT_CREATED said of a key the provider created (I2).
		if charged >= 0 {
			first := facts.History[charged]
			allAnswered := !slices.ContainsFunc(calls, func(c call) bool { return c.Kind == kindCreate && !c.Answered })
			for _, c := range calls {
				switch {
				case c.Reason == paymentsclient.ReasonNotCreated && !first.Arrived.After(c.End):
					// A request that made the payment had reached the
					// provider before the answer.
					flag(violFalseNotCreated, key, "%s answered %s PAYMENT_NOT_CREATED at %s; a request that made the payment had reached the provider at %s",
						c.Kind, c.Code, offset(in, c.End), offset(in, first.Arrived))
				case c.Kind == kindClient && c.Verdict == verdictNotCreated:
					// The caller pays again under a new key: any payment
					// for this one is a second.
					flag(violFalseNotCreated, key, "paymentsclient.Create returned ErrNotCreated at %s; the provider made the payment (request arrived at %s)",
						offset(in, c.End), offset(in, first.Arrived))
				case c.Kind == kindCreate && c.Final && c.Verdict == verdictNotCreated && allAnswered:
					flag(violFalseNotCreated, key, "the caller's last answer, with every call answered, was %s PAYMENT_NOT_CREATED at %s; the provider made the payment (request arrived at %s)",
						c.Code, offset(in, c.End), offset(in, first.Arrived))
				}
			}
		}

		// Resolutions against what callers were told (I4): those in the
		// record's audit, and those the person was told were accepted
		// (an audit lost with a failover's commits still counts).
		type accepted struct {
			at         time.Time
			notCreated bool
			how        string
		}
		var acc []accepted
		for _, r := range rec.Resolutions {
			acc = append(acc, accepted{r.At, r.NotCreated, "recorded in the audit"})
		}
		for _, r := range asked[key] {
			if r.Accepted {
				acc = append(acc, accepted{r.Start, r.NotCreated, "asked for"})
			}
		}
		for _, a := range acc {
			for _, c := range calls {
				if !c.End.Before(a.at) {
					continue
				}
				switch {
				case a.notCreated && c.ok():
					flag(violResolutionContradicts, key, "a NOT_CREATED resolution %s at %s was accepted; a caller had been told OK at %s", a.how, offset(in, a.at), offset(in, c.End))
				case !a.notCreated && c.Final && c.Verdict == verdictNotCreated:
					flag(violResolutionContradicts, key, "a SUCCEEDED resolution %s at %s was accepted; the caller had been told NOT_CREATED at %s", a.how, offset(in, a.at), offset(in, c.End))
				}
			}
		}
		if resolvedNotCreated && charged >= 0 {
			res.Resolutions.WrongNotCreated++
		}

		// The provider's own counts.
		if facts.Stats.Charges > 1 {
			flag(violChargedTwice, key, "the provider made %d payments from %d requests", facts.Stats.Charges, facts.Stats.Requests)
		}
		if facts.Stats.Overlaps > 0 {
			flag(violOverlap, key, "%d of %d requests arrived while another with the key was at the provider (at most %d at once)",
				facts.Stats.Overlaps, facts.Stats.Requests, facts.Stats.MaxInFlight)
		}

		// Sent again after a delivered 2xx, and why.
		why := ""
		if d := slices.IndexFunc(facts.History, func(kr simulator.KeyRequest) bool { return kr.Delivered }); d >= 0 && facts.Stats.AfterDelivered > 0 {
			got := facts.History[d]
			// The first request to arrive after the delivery (one that
			// arrived before it overlapped, and is counted as such).
			again := facts.History[len(facts.History)-1]
			for _, kr := range facts.History[d+1:] {
				if !kr.Arrived.Before(got.Ended) {
					again = kr
					break
				}
			}
			detail := fmt.Sprintf("%d request(s) after a 2xx was delivered to %s at %s; the first at %s, from %s",
				facts.Stats.AfterDelivered, got.Listener, offset(in, got.Ended), offset(in, again.Arrived), listenerName(again.Listener))
			reason, because := resendReason(in, calls, rec, got, again)
			why = reason
			res.Resends = append(res.Resends, violation{reason, key, detail + because})
			if reason == resendLived || in.Strict {
				flag(violSentAfter2xx, key, "%s%s", detail, because)
			}
		}

		// Told OK, then sent again (I1).
		if i := slices.IndexFunc(calls, call.ok); i >= 0 {
			told := calls[i]
			for _, c := range calls[i:] {
				if c.ok() && c.End.Before(told.End) {
					told = c
				}
			}
			if j := slices.IndexFunc(facts.History, func(kr simulator.KeyRequest) bool { return kr.Arrived.After(told.End) }); j >= 0 {
				kr := facts.History[j]
				because := ""
				if why != "" {
					because = "; the re-send after the delivered 2xx: " + why
				}
				flag(violToldOKSentAgain, key, "%s told OK at %s; the provider got the key again at %s from %s (answered %d)%s",
					told.Kind, offset(in, told.End), offset(in, kr.Arrived), listenerName(kr.Listener), kr.Status, because)
			}
		}

		// The record against the provider.
		switch {
		case rec.Err != "":
			if len(facts.History) > 0 {
				flag(violUnsettled, key, "the record could not be read (%s)", rec.Err)
			}
		case !rec.Found:
			if len(facts.History) > 0 {
				flag(violNoRecord, key, "the provider saw %d request(s) (%d charged); paymentsd has no record", facts.Stats.Requests, facts.Stats.Charges)
			}
		case rec.State == paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED && charged >= 0 && !resolvedNotCreated:
			flag(violRecordNotCreated, key, "the record is NOT_CREATED; the provider made the payment (request arrived at %s)", offset(in, facts.History[charged].Arrived))
		case rec.State == paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED && charged < 0:
			flag(violRecordNoCharge, key, "the record is SUCCEEDED with %s; the provider made no payment", rec.Reply)
		case rec.State == paymentsv1.PaymentState_PAYMENT_STATE_IN_PROGRESS,
			rec.State == paymentsv1.PaymentState_PAYMENT_STATE_OUTCOME_UNKNOWN && !rec.GaveUp:
			flag(violUnsettled, key, "the record is still %s", describe(rec))
		}

		// What the caller was finally told.
		outcome[key] = verdictUnknown
		for _, c := range calls {
			switch {
			case c.ok():
				outcome[key] = verdictOK
			case c.Final && c.Verdict == verdictNotCreated && outcome[key] != verdictOK:
				outcome[key] = verdictNotCreated
			}
		}
		if len(calls) == 0 {
			continue
		}
		res.Keys.Total++
		switch outcome[key] {
		case verdictOK:
			res.Keys.OK++
		case verdictNotCreated:
			res.Keys.NotCreated++
		default:
			res.Keys.InDoubt++
			if settled(rec) {
				res.Keys.Settled++
			}
		}
		if charged >= 0 {
			res.Keys.Charged++
		}
		if t, ok := sentBySettlement(calls, facts.History); ok && settled(rec) {
			res.Keys.BySettlement++
			settledAt = append(settledAt, t)
		}
	}

	var attempts []call
	for _, c := range in.Calls {
		if c.Kind == kindClient {
			res.Calls.Clients++
			continue
		}
		attempts = append(attempts, c)
		res.Calls.Total++
		if c.REST {
			res.Calls.REST++
			if !c.Answered && !c.ok() {
				res.Calls.Left++
			}
		}
		if !c.ok() {
			res.Calls.Failed++
		}
	}
	res.WithoutOK = longestWithoutOK(in, attempts)
	res.Faults, res.Outside = faultFigures(in, attempts, outcome)
	for _, t := range settledAt {
		for i := len(res.Faults) - 1; i >= 0; i-- {
			if !t.Before(res.Faults[i].Start) {
				res.Faults[i].BySettlement++
				break
			}
		}
	}
	return res
}

// resendReason says why a key reached the provider again (again) after a
// 2xx (got) was delivered to a replica: the first reason that applies, in
// resendReasons' order, and a note on what happened.
func resendReason(in checkInput, calls []call, rec record, got, again simulator.KeyRequest) (string, string) {
	k, killed := killedBetween(in.Faults, got.Listener, got.Arrived, minTime(again.Arrived, commitBy(in, got.Ended)))
	switch {
	case killed && k.At.Before(got.Ended):
		return resendKilledAtProvider, fmt.Sprintf("; %s %s, with the request at the provider", got.Listener, died(in, k))
	case killed:
		return resendKilledCommitWindow, fmt.Sprintf("; %s %s, before it could have committed the 2xx (by %s)", got.Listener, died(in, k), offset(in, commitBy(in, got.Ended)))
	}
	if unread, ok := unreadBy(calls, rec, got); ok {
		return resendUnread, fmt.Sprintf("; %s answered the call that carried it %s %s at %s: it had not read the 2xx", got.Listener, unread.Code, unread.Reason, offset(in, unread.End))
	}
	for _, r := range rec.Resolutions {
		if r.NotCreated && r.At.After(got.Ended) && r.At.Before(again.Arrived) {
			return resendResolved, fmt.Sprintf("; a person's NOT_CREATED resolution was accepted at %s", offset(in, r.At))
		}
	}
	if in.LosesCommits {
		// A failover lasts until the fault is undone: a commit made
		// meanwhile, on a promoted node, may be rewound when it ends.
		for _, f := range in.Faults {
			if slices.Contains(failoverFaults, f.Kind) && f.Start.Before(again.Arrived) && (f.Undone.IsZero() || f.Undone.After(got.Ended)) {
				return resendCommitLost, fmt.Sprintf("; %s from %s may have lost the commit (the store may lose acknowledged commits in a failover)", f.Kind, offset(in, f.Start))
			}
		}
	}
	for _, f := range in.Faults {
		if f.Kind == faultReplicaPartition && f.Target == got.Listener && f.Start.Before(got.Ended.Add(in.CommitGrace)) &&
			(f.Undone.IsZero() || f.Undone.After(again.Arrived)) {
			return resendCutOff, fmt.Sprintf("; %s was cut off from the store from %s to %s", got.Listener, offset(in, f.Start), offsetOrEnd(in, f.Undone))
		}
	}
	because := ""
	if k, killed := killedBetween(in.Faults, got.Listener, got.Arrived, again.Arrived); killed {
		because = fmt.Sprintf("; %s lived on, and %s, after it could have committed the 2xx (by %s)",
			got.Listener, died(in, k), offset(in, commitBy(in, got.Ended)))
	}
	return resendLived, because
}

// offsetOrEnd is offset, or "the end" for a zero time (never undone).
func offsetOrEnd(in checkInput, t time.Time) string {
	if t.IsZero() {
		return "the end"
	}
	return offset(in, t)
}

// listenerName names the replica whose listener a request came in on.
func listenerName(l string) string {
	if l == "" {
		return "an unknown client"
	}
	return l
}

// longestWithoutOK is the longest stretch from the run's start to its end
// in which no attempt was answered OK.
func longestWithoutOK(in checkInput, attempts []call) gap {
	ends := []time.Time{in.Begin}
	for _, c := range attempts {
		if c.ok() && c.End.After(in.Begin) && c.End.Before(in.End) {
			ends = append(ends, c.End)
		}
	}
	ends = append(ends, in.End)
	slices.SortFunc(ends, time.Time.Compare)
	var g gap
	for i := 1; i < len(ends); i++ {
		if d := ends[i].Sub(ends[i-1]).Seconds(); d > g.Seconds {
			g = gap{Seconds: d, From: ends[i-1].Sub(in.Begin).Seconds(), To: ends[i].Sub(in.Begin).Seconds()}
		}
	}
	return g
}

// sentBySettlement returns the arrival of the first of a key's requests at
// the provider that came while none of its calls was open: settlement's.
func sentBySettlement(calls []call, history []simulator.KeyRequest) (time.Time, bool) {
	for _, kr := range history {
		open := slices.ContainsFunc(calls, func(c call) bool {
			return c.Kind != kindClient && !kr.Arrived.Before(c.Start) && !kr.Arrived.After(c.End)
		})
		if !open {
			return kr.Arrived, true
		}
	}
	return time.Time{}, false
}

// unreadBy finds the call whose request got the 2xx kr, if its replica
// answered it, after the delivery, that the provider's answer was unknown
// (PAYMENT_OUTCOME_UNKNOWN), and the record shows no attempt that read a
// 2xx and was under way when kr arrived. A replica that read a 2xx answers
// PAYMENT_OUTCOME_UNKNOWN too when its deadline comes before the 2xx is
// committed (told OK means durable); its attempt then shows the 2xx once
// the outbox has written it.
func unreadBy(calls []call, rec record, kr simulator.KeyRequest) (call, bool) {
	for _, t := range rec.Read2xx {
		if !t.After(kr.Arrived) {
			return call{}, false
		}
	}
	for _, c := range calls {
		if c.Kind != kindClient && fmt.Sprintf("r%d", c.Replica) == kr.Listener &&
			!kr.Arrived.Before(c.Start) && !kr.Arrived.After(c.End) && c.End.After(kr.Ended) &&
			c.Answered && c.Reason == "PAYMENT_OUTCOME_UNKNOWN" {
			return c, true
		}
	}
	return call{}, false
}

// killedBetween reports whether a paymentsd-kill, or a compound fault's
// kill (or SIGTERM's drain), struck target between from and to, and how.
func killedBetween(faults []fault, target string, from, to time.Time) (kill, bool) {
	for _, f := range faults {
		kills := f.Kills
		if f.Kind == faultPaymentsdKill {
			kills = append(kills, kill{Target: f.Target, At: f.Start})
		}
		for _, k := range kills {
			if k.Target == target && !k.At.Before(from) && !k.At.After(to) {
				return k, true
			}
		}
	}
	return kill{}, false
}

// died says how and when k ended its replica: "was SIGKILLed at 3.0s", or
// "was sent SIGTERM at 3.0s and stopped writing (its drain over) at 24.0s".
func died(in checkInput, k kill) string {
	if k.Termed.IsZero() {
		return "was SIGKILLed at " + offset(in, k.At)
	}
	return fmt.Sprintf("was sent SIGTERM at %s and stopped writing (its drain over) at %s", offset(in, k.Termed), offset(in, k.At))
}

// storeFaults are the faults that take the record store away.
var storeFaults = []string{faultPostgresKill, faultPostgresStop, faultPostgresFreeze, faultPostgresFreezeKill, faultSQLiteLock,
	faultPostgresFreezeTerm, faultPostgresStopTerm, faultPostgresReadOnly,
	faultPrimaryKill, faultSwitchover, faultPoolerRestart, faultLoseCommits, faultFreezePrimary, faultFailoverAfterUnknown}

// failoverFaults are the faults that promote a standby, or may: where the
// store may lose acknowledged commits (checkInput.LosesCommits), a commit
// made before one may be gone after it.
var failoverFaults = []string{faultPrimaryKill, faultLoseCommits, faultFreezePrimary, faultFailoverAfterUnknown}

// commitBy is the latest a replica that received a 2xx at t could have
// committed it: t plus the grace, or, if the store was down at t, the
// store's return plus the grace.
func commitBy(in checkInput, t time.Time) time.Time {
	by := t.Add(in.CommitGrace)
	for _, f := range in.Faults {
		if !slices.Contains(storeFaults, f.Kind) || t.Before(f.Start) {
			continue
		}
		back := f.Undone
		if back.IsZero() {
			back = in.End
		}
		if !t.After(back) {
			by = maxTime(by, back.Add(in.CommitGrace))
		}
	}
	return by
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// faultFigures measures each fault's window over the attempts (gRPC
// calls, by start) that overlap it, and the latency of those that overlap
// no window.
func faultFigures(in checkInput, attempts []call, outcome map[string]string) ([]faultStats, latency) {
	faults := slices.Clone(in.Faults)
	slices.SortStableFunc(faults, func(a, b fault) int { return a.Start.Compare(b.Start) })
	slices.SortStableFunc(attempts, func(a, b call) int { return a.Start.Compare(b.Start) })
	var stats []faultStats
	inWindow := make([]bool, len(attempts))
	for i, f := range faults {
		fs := faultStats{fault: f, FailedBy: make(map[string]int)}
		limit := in.End
		if i+1 < len(faults) && faults[i+1].Start.Before(limit) {
			limit = faults[i+1].Start
		}
		fs.Recovered = limit
		if !f.Undone.IsZero() {
			for _, c := range attempts {
				if c.ok() && !c.Start.Before(f.Undone) && c.End.Before(fs.Recovered) {
					fs.Recovered = c.End
				}
			}
		}
		var lat []time.Duration
		var run int
		var runStart time.Time
		successes := []time.Time{f.Start}
		doubt := make(map[string]bool)
		for j, c := range attempts {
			// A call that overlaps the window counts: one that waited
			// through the fault (for a commit, say) felt it.
			if !c.End.After(f.Start) || !c.Start.Before(fs.Recovered) {
				continue
			}
			inWindow[j] = true
			fs.Calls++
			lat = append(lat, c.End.Sub(c.Start))
			if outcome[c.Key] == verdictUnknown {
				doubt[c.Key] = true
			}
			if c.ok() {
				run = 0
				successes = append(successes, c.End)
				continue
			}
			fs.Failed++
			fs.FailedBy[failure(c.Code, c.Reason)]++
			if run == 0 {
				runStart = c.Start
			}
			run++
			if run > fs.LongestFailedRun {
				fs.LongestFailedRun = run
			}
			if s := c.End.Sub(runStart).Seconds(); s > fs.LongestFailedRunSeconds {
				fs.LongestFailedRunSeconds = s
			}
		}
		successes = append(successes, fs.Recovered)
		slices.SortFunc(successes, time.Time.Compare)
		for k := 1; k < len(successes); k++ {
			fs.Unavailable = max(fs.Unavailable, successes[k].Sub(successes[k-1]).Seconds())
		}
		fs.During = distribution(lat)
		fs.InDoubt = len(doubt)
		for k := range doubt {
			if settled(in.Records[k]) {
				fs.Settled++
			}
		}
		stats = append(stats, fs)
	}
	var outside []time.Duration
	for j, c := range attempts {
		if !inWindow[j] {
			outside = append(outside, c.End.Sub(c.Start))
		}
	}
	return stats, distribution(outside)
}

// failure names a failed call's answer: its code, and reason if any.
func failure(code codes.Code, reason string) string {
	if reason == "" {
		return code.String()
	}
	return code.String() + " " + reason
}

// distribution is the p50 and p99 of ds, nearest rank.
func distribution(ds []time.Duration) latency {
	if len(ds) == 0 {
		return latency{}
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	rank := func(p float64) float64 {
		i := int(float64(len(ds))*p+0.999999) - 1
		return float64(ds[max(0, min(i, len(ds)-1))].Microseconds()) / 1000
	}
	return latency{Calls: len(ds), P50: rank(0.50), P99: rank(0.99)}
}

// settled reports whether a record's outcome is known: the payment
// exists, or certainly does not (NOT_CREATED, or no record at all: nothing
// is sent before it is recorded).
func settled(r record) bool {
	return r.Err == "" && (!r.Found || r.State == paymentsv1.PaymentState_PAYMENT_STATE_SUCCEEDED || r.State == paymentsv1.PaymentState_PAYMENT_STATE_NOT_CREATED)
}

func describe(r record) string {
	switch {
	case r.Err != "":
		return "unreadable (" + r.Err + ")"
	case !r.Found:
		return "missing"
	case r.GaveUp:
		return r.State.String() + " (settlement gave up)"
	}
	return r.State.String()
}

// offset is t as seconds into the run, for details.
func offset(in checkInput, t time.Time) string {
	return fmt.Sprintf("%.3fs", t.Sub(in.Begin).Seconds())
}
