package main

import (
	"time"

	paymentsv1 "example.com/paymentsd/gen/payments/v1"
	"example.com/paymentsd/internal/simulator"
)

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
