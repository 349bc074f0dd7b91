package main

import (
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
)

// Kinds of call in the history.
const (
	// kindCreate is one CreateMultiCardPayment a raw gRPC caller made.
	kindCreate = "create"
	// kindAttempt is one CreateMultiCardPayment that paymentsclient.Create
	// made on a client caller's behalf.
	kindAttempt = "attempt"
	// kindClient is one paymentsclient.Create, over all its attempts.
	kindClient = "client"
)

// Verdicts: what a call told its caller about the money.
const (
	verdictOK         = "ok"          // the payment, with its reply
	verdictNotCreated = "not_created" // no payment exists: the caller may pay again under a new key
	verdictRetry      = "retry"       // nothing settled: the caller retries with the same key
	verdictUnknown    = "unknown"     // the caller gives up not knowing (paymentsclient's ErrOutcomeUnknown, ErrInProgress)
	verdictRefused    = "refused"     // a final refusal of a valid request with the caller's own key: never expected
)

// call is one call in the history.
type call struct {
	Caller int    `json:"caller"`
	Kind   string `json:"kind"`
	Key    string `json:"key"`
	// Replica is the paymentsd replica the call went to, or -1 for a
	// kindClient call (its attempts, recorded too, went to both).
	Replica int `json:"replica"`
	// REST: a kindCreate call made over REST (no deadline), not gRPC.
	REST       bool       `json:"rest,omitempty"`
	Start, End time.Time  `json:"-"`
	Code       codes.Code `json:"-"`
	// Reason is paymentsd's ErrorInfo reason, or "".
	Reason string `json:"reason,omitempty"`
	// Reply is the payment_json the caller was told, for a success.
	Reply []byte `json:"reply,omitempty"`
	// Verdict is what the call told the caller (verdict*).
	Verdict string `json:"verdict"`
	// Answered: paymentsd answered (a success, or an error with an
	// ErrorInfo reason). An unanswered call, cut off or lost with its
	// connection, may still reach paymentsd, or have reached it.
	Answered bool `json:"answered"`
	// Final: the caller's last call for the key, whose verdict it acts on.
	Final bool `json:"final"`
}

func (c call) ok() bool { return c.Verdict == verdictOK }

// history is the calls of a run, recorded as they end.
type history struct {
	mu    sync.Mutex
	calls []call
}

func (h *history) add(c call) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, c)
}

// all returns the calls so far, by start time.
func (h *history) all() []call {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := slices.Clone(h.calls)
	slices.SortStableFunc(out, func(a, b call) int { return a.Start.Compare(b.Start) })
	return out
}
