// Package record is the life of a payment record as one state machine.
//
// A record is paymentsd's durable memory of one idempotency key: the
// request to send, what became of each attempt to send it, and who may
// send it next. Every change to a record is an event applied by Step, a
// pure function: it reads the record as the store holds it and the event,
// and returns the record after the event and what the event's author must
// do next (an Effect: send the request, answer from the record, wait, or
// nothing). The store runs one named statement per kind of change
// (Effect.Write), writing what Step computed; the payment engine calls
// Step's verdicts and Tell, which says what a call's caller is told, and
// does nothing else that decides. No I/O, no goroutines, no clock: the
// store's clock comes in as now.
//
// The rules that keep the money safe, which the checker in this package's
// tests proves over every fault schedule up to a bound:
//
//   - A request is sent only by the holder of a committed claim (the
//     record InProgress under its lease), and only while no earlier request
//     for the key may still be at the provider (QuietUntil).
//   - A call's claim acquires only while its caller waits (AnswerBy): one
//     that runs later, queued in a pooler, writes nothing, so no attempt
//     starts that no caller follows.
//   - An expired lease is taken over only by another process whose store
//     writes have been healthy for the takeover grace, and never while the
//     claimant's own process holds an unwritten outcome for the key: after
//     any outage the holder's outcome, retried by its outbox, lands first.
//   - Succeeded is final: no event leaves it, and a 2xx learnt after its
//     holder lost the record still makes the record Succeeded.
//   - NotCreated is written only for an attempt that starts the key afresh
//     (no earlier attempt may have created a payment, and no person's
//     word stands in for that proof) and whose request was refused before
//     any work, or never sent.
//   - A caller hears OK only once the 2xx is committed, and NOT_CREATED
//     only once that is committed (Tell), and never on a person's word
//     (TellFrom).
//
// They hold only with a store that never loses a commit it acknowledged:
// an asynchronous failover that does can take a record a caller was told
// OK of back to an earlier unknown attempt, which settlement then sends
// again (the checker shows it).
package record

import (
	"strings"
	"time"
)

// State is what a record says about a payment's money.
type State uint8

const (
	// InProgress: the holder of the record's lease may be sending a
	// request for the key now. A payment may exist.
	InProgress State = 1
	// Succeeded: the provider answered 2xx (or a person found the payment);
	// Reply holds its body. Final.
	Succeeded State = 2
	// NotCreated: no attempt for the key can have created a payment.
	NotCreated State = 3
	// OutcomeUnknown: some attempt may have created a payment and no 2xx
	// has confirmed it. Settlement re-sends the body until SettleBy.
	OutcomeUnknown State = 4
)

func (s State) String() string {
	switch s {
	case InProgress:
		return "in_progress"
	case Succeeded:
		return "succeeded"
	case NotCreated:
		return "not_created"
	case OutcomeUnknown:
		return "outcome_unknown"
	}
	return "unspecified"
}

// Kind says who made an attempt.
type Kind uint8

const (
	// ByCall: a CreateMultiCardPayment call sent it.
	ByCall Kind = 1
	// BySettlement: settlement re-sent the recorded body.
	BySettlement Kind = 2
)

func (k Kind) String() string {
	switch k {
	case ByCall:
		return "call"
	case BySettlement:
		return "settlement"
	}
	return "unspecified"
}

// Record is the durable record of one idempotency key.
type Record struct {
	Key string
	// Body is the exact provider request body (never the API key), and
	// BodySHA256 its hash, which decides whether a later call is the same
	// request. Currency and Amount are the request, for lookups.
	Body       []byte
	BodySHA256 [32]byte
	Currency   string
	Amount     int64

	State State
	// Requests counts the HTTP requests sent to the provider for the key,
	// by every attempt.
	Requests int
	// ProviderStatus (0: none), Reply, LastError and Code are the
	// provider's last word: the status and body of the last answer the
	// provider gave (the payment when Succeeded), why the last attempt that
	// sent something failed ("" after a success), and the status code its
	// call was answered with. An attempt that sent nothing leaves them as
	// they were. Code is the service's vocabulary, opaque here.
	ProviderStatus int
	Reply          []byte
	LastError      string
	Code           int32

	// RequestID, TraceID and Caller identify the call that created the
	// record.
	RequestID string
	TraceID   string
	Caller    string

	CreatedAt time.Time
	UpdatedAt time.Time
	// SettleBy ends the settlement window: no request for the key is sent
	// after it. It is set when an attempt starts the key afresh.
	SettleBy time.Time
	// NextSettleAt is when settlement may next re-send an OutcomeUnknown
	// record; SettleAttempts counts settlement's attempts.
	NextSettleAt   time.Time
	SettleAttempts int
	// LeaseOwner holds the record while it is InProgress, until
	// LeaseExpiresAt: "<process>/<claim id>", unique to the claim.
	LeaseOwner     string
	LeaseExpiresAt time.Time
	// GaveUp is set once, when an unknown record's window has closed.
	GaveUp bool
	// QuietUntil is until when the key's last request may still be at
	// the provider: nothing may be sent with the key before then.
	QuietUntil time.Time
	// PriorState is the state the latest attempt's claim found: 0 for a
	// new record, NotCreated when the key started afresh, OutcomeUnknown
	// or InProgress when an earlier attempt may have created the payment
	// (OutcomeUnknown also after a person's NotCreated resolution: a
	// person's word is not the provider's).
	PriorState State
	// TombstonedAt, if set, is when retention wrote the key's tombstone:
	// the key has expired for good.
	TombstonedAt time.Time
	// ResolvedAt, if set, is when a person last resolved the record.
	ResolvedAt time.Time
	// AttemptSeq numbers the latest attempt (1 for the first), made by
	// AttemptKind for the call AttemptRequestID, claimed at
	// AttemptStartedAt. While InProgress it is the attempt in flight.
	AttemptSeq       int
	AttemptKind      Kind
	AttemptRequestID string
	AttemptStartedAt time.Time

	// ReadAt is the store's clock when the record was read or written.
	ReadAt time.Time
}

// Fresh reports whether the record's latest attempt started the key
// afresh: no earlier attempt may have created a payment. Only such an
// attempt may end NotCreated.
func (r *Record) Fresh() bool { return r.PriorState == 0 || r.PriorState == NotCreated }

// Resolved reports whether the record's state is a person's resolution:
// it was resolved, no attempt has started since, and no late 2xx has
// made it the provider's (a person's Succeeded has no provider status).
// Its audit entries outlive that.
func (r *Record) Resolved() bool {
	return !r.ResolvedAt.IsZero() && !r.AttemptStartedAt.After(r.ResolvedAt) &&
		!(r.State == Succeeded && r.ProviderStatus != 0)
}

// Attempt is one attempt to send a key's request, as its journal row
// keeps it once it has ended: the claim of the record by a call or by
// settlement, and what came of it.
type Attempt struct {
	Number    int
	Kind      Kind
	Owner     string
	RequestID string
	StartedAt time.Time
	// EndedAt is when it ended; zero while InFlight.
	EndedAt time.Time
	// ProviderStatus and Reply are the provider's answer (0, nil: none),
	// HTTPRequests the requests it sent (0 when abandoned: not known).
	ProviderStatus int
	HTTPRequests   int
	Reply          []byte
	// State is the state it left the record in; Code and Error what its
	// caller was answered.
	State State
	Code  int32
	Error string
	// Abandoned: its holder recorded no outcome (it died, or lost the
	// database for longer than its lease); whoever took the record over
	// or gave it up ended it. Its request may have reached the provider.
	Abandoned bool
	// InFlight: being made now.
	InFlight bool
}

// Replica is the process part of a lease owner "<process>/<claim id>".
func (a Attempt) Replica() string { return Process(a.Owner) }

// Process is the process part of a lease owner, "<process>/<claim id>";
// "" for an owner with none.
func Process(owner string) string {
	p, _, ok := strings.Cut(owner, "/")
	if !ok {
		return ""
	}
	return p
}

// AbandonedError is the Error of an abandoned attempt.
const AbandonedError = "abandoned: no answer recorded"

// InFlight is r's attempt in flight, as the record holds it.
func (r *Record) InFlight() Attempt {
	return Attempt{
		Number: r.AttemptSeq, Kind: r.AttemptKind, Owner: r.LeaseOwner,
		RequestID: r.AttemptRequestID, StartedAt: r.AttemptStartedAt, State: InProgress, InFlight: true,
	}
}

// Stored is t as the store keeps it: UTC, to the microsecond both backends
// keep. Step writes only stored times, so a record it returns is what
// reading it back gives.
func Stored(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.Truncate(time.Microsecond).UTC()
}
