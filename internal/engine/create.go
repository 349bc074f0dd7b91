package engine

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store"
	"example.com/paymentsd/internal/upstream"
)

// Payment is what a call asks for.
type Payment struct {
	Key      string
	Currency string
	Amount   int64
	// Caller is the caller's identity, "" without one. With OwnKeysOnly
	// the key may be used only by the caller that created its record.
	Caller      string
	OwnKeysOnly bool
	// RequestID and TraceID identify the call, for its record.
	RequestID, TraceID string
}

// Answer is what a call learnt, for the transport to turn into a response
// or a status: either what its own attempt (or failed claim) tells
// (Told, by record.Tell), or, with From set, the record it was answered
// from.
type Answer struct {
	Told record.Told
	// From is the verdict of a claim answered from the key's record:
	// Replay, Reused, NotOwned, Expired, Quiet, PastWindow; or Busy: the
	// call waited for another claim of the key, which ended as Record says;
	// or Late: the call's 2xx landed after its claim had lost the record,
	// which is Succeeded as Record says. Record is set with From, and
	// Tombstone with Expired; both are pointers so that an Answer is small
	// (it is on the stack of the goroutines that wait for one).
	From      record.Verdict
	Record    *record.Record
	Tombstone *store.Tombstone
	// Reply is the provider's 2xx, with TellPaid, or with TellUnknown when
	// it is not yet committed.
	Reply *upstream.Reply
	// Err is the provider call's failure, after a send; or the record
	// store's, or the encoding's, when nothing was sent.
	Err error
	// Fresh: the attempt started the key afresh (no earlier attempt may
	// have created a payment).
	Fresh bool
	// Sent: this call's attempt sent a request (Err, Reply say how it
	// ended); otherwise Why says why it sent nothing.
	Sent bool
	Why  Why
}

// Why says why an attempt sent nothing.
type Why uint8

const (
	// TooBusy: paymentsd waits on too many provider requests.
	TooBusy Why = iota + 1
	// TooLate: the store committed the claim so late that too little of
	// the lease (or settlement window) was left to send in.
	TooLate
	// CallerLeft: the caller stopped waiting before the claim was known to
	// be committed.
	CallerLeft
)

// ErrEncode: the request could not be encoded for the provider; nothing
// was sent.
var ErrEncode = errors.New("the request could not be encoded")

// notCreatedWait bounds how long a call that learnt that no payment was
// created waits for its record to say so: past it, the caller is told the
// outcome is unknown (the outbox goes on writing it).
const notCreatedWait = 5 * time.Second

// Create makes the payment p asks for, or answers it from the key's record.
//
// The record is claimed, and committed, before anything is sent; the
// request runs detached from the caller, bounded by its lease, and its
// outcome is written by the outbox whenever it comes. The caller hears OK
// only once the 2xx is committed, and NOT_CREATED only once that is; at
// its deadline it hears that the request is at the provider, or that the
// outcome is unknown (record.Tell).
//
// The caller's goroutine waits in answer, for as long as the provider
// takes: the claim's large values (the claim, the store's answer) are in
// claim's frame, which has returned by then, so that the goroutine's stack
// while it waits is small (BenchmarkInFlight).
func (e *Engine) Create(ctx context.Context, p Payment) Answer {
	ctx, cancel := answerBy(ctx)
	defer cancel()
	a, answered := e.claim(ctx, p)
	if a == nil {
		return answered
	}
	return e.answer(ctx, a)
}

// claim claims p's key, and starts the attempt that acquired it; or
// returns what the call learnt without one (a nil attempt).
func (e *Engine) claim(ctx context.Context, p Payment) (*attempt, Answer) {
	body, err := upstream.EncodeRequest(upstream.Payment{Currency: p.Currency, Amount: p.Amount, IdempotencyKey: p.Key})
	if err != nil {
		return nil, Answer{Told: record.TellNotSent, Err: fmt.Errorf("%w: %w", ErrEncode, err)}
	}
	c := record.Claim{
		Request: record.Request{Key: p.Key, Body: body, BodySHA256: sha256.Sum256(body), Currency: p.Currency,
			Amount: p.Amount, RequestID: p.RequestID, TraceID: p.TraceID, Caller: p.Caller},
		OwnKeysOnly: p.OwnKeysOnly,
		LeaseTTL:    e.leaseTTL, Window: e.window, Quiet: e.quiet, MinSend: e.minSend(),
	}
	for {
		// An outcome this process holds for the key is written first, so
		// that the claim sees it (record.Claim.Pending covers one that
		// comes between).
		if !e.Await(ctx, p.Key) {
			return nil, Answer{Told: record.TellInProgress}
		}
		c.Owner = e.owner()
		c.Pending = e.outbox.pendingFor(p.Key) != nil
		// The lease is counted from before the claim could commit, on this
		// process's monotonic clock (see sendBy).
		claimedAt := time.Now()
		began, err := e.store.Begin(ctx, c, e.afterCaller(c.Key, c.Owner))
		e.metrics.StoreOp(OpBegin, claimedAt, err)
		if err != nil {
			return nil, e.claimFailed(ctx, c.Key, c.Owner, err)
		}
		switch began.Verdict {
		case record.Acquired:
			return e.start(ctx, &began.Record, claimedAt), Answer{}
		case record.Busy:
			if a, again := e.busy(ctx, c.Key, &began.Record); !again {
				return nil, a
			}
			// Its holder's lease expired, or a person resolved it
			// NOT_CREATED (which lets a new attempt start, and is never
			// told): claim again.
			continue
		case record.Left:
			// The claim ran only once its caller's deadline had come, and
			// wrote nothing.
			return nil, Answer{Told: record.TellNotSent, Err: ctx.Err()}
		case record.Replay:
			e.metrics.replays.Inc()
		case record.Reused:
			e.metrics.reuses.Inc()
		case record.Quiet:
			e.metrics.quietWaits.Inc()
		case record.Expired:
			e.metrics.expired.Inc()
		}
		return nil, Answer{From: began.Verdict, Record: &began.Record, Tombstone: &began.Tombstone}
	}
}

// busy waits for held, the record of key another claim holds, to
// change, and returns what the call is told then; or reports that the call
// may claim the key again. It is a function of its own, so that
// claim's frame (on the stack of every call, and as deep) has no room for
// the records it waits with.
//
//go:noinline
func (e *Engine) busy(ctx context.Context, key string, held *record.Record) (a Answer, again bool) {
	rec, ok := e.await(ctx, key, *held)
	switch {
	case !ok:
		return Answer{Told: record.TellInProgress}, false
	case record.TellFrom(&rec) == record.Wait:
		return Answer{}, true
	}
	return Answer{From: record.Busy, Record: &rec}, false
}

// claimFailed is the answer of a call whose claim of key, as owner,
// failed, or whose commit it could not wait for. Nothing was sent by it,
// whatever the store did: a claim this call can no longer follow is
// released by its continuation (afterCaller) if it committed.
func (e *Engine) claimFailed(ctx context.Context, key, owner string, err error) Answer {
	if errors.Is(err, store.ErrKeyNotStorable) {
		return Answer{Told: record.TellNotCreated, Err: err}
	}
	call := record.Call{Claim: record.ClaimFailed, Due: true}
	var pending *store.ClaimPendingError
	if errors.As(err, &pending) {
		call.Claim, call.SawMaybe = record.ClaimQueued, pending.SawMaybe
		if pending.Ran {
			call.Claim = record.ClaimRunning
		}
	}
	if errors.Is(err, store.ErrCommitUnknown) {
		// The claim may hold the record: release it.
		call.Claim = record.ClaimUnknown
		e.outbox.release(key, owner)
	}
	if ctx.Err() == nil {
		e.logger.ErrorContext(ctx, "record store failed", slog.String("error", err.Error()))
	}
	return Answer{Told: record.Tell(call), Err: err}
}

// afterCaller is the continuation of owner's claim of key, for when its
// caller stopped waiting before the claim's commit was known: a claim that
// committed after all is released, nothing sent; one whose commit is
// unknown is released if it holds the record.
func (e *Engine) afterCaller(key, owner string) func(*store.Began, error) {
	return func(b *store.Began, err error) {
		switch {
		case err == nil && b.Verdict == record.Acquired:
			rec := b.Record
			e.outbox.finish(&rec, e.nothingSent(&rec, CallerLeft))
		case errors.Is(err, store.ErrCommitUnknown):
			e.outbox.release(key, owner)
		}
	}
}

// answerBy shortens the caller's deadline by a small margin, so that when
// it is about to expire paymentsd can still send its own answer, with the
// details that say what happened to the money, before the caller's side
// gives up with a bare DeadlineExceeded.
func answerBy(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return ctx, func() {}
	}
	// A quarter of a short deadline, at most 250 ms: enough for the
	// answer to get out on a busy machine, most of the time.
	margin := min(time.Until(deadline)/4, 250*time.Millisecond)
	return context.WithDeadline(ctx, deadline.Add(-margin))
}
