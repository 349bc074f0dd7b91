package record

import (
	"bytes"
	"time"
)

// Event is something that happens to a record: Claim, Settle, Outcome or
// Resolve.
type Event interface{ event() }

// Request is what a call asks to send with a key.
type Request struct {
	Key        string
	Body       []byte
	BodySHA256 [32]byte
	Currency   string
	Amount     int64
	RequestID  string
	TraceID    string
	Caller     string
}

// Claim is a call asking for the right to send its request with the key.
type Claim struct {
	Request
	// Owner is the claim, "<process>/<claim id>", unique to it.
	Owner string
	// OwnKeysOnly: the key may be used only by the caller that created its
	// record; another caller's record is NotOwned, and nothing of it is
	// told.
	OwnKeysOnly bool
	// LeaseTTL is how long the lease lasts; Window the settlement window a
	// fresh start opens; Quiet the provider quiet period: until its holder
	// records an outcome, a claim's request is presumed at the provider
	// until its lease ends plus Quiet.
	LeaseTTL, Window, Quiet time.Duration
	// MinSend is the least time a send needs: a record whose window closes
	// sooner is not claimed (PastWindow).
	MinSend time.Duration
	// Facts the claimant brings: Settled, that its store writes have been
	// healthy for the takeover grace; Pending, that its own process holds
	// an outcome for the key not yet written.
	Settled, Pending bool
	// AnswerBy, if set, is when the claimant's caller stops waiting, by
	// the store's clock: a claim that runs then or later (one a pooler
	// queued past its caller's deadline) writes nothing (Left). Were it
	// to acquire the record, no caller would follow its attempt, and if
	// its process died before releasing it, settlement would send a key
	// whose caller may have been told since that no payment exists.
	AnswerBy time.Time
}

// Settle is settlement considering one record: re-send it, give up on it,
// or leave it.
type Settle struct {
	Owner            string
	LeaseTTL, Quiet  time.Duration
	MinSend          time.Duration
	Settled, Pending bool
}

// Result is how an attempt's request ended, as its holder learnt it.
type Result uint8

const (
	// Paid: the provider answered 2xx.
	Paid Result = iota + 1
	// Refused: the provider refused the request before doing any work (a
	// 400, 401, 403, 429…): this request created nothing.
	Refused
	// Unknown: the request may have created a payment (no answer, or an
	// answer that proves nothing).
	Unknown
	// NothingSent: the holder sent nothing after all (too little of its
	// lease was left, paymentsd was too busy, its caller left before the
	// claim was known to be committed). It is not an attempt: it leaves no
	// journal row, counts no attempt and keeps the provider's last word.
	NothingSent
)

// Outcome is what the holder of an attempt learnt, to be written.
type Outcome struct {
	Owner  string
	Result Result
	// HTTPRequests counts the requests sent; ProviderStatus and Reply are
	// the provider's last answer (0, nil: none); Error and Code what the
	// call was answered.
	HTTPRequests   int
	ProviderStatus int
	Reply          []byte
	Error          string
	Code           int32
	// QuietFor is how much longer the request may still be at the
	// provider (it ended without the provider's answer), from now.
	QuietFor time.Duration
	// SettleAfter is how long settlement waits before re-sending an
	// OutcomeUnknown record.
	SettleAfter time.Duration
	// Row is a fact the store brings when the record is no longer held by
	// Owner: the journal row of Owner's attempt, if any.
	Row *Attempt
}

// Resolve is a person's finding about a record whose outcome is unknown.
type Resolve struct {
	// To is Succeeded (the provider created the payment) or NotCreated.
	To State
	// Reply, with Succeeded, is the payment as the person got it, or nil.
	Reply []byte
	// UnchangedSince, if set, is the record's UpdatedAt as the person saw
	// it: the record must not have changed since.
	UnchangedSince time.Time
}

func (Claim) event()   {}
func (Settle) event()  {}
func (Outcome) event() {}
func (Resolve) event() {}

// Verdict is what an event's author learns.
type Verdict uint8

const (
	// Acquired (Claim, Settle): the author holds the record and must send
	// its body, then write an Outcome.
	Acquired Verdict = iota + 1
	// Replay (Claim): the key's payment succeeded; answer from the record.
	Replay
	// Reused (Claim): the record holds another request.
	Reused
	// NotOwned (Claim): another caller's key; nothing of it may be told.
	NotOwned
	// Expired (Claim): retention tombstoned the key.
	Expired
	// Busy (Claim): another claim holds the record, or its holder's lease
	// expired and may not be taken over yet; wait for it to change.
	Busy
	// Left (Claim): the claim ran after its caller had stopped waiting
	// (AnswerBy); nothing was written, and nothing may be sent.
	Left
	// Quiet (Claim): an earlier request may still be at the provider;
	// nothing may be sent until QuietUntil.
	Quiet
	// PastWindow (Claim): the outcome is unknown and the settlement window
	// has closed (or closes before a send could end): nothing may be sent.
	PastWindow
	// GaveUp (Settle): the window closed unsettled; the record is marked,
	// once.
	GaveUp
	// NotDue (Settle): nothing to do now.
	NotDue
	// Written (Outcome): the outcome is on the record (also when a repeat
	// finds it written before).
	Written
	// Late (Outcome): a 2xx written after its holder lost the record.
	Late
	// LeaseLost (Outcome): the record is no longer the author's and the
	// outcome is not a 2xx (or left no trace): nothing is written.
	LeaseLost
	// Resolved (Resolve): the person's finding is on the record.
	Resolved
	// NotUnknown, InFlight, Changed (Resolve): refused, nothing written:
	// the record is not OutcomeUnknown; a request may be at the provider;
	// the record changed since the person looked.
	NotUnknown
	InFlight
	Changed
	// NoRecord (Resolve): the key has no record (or only a tombstone).
	NoRecord
)

var verdictNames = [...]string{"", "acquired", "replay", "reused", "not_owned", "expired", "busy", "left", "quiet",
	"past_window", "gave_up", "not_due", "written", "late", "lease_lost", "resolved", "not_unknown", "in_flight",
	"changed", "no_record"}

func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return "unknown"
}

// Write names the store's statement for a change: each is one guarded
// statement, writing the columns the change sets.
type Write uint8

const (
	// WriteNone: the record is unchanged.
	WriteNone Write = iota
	// WriteInsert: a new record, InProgress under the claim.
	WriteInsert
	// WriteAcquire: a claim of a record no one holds (NotCreated, or
	// OutcomeUnknown once quiet).
	WriteAcquire
	// WriteTakeOver: a claim of a record whose holder's lease expired: its
	// attempt ends abandoned.
	WriteTakeOver
	// WriteAbandon: a record whose holder's lease expired is no longer
	// held: its attempt ends abandoned, the record OutcomeUnknown (given
	// up when GaveUp is set).
	WriteAbandon
	// WriteGiveUp: an OutcomeUnknown record is marked given up.
	WriteGiveUp
	// WriteFinish: the holder's outcome. Guarded by the holder's lease:
	// it needs no read of the record.
	WriteFinish
	// WriteLate: a 2xx after its holder lost the record; its journal row
	// gets the answer.
	WriteLate
	// WriteResolve: a person's finding, with its audit entry.
	WriteResolve
)

var writeNames = [...]string{"none", "insert", "acquire", "take_over", "abandon", "give_up", "finish", "late", "resolve"}

func (w Write) String() string {
	if int(w) < len(writeNames) {
		return writeNames[w]
	}
	return "unknown"
}

// Effect is what Step tells the store and the event's author.
type Effect struct {
	Verdict Verdict
	Write   Write
	// Ended is the journal row of the attempt in flight this change ended,
	// if any: the holder's outcome, or an attempt abandoned by a takeover,
	// by giving up, or by a late 2xx.
	Ended *Attempt
	// Rewritten is the journal row a late 2xx rewrites: its attempt's,
	// which was abandoned, with the provider's answer.
	Rewritten *Attempt
}

// Step applies ev to r (nil: the key has no record) at now, the store's
// clock, and returns the record after it and its effect. r is not
// changed. A record Step returns with Write WriteNone is r itself.
func Step(r *Record, ev Event, now time.Time) (Record, Effect) {
	now = Stored(now)
	switch ev := ev.(type) {
	case Claim:
		return claim(r, ev, now)
	case Settle:
		return settle(r, ev, now)
	case Outcome:
		return outcome(r, ev, now)
	case Resolve:
		return resolve(r, ev, now)
	}
	panic("record: unknown event")
}

// MayTakeOver reports whether claimant may take over a record whose lease
// expired, held by holder: never one of its own process (its outcome is
// in that process's outbox and lands), and only once the claimant's store
// writes have been healthy for the takeover grace (settled), so that after
// an outage every live holder's outcome has landed first.
func MayTakeOver(claimant, holder string, settled bool) bool {
	if p := Process(claimant); p != "" && p == Process(holder) {
		return false
	}
	return settled
}

func same(r *Record) Record {
	if r == nil {
		return Record{}
	}
	return *r
}

func claim(r *Record, c Claim, now time.Time) (Record, Effect) {
	if !c.AnswerBy.IsZero() && !now.Before(c.AnswerBy) {
		return same(r), Effect{Verdict: Left}
	}
	if r == nil {
		return Record{
			Key: c.Key, Body: c.Body, BodySHA256: c.BodySHA256, Currency: c.Currency, Amount: c.Amount,
			State: InProgress, RequestID: c.RequestID, TraceID: c.TraceID, Caller: c.Caller,
			CreatedAt: now, UpdatedAt: now, SettleBy: Stored(now.Add(c.Window)),
			LeaseOwner: c.Owner, LeaseExpiresAt: Stored(now.Add(c.LeaseTTL)), QuietUntil: Stored(now.Add(c.LeaseTTL + c.Quiet)),
			AttemptSeq: 1, AttemptKind: ByCall, AttemptRequestID: c.RequestID, AttemptStartedAt: now, ReadAt: now,
		}, Effect{Verdict: Acquired, Write: WriteInsert}
	}
	found := func(v Verdict) (Record, Effect) { return same(r), Effect{Verdict: v} }
	switch {
	case c.OwnKeysOnly && r.Caller != c.Caller:
		return Record{}, Effect{Verdict: NotOwned}
	case !r.TombstonedAt.IsZero():
		return found(Expired)
	case r.BodySHA256 != c.BodySHA256:
		return found(Reused)
	case r.State == Succeeded:
		return found(Replay)
	case c.Pending:
		// This process's outbox holds an outcome for the key: it is
		// written first.
		return found(Busy)
	case r.State == InProgress && now.Before(r.LeaseExpiresAt):
		return found(Busy)
	case r.State == InProgress && !MayTakeOver(c.Owner, r.LeaseOwner, c.Settled):
		return found(Busy)
	case r.State == NotCreated:
		n := acquire(r, c.Owner, ByCall, c.RequestID, c.LeaseTTL, c.Quiet, now)
		n.SettleBy, n.GaveUp = Stored(now.Add(c.Window)), false
		return n, Effect{Verdict: Acquired, Write: WriteAcquire}
	}
	// OutcomeUnknown, or InProgress with an expired lease that c may take
	// over.
	if !now.Add(c.MinSend).Before(r.SettleBy) {
		if r.State == InProgress {
			n, ended := abandon(r, now)
			return n, Effect{Verdict: PastWindow, Write: WriteAbandon, Ended: ended}
		}
		return found(PastWindow)
	}
	if now.Before(r.QuietUntil) {
		return found(Quiet)
	}
	return takeOrAcquire(r, c.Owner, ByCall, c.RequestID, c.LeaseTTL, c.Quiet, now)
}

// takeOrAcquire claims r for owner: a takeover of an expired lease, whose
// attempt ends abandoned, or an acquisition of an unknown record.
func takeOrAcquire(r *Record, owner string, kind Kind, requestID string, lease, quiet time.Duration, now time.Time) (Record, Effect) {
	if r.State == InProgress {
		ended := r.InFlight()
		ended.EndedAt, ended.State, ended.Error, ended.Abandoned, ended.InFlight = now, OutcomeUnknown, AbandonedError, true, false
		return acquire(r, owner, kind, requestID, lease, quiet, now), Effect{Verdict: Acquired, Write: WriteTakeOver, Ended: &ended}
	}
	return acquire(r, owner, kind, requestID, lease, quiet, now), Effect{Verdict: Acquired, Write: WriteAcquire}
}

// acquire is r InProgress under owner's new attempt.
func acquire(r *Record, owner string, kind Kind, requestID string, lease, quiet time.Duration, now time.Time) Record {
	n := *r
	n.PriorState = r.State
	if r.State == NotCreated && r.Resolved() {
		// A person's word that nothing was created is not the
		// provider's: this attempt does not start the key afresh.
		n.PriorState = OutcomeUnknown
	}
	n.State = InProgress
	n.LeaseOwner, n.LeaseExpiresAt = owner, Stored(now.Add(lease))
	n.QuietUntil = Stored(now.Add(lease + quiet))
	n.AttemptSeq, n.AttemptKind, n.AttemptRequestID, n.AttemptStartedAt = r.AttemptSeq+1, kind, requestID, now
	n.UpdatedAt, n.ReadAt = now, now
	return n
}

// abandon ends r's attempt in flight, whose holder recorded nothing: the
// record is OutcomeUnknown, due for settlement, its quiet period kept.
func abandon(r *Record, now time.Time) (Record, *Attempt) {
	ended := r.InFlight()
	ended.EndedAt, ended.State, ended.Error, ended.Abandoned, ended.InFlight = now, OutcomeUnknown, AbandonedError, true, false
	n := *r
	n.State = OutcomeUnknown
	n.LeaseOwner, n.LeaseExpiresAt = "", time.Time{}
	n.NextSettleAt = now
	n.UpdatedAt, n.ReadAt = now, now
	return n, &ended
}

func settle(r *Record, s Settle, now time.Time) (Record, Effect) {
	notDue := func() (Record, Effect) { return same(r), Effect{Verdict: NotDue} }
	if r == nil || !r.TombstonedAt.IsZero() || s.Pending {
		return notDue()
	}
	switch r.State {
	case OutcomeUnknown:
		switch {
		case !now.Before(r.SettleBy):
			if r.GaveUp {
				return notDue()
			}
			n := *r
			n.GaveUp, n.UpdatedAt, n.ReadAt = true, now, now
			return n, Effect{Verdict: GaveUp, Write: WriteGiveUp}
		case now.Before(r.NextSettleAt), now.Before(r.QuietUntil), !now.Add(s.MinSend).Before(r.SettleBy):
			// Not yet; or too little of the window is left to send, and
			// it is given up when it closes.
			return notDue()
		}
		return takeOrAcquire(r, s.Owner, BySettlement, "", s.LeaseTTL, s.Quiet, now)
	case InProgress:
		if now.Before(r.LeaseExpiresAt) || !MayTakeOver(s.Owner, r.LeaseOwner, s.Settled) {
			return notDue()
		}
		if !now.Before(r.SettleBy) {
			n, ended := abandon(r, now)
			n.GaveUp = true
			return n, Effect{Verdict: GaveUp, Write: WriteAbandon, Ended: ended}
		}
		if now.Before(r.QuietUntil) || !now.Add(s.MinSend).Before(r.SettleBy) {
			return notDue()
		}
		return takeOrAcquire(r, s.Owner, BySettlement, "", s.LeaseTTL, s.Quiet, now)
	}
	return notDue()
}

func outcome(r *Record, o Outcome, now time.Time) (Record, Effect) {
	lost := func() (Record, Effect) { return same(r), Effect{Verdict: LeaseLost} }
	if r == nil {
		return lost()
	}
	if r.State != InProgress || r.LeaseOwner != o.Owner {
		return late(r, o, now)
	}
	n := *r
	n.LeaseOwner, n.LeaseExpiresAt = "", time.Time{}
	n.UpdatedAt, n.ReadAt = now, now
	n.QuietUntil, n.NextSettleAt = time.Time{}, time.Time{}
	if o.QuietFor > 0 {
		n.QuietUntil = Stored(now.Add(o.QuietFor))
	}
	switch o.Result {
	case Paid:
		n.State = Succeeded
	case Refused:
		n.State = NotCreated
	case Unknown:
		n.State = OutcomeUnknown
	case NothingSent:
		// Not an attempt: the next one takes its number, and the record
		// keeps the provider's last word.
		n.State = NotCreated
		n.AttemptSeq--
		if r.Requests == 0 {
			n.LastError, n.Code = o.Error, o.Code
		}
		if !r.Fresh() {
			n.State, n.NextSettleAt = OutcomeUnknown, Stored(now.Add(o.SettleAfter))
		}
		return n, Effect{Verdict: Written, Write: WriteFinish}
	}
	if n.State == NotCreated && !r.Fresh() {
		// An earlier attempt may have created the payment: a refusal of
		// this one proves nothing about it.
		n.State = OutcomeUnknown
	}
	if n.State == OutcomeUnknown {
		n.NextSettleAt = Stored(now.Add(o.SettleAfter))
	}
	n.Requests += o.HTTPRequests
	n.ProviderStatus, n.Reply, n.LastError, n.Code = o.ProviderStatus, o.Reply, o.Error, o.Code
	if r.AttemptKind == BySettlement {
		n.SettleAttempts++
	}
	ended := &Attempt{
		Number: r.AttemptSeq, Kind: r.AttemptKind, Owner: o.Owner, RequestID: r.AttemptRequestID,
		StartedAt: r.AttemptStartedAt, EndedAt: now, ProviderStatus: o.ProviderStatus, HTTPRequests: o.HTTPRequests,
		Reply: o.Reply, State: n.State, Code: o.Code, Error: o.Error,
	}
	return n, Effect{Verdict: Written, Write: WriteFinish, Ended: ended}
}

// late is Outcome for an author that no longer holds r.
func late(r *Record, o Outcome, now time.Time) (Record, Effect) {
	switch {
	case o.Row != nil && !o.Row.Abandoned:
		// Written before: a repeat after a commit whose outcome was
		// unknown.
		return *r, Effect{Verdict: Written}
	case o.Result != Paid || o.Row == nil || !r.TombstonedAt.IsZero():
		// Only a 2xx outlives its lease; and one whose attempt left no
		// trace has no place on this record.
		return *r, Effect{Verdict: LeaseLost}
	}
	// A 2xx is never forgotten: its abandoned row gets the answer, and the
	// record becomes Succeeded unless it is already (with its first
	// reply). A holder sending now has its attempt ended: its own outcome
	// will find the record Succeeded.
	row := *o.Row
	row.ProviderStatus, row.HTTPRequests, row.Reply = o.ProviderStatus, o.HTTPRequests, o.Reply
	row.State, row.Code, row.Error, row.Abandoned = Succeeded, o.Code, o.Error, false
	eff := Effect{Verdict: Late, Write: WriteLate, Rewritten: &row}
	n := *r
	n.Requests += o.HTTPRequests
	n.UpdatedAt, n.ReadAt = now, now
	if r.State == InProgress {
		_, eff.Ended = abandon(r, now)
	}
	if r.State != Succeeded {
		n.State = Succeeded
		n.ProviderStatus, n.Reply, n.LastError, n.Code = o.ProviderStatus, o.Reply, "", o.Code
		n.LeaseOwner, n.LeaseExpiresAt, n.NextSettleAt = "", time.Time{}, time.Time{}
	}
	return n, eff
}

func resolve(r *Record, res Resolve, now time.Time) (Record, Effect) {
	found := func(v Verdict) (Record, Effect) { return same(r), Effect{Verdict: v} }
	switch {
	case res.To != Succeeded && res.To != NotCreated:
		panic("record: a resolution is Succeeded or NotCreated")
	case r == nil || !r.TombstonedAt.IsZero():
		return same(r), Effect{Verdict: NoRecord}
	case r.State == InProgress:
		return found(InFlight)
	case r.State != OutcomeUnknown:
		return found(NotUnknown)
	case now.Before(r.QuietUntil):
		return found(InFlight)
	case !res.UnchangedSince.IsZero() && !r.UpdatedAt.Equal(Stored(res.UnchangedSince)):
		return found(Changed)
	}
	n := *r
	n.State = res.To
	n.UpdatedAt, n.ResolvedAt, n.ReadAt = now, now, now
	n.GaveUp = false
	n.LeaseOwner, n.LeaseExpiresAt, n.QuietUntil, n.NextSettleAt = "", time.Time{}, time.Time{}, time.Time{}
	if res.To == Succeeded {
		n.Reply, n.ProviderStatus, n.LastError, n.Code = bytes.Clone(res.Reply), 0, "", 0
	}
	return n, Effect{Verdict: Resolved, Write: WriteResolve}
}
