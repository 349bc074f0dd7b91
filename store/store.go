// Package store is paymentsd's durable state: one record per idempotency
// key (the payment's request, state, provider reply and lease) and the
// webhook inbox. Its records, states and transitions live here; the two
// backends, SQLite (the embedded default, pure Go) and PostgreSQL (for
// replicas sharing one database), sit beneath it behind one contract that
// one conformance suite checks.
//
// The store never holds a transaction open across a call to the provider:
// Begin commits the record (and its lease) before anything is sent, and
// Finish commits the outcome after the provider answers.
package store

import (
	"context"
	"errors"
	"time"
)

// State is what a record says about a payment's money.
type State int

const (
	// StateInProgress: a request for the key is being sent now, by the
	// holder of the record's lease. A payment may exist.
	StateInProgress State = 1
	// StateSucceeded: the provider answered 2xx; Reply holds its body.
	StateSucceeded State = 2
	// StateNotCreated: no attempt for the key can have created a payment.
	StateNotCreated State = 3
	// StateOutcomeUnknown: some attempt may have created a payment and no
	// 2xx has confirmed it. Settlement re-sends the body until SettleBy.
	StateOutcomeUnknown State = 4
)

func (s State) String() string {
	switch s {
	case StateInProgress:
		return "in_progress"
	case StateSucceeded:
		return "succeeded"
	case StateNotCreated:
		return "not_created"
	case StateOutcomeUnknown:
		return "outcome_unknown"
	}
	return "unspecified"
}

// Errors. Every error a Store returns wraps one of these or is a failure of
// the database itself; none contains a database password.
var (
	// ErrNotFound: no record for the key.
	ErrNotFound = errors.New("no record for that idempotency key")
	// ErrLeaseLost: the caller of Finish no longer holds the record's lease
	// (it expired and another owner took the record over). Nothing was
	// written.
	ErrLeaseLost = errors.New("lease on the record was lost")
	// ErrWrongEnvironment: the database is stamped with the other provider
	// environment.
	ErrWrongEnvironment = errors.New("database belongs to another provider environment")
	// ErrKeyNotStorable: the key can't be stored exactly by this backend
	// (for example a NUL byte in PostgreSQL).
	ErrKeyNotStorable = errors.New("idempotency key can't be stored exactly")
)

// Record is the durable record of one idempotency key.
type Record struct {
	Key string
	// Body is the exact provider request body (never the API key), and
	// BodySHA256 its hash, which decides whether a later call is the same
	// request.
	Body       []byte
	BodySHA256 [32]byte
	// Currency and Amount are the recorded request, for lookups.
	Currency string
	Amount   int64

	State State
	// Attempts counts requests sent to the provider for this key, by every
	// call and by settlement.
	Attempts int
	// ProviderStatus is the provider's last HTTP status (0: none), and
	// Reply its last reply body exactly (a 2xx body when Succeeded, else
	// the error body, or nil).
	ProviderStatus int
	Reply          []byte
	// LastError says why the last attempt failed ("" after a success), and
	// Code is the status code its call was answered with. Code is the
	// service's vocabulary; the store keeps it opaque.
	LastError string
	Code      int32

	// RequestID, TraceID and Caller identify the call that created the
	// record.
	RequestID string
	TraceID   string
	Caller    string

	CreatedAt time.Time
	UpdatedAt time.Time
	// SettleBy ends the settlement window: no request for the key is sent
	// after it. It is set when the first attempt that may create a payment
	// begins (a new record, or one that was NotCreated).
	SettleBy time.Time
	// NextSettleAt is when settlement may next re-send an OutcomeUnknown
	// record; SettleAttempts counts its re-sends.
	NextSettleAt   time.Time
	SettleAttempts int
	// LeaseOwner holds the record while it is InProgress, until
	// LeaseExpiresAt. An expired lease means its holder died or hung.
	LeaseOwner     string
	LeaseExpiresAt time.Time
	// GaveUp is set once when an unknown record passes SettleBy.
	GaveUp bool
}

// Claim asks Begin for the right to send a request for a key.
type Claim struct {
	Key        string
	Body       []byte
	BodySHA256 [32]byte
	Currency   string
	Amount     int64
	RequestID  string
	TraceID    string
	Caller     string
	// Owner identifies the claimant (process and call) for the lease.
	Owner string
	// Now is the current time; LeaseUntil ends the lease if acquired;
	// SettleBy ends the settlement window if the claim starts one.
	Now        time.Time
	LeaseUntil time.Time
	SettleBy   time.Time
}

// Outcome is Begin's verdict on a Claim.
type Outcome int

const (
	// Acquired: the record is now InProgress with the claimant's lease,
	// committed; the claimant must send Body and call Finish.
	Acquired Outcome = iota + 1
	// Replay: the key's payment succeeded; answer from the record.
	Replay
	// Reused: the key's record holds a different request (another
	// BodySHA256); nothing changed.
	Reused
	// Busy: another owner holds an unexpired lease; nothing changed.
	Busy
	// PastWindow: the record's outcome is unknown and its settlement window
	// has closed, so nothing may be sent for the key again; the record is
	// left OutcomeUnknown (an expired InProgress record becomes
	// OutcomeUnknown).
	PastWindow
)

// Began is the result of Begin.
type Began struct {
	Outcome Outcome
	// Record is the record after Begin: as found, or as acquired.
	Record Record
	// Prior is the record's state before an acquisition: 0 for a new
	// record; NotCreated, OutcomeUnknown, or InProgress with an expired
	// lease. A claimant that acquires a record whose Prior is not 0 or
	// NotCreated must never record it NotCreated: an earlier attempt may
	// have created the payment.
	Prior State
}

// Finish records the outcome of the claimant's request.
type Finish struct {
	Key   string
	Owner string
	// State is Succeeded, NotCreated or OutcomeUnknown.
	State          State
	AddAttempts    int
	ProviderStatus int
	Reply          []byte
	LastError      string
	Code           int32
	Now            time.Time
	// NextSettleAt, for OutcomeUnknown, is when settlement may re-send.
	NextSettleAt time.Time
	// Settlement marks a finish by the settlement worker: SettleAttempts
	// is incremented.
	Settlement bool
}

// Stats are gauges for metrics.
type Stats struct {
	// ByState counts records in each state.
	ByState map[State]int64
	// Unsettled counts OutcomeUnknown records past their settlement window.
	Unsettled int64
	// Events counts stored webhook events.
	Events int64
}

// Header is one HTTP header field of a webhook delivery.
type Header struct {
	Name, Value string
}

// Event is one webhook delivery in the inbox.
type Event struct {
	// Sequence is assigned by AppendEvent. Sequences commit in order: a
	// reader that has seen sequence n will never later find an event < n
	// appear.
	Sequence    int64
	ReceivedAt  time.Time
	ContentType string
	Headers     []Header
	Body        []byte
	BodySHA256  [32]byte
	// DuplicateOf is the lowest sequence of a stored event with the same
	// BodySHA256, or 0. Assigned by AppendEvent.
	DuplicateOf int64
}

// Options tunes Open. The zero value is sensible.
type Options struct{}

// Store is an open record store. It is safe for concurrent use.
type Store struct{}

// Open opens the store that url names, runs the embedded migrations (safe
// when several replicas start at once), and stamps the database with env on
// first use, refusing (ErrWrongEnvironment) a database stamped with another.
// url is "sqlite:PATH" (PATH may be ":memory:"), or "postgres://…" /
// "postgresql://…". Errors never contain the URL's password.
func Open(ctx context.Context, url, env string, opts Options) (*Store, error) {
	panic("store: not implemented yet")
}

// Close closes the database.
func (s *Store) Close() error { panic("store: not implemented yet") }

// Backend is "sqlite" or "postgres".
func (s *Store) Backend() string { panic("store: not implemented yet") }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { panic("store: not implemented yet") }

// Begin decides, in one transaction, what a call with c.Key may do:
//   - no record: insert it InProgress with c's lease and window → Acquired;
//   - a record with another BodySHA256 → Reused;
//   - Succeeded → Replay;
//   - InProgress with an unexpired lease → Busy;
//   - OutcomeUnknown, or InProgress with an expired lease, before SettleBy →
//     Acquired (keeping SettleBy), Prior set;
//   - the same past SettleBy → PastWindow;
//   - NotCreated → Acquired with a new window (c.SettleBy), Prior set.
//
// It returns ErrKeyNotStorable for a key the backend can't hold exactly.
func (s *Store) Begin(ctx context.Context, c Claim) (Began, error) {
	panic("store: not implemented yet")
}

// Finish records f's outcome if f.Owner still holds the lease, clearing it,
// and returns the record; otherwise it returns ErrLeaseLost and writes
// nothing.
func (s *Store) Finish(ctx context.Context, f Finish) (Record, error) {
	panic("store: not implemented yet")
}

// Get returns the record for key, or ErrNotFound.
func (s *Store) Get(ctx context.Context, key string) (Record, error) {
	panic("store: not implemented yet")
}

// ClaimDue takes the lease (owner, until leaseUntil) on up to limit records
// due for settlement at now, marking them InProgress, and returns them:
// OutcomeUnknown records with NextSettleAt <= now, and InProgress records
// whose lease expired, both only while now < SettleBy. Replicas never claim
// the same record at once.
func (s *Store) ClaimDue(ctx context.Context, owner string, now, leaseUntil time.Time, limit int) ([]Record, error) {
	panic("store: not implemented yet")
}

// GiveUp marks up to limit records whose settlement window closed at or
// before now, unsettled and not yet marked: OutcomeUnknown records, and
// InProgress records with an expired lease (which become OutcomeUnknown).
// It returns the records it marked, each once ever, for logging.
func (s *Store) GiveUp(ctx context.Context, now time.Time, limit int) ([]Record, error) {
	panic("store: not implemented yet")
}

// Stats counts records by state, unsettled records past their window, and
// stored events.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	panic("store: not implemented yet")
}

// DeleteBefore deletes up to limit records last updated before t (never
// InProgress ones) and up to limit events received before t, and returns
// how many rows it deleted in all. Call it repeatedly for small batches.
func (s *Store) DeleteBefore(ctx context.Context, t time.Time, limit int) (int, error) {
	panic("store: not implemented yet")
}

// AppendEvent stores e durably, assigning its Sequence and DuplicateOf,
// and returns it once committed.
func (s *Store) AppendEvent(ctx context.Context, e Event) (Event, error) {
	panic("store: not implemented yet")
}

// ListEvents returns up to limit events with Sequence > after, in order.
func (s *Store) ListEvents(ctx context.Context, after int64, limit int) ([]Event, error) {
	panic("store: not implemented yet")
}

// LastSequence returns the highest committed event sequence, or 0.
func (s *Store) LastSequence(ctx context.Context) (int64, error) {
	panic("store: not implemented yet")
}
