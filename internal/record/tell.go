package record

// Told is what a call tells its caller about the money.
type Told uint8

const (
	// Wait: nothing may be told yet; the call waits for its next step.
	Wait Told = iota
	// TellPaid: the payment exists, and its record says so durably.
	TellPaid
	// TellNotCreated: no payment exists for the key, and the record says
	// so durably: the caller may pay again under a new key.
	TellNotCreated
	// TellUnknown: a payment may exist: retry with the same key, never a
	// new one.
	TellUnknown
	// TellInProgress: the call's request (or another call's) is at the
	// provider now: retry with the same key to learn its outcome.
	TellInProgress
	// TellNotSent: this call sent nothing, and read nothing it could tell:
	// retry with the same key, or look it up.
	TellNotSent
)

var toldNames = [...]string{"wait", "paid", "not_created", "unknown", "in_progress", "not_sent"}

func (t Told) String() string {
	if int(t) < len(toldNames) {
		return toldNames[t]
	}
	return "unknown"
}

// ClaimState is how far a call's claim has got.
type ClaimState uint8

const (
	// ClaimQueued: the claim has not run (it waits for the writer): it
	// read nothing yet, and once its caller leaves it never runs.
	ClaimQueued ClaimState = iota
	// ClaimRunning: the claim has run in a transaction not yet committed:
	// its verdict is not final, and it may commit after its caller leaves
	// (then its claim is released, nothing sent).
	ClaimRunning
	// ClaimFailed: the claim's transaction failed; nothing was written.
	ClaimFailed
	// ClaimUnknown: the claim's commit was sent and no answer came: it may
	// hold the record (then it is released, nothing sent).
	ClaimUnknown
	// ClaimAcquired: the claim committed, and holds the record.
	ClaimAcquired
)

// Call is a call's progress, as Tell reads it.
type Call struct {
	Claim ClaimState
	// SawMaybe: the claim read a record on which an earlier attempt may
	// have created a payment (InProgress, OutcomeUnknown or Succeeded),
	// committed or not.
	SawMaybe bool
	// Fresh: the acquired attempt starts the key afresh (Record.Fresh).
	Fresh bool
	// Sent: the provider call has ended, with Result. Before then the
	// request may be at the provider.
	Sent   bool
	Result Result
	// Written: the outcome's commit has landed. Lost: the store refused
	// it for good (another claim has the record).
	Written, Lost bool
	// Due: the call must be answered now (its deadline, less the margin
	// kept to answer it, has come); Patience: for a NotCreated outcome,
	// the call has waited as long as it waits for its commit.
	Due, Patience bool
}

// Tell says what a call that acquired (or tried to acquire) a record tells
// its caller, given how far it got. A caller hears OK only once the 2xx is
// committed, and NOT_CREATED only once that is; at its deadline with
// either still on its way, it hears that the outcome is unknown (the
// outbox goes on writing it, and a retry with the same key learns it).
// Verdicts other than Acquired are answered from the record, not here.
func Tell(c Call) Told {
	switch c.Claim {
	case ClaimQueued, ClaimRunning:
		if !c.Due {
			return Wait
		}
		fallthrough
	case ClaimFailed, ClaimUnknown:
		if c.SawMaybe && c.Claim != ClaimQueued {
			return TellUnknown
		}
		return TellNotSent
	}
	if !c.Sent {
		if c.Due {
			return TellInProgress
		}
		return Wait
	}
	switch c.Result {
	case Paid:
		switch {
		case c.Written:
			return TellPaid
		case c.Due || c.Lost:
			return TellUnknown
		}
		return Wait
	case Refused, NothingSent:
		switch {
		case !c.Fresh:
			return TellUnknown
		case c.Written:
			return TellNotCreated
		case c.Due || c.Patience || c.Lost:
			return TellUnknown
		}
		return Wait
	}
	return TellUnknown
}

// TellFrom says what a call answered from a record tells its caller: the
// record its claim found Succeeded (Replay), or the one another claim left
// when the call stopped waiting for it (Busy). Wait: the call claims
// again, for the record is in flight, or NotCreated. A call tells
// NOT_CREATED only of its own attempt: the record another claim left
// NotCreated may be a claim that sent nothing (its caller left, and was
// told so), or a person's word, and either way the next claim starts the
// key afresh and sends, so what this caller hears is that attempt's
// answer.
func TellFrom(r *Record) Told {
	switch r.State {
	case Succeeded:
		return TellPaid
	case OutcomeUnknown:
		return TellUnknown
	}
	return Wait
}
