package engine

import (
	"context"
	"errors"
	"time"

	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/upstream"
)

// attempt is one send of a claimed record's body: a call's or
// settlement's. Its request runs on a goroutine of its own, detached from
// whoever waits for it, bounded by its lease; its outcome goes to the
// outbox.
type attempt struct {
	claimed *record.Record
	// sent is closed once the request has ended (or nothing was sent);
	// then reply, err, result, why and entry are set.
	sent   chan struct{}
	reply  *upstream.Reply
	err    error
	result record.Result
	why    Why
	entry  *entry
	// cut cuts the request off (paymentsd's drain deadline).
	cut context.CancelFunc
}

// start sends claimed's body, for a claim that began at claimedAt (this
// process's monotonic clock), unless paymentsd waits on too many requests
// or too little of the lease is left: then the attempt sends nothing and
// says so. ctx's values (the request ID, for logs) go with the request;
// its end does not: cutting off paymentsd's side of a request would not
// stop the provider working on it.
func (e *Engine) start(ctx context.Context, claimed *record.Record, claimedAt time.Time) *attempt {
	a := &attempt{claimed: claimed, sent: make(chan struct{})}
	if !e.sends.acquire() {
		e.sendNothing(a, TooBusy)
		return a
	}
	left, ok := e.leaseLeft(e.sendBy(claimedAt, claimed))
	if !ok {
		e.sends.release()
		e.sendNothing(a, TooLate)
		return a
	}
	// One context for the request: detached from the caller, bounded by
	// the lease, and cut off at paymentsd's drain deadline.
	sendCtx, cut := context.WithTimeout(context.WithoutCancel(ctx), left)
	stopOnCutOff := context.AfterFunc(e.cutOff, cut)
	a.cut = cut
	e.sending.Add(1)
	go func() {
		defer e.sending.Done()
		a.reply, a.err = e.client.Send(sendCtx, claimed.Body)
		stopOnCutOff()
		cut()
		e.sends.release()
		o := e.outcome(claimed, a.reply, a.err)
		a.result = o.Result
		a.entry = e.outbox.finish(claimed, o)
		close(a.sent)
	}()
	return a
}

// sendNothing ends a, which sends nothing, why: its claim is released.
func (e *Engine) sendNothing(a *attempt, why Why) {
	a.why, a.result = why, record.NothingSent
	a.entry = e.outbox.finish(a.claimed, e.nothingSent(a.claimed, why))
	close(a.sent)
}

// nothingSent is the outcome of claimed's claim when it sent nothing.
func (e *Engine) nothingSent(claimed *record.Record, why Why) record.Outcome {
	o := record.Outcome{Owner: claimed.LeaseOwner, Result: record.NothingSent,
		SettleAfter: settleBackoff(e.settleEvery, claimed.SettleAttempts)}
	o.Code, o.Error = e.describe(Answer{Told: toldFor(record.NothingSent, claimed.Fresh()), Fresh: claimed.Fresh(), Why: why})
	return o
}

// outcome is what the provider's answer (reply, or err) to claimed's
// request means for its record.
func (e *Engine) outcome(claimed *record.Record, reply *upstream.Reply, err error) record.Outcome {
	o := record.Outcome{Owner: claimed.LeaseOwner}
	if err == nil {
		o.Result, o.HTTPRequests, o.ProviderStatus, o.Reply = record.Paid, reply.Requests, reply.Status, reply.Body
		return o
	}
	o.Result = record.Refused
	var uerr *upstream.Error
	if errors.As(err, &uerr) {
		o.HTTPRequests = uerr.Requests
		if uerr.MaybeCreated {
			o.Result = record.Unknown
		}
		if uerr.AtProvider {
			o.QuietFor = e.quiet - time.Since(uerr.LastRequestStart)
		}
		var se *upstream.StatusError
		if errors.As(uerr.Err, &se) {
			o.ProviderStatus, o.Reply = se.Status, se.Body
		}
	}
	n := claimed.SettleAttempts
	if claimed.AttemptKind == record.BySettlement {
		n++
	}
	o.SettleAfter = settleBackoff(e.settleEvery, n)
	o.Code, o.Error = e.describe(Answer{Told: toldFor(o.Result, claimed.Fresh()), Err: err, Fresh: claimed.Fresh(), Sent: true})
	return o
}

// toldFor is what a caller is told of a result once it is written.
func toldFor(r record.Result, fresh bool) record.Told {
	return record.Tell(record.Call{Claim: record.ClaimAcquired, Fresh: fresh, Sent: true, Result: r, Written: true})
}

// answer waits for a's request to end and its outcome to be written, and
// tells the caller what record.Tell says, when it says it: at once for an
// unknown outcome, once committed for a 2xx or a refusal, and at ctx's end
// whatever is known then. At paymentsd's drain deadline the request is cut
// off first, and the caller hears what that means for the money.
func (e *Engine) answer(ctx context.Context, a *attempt) Answer {
	call := record.Call{Claim: record.ClaimAcquired, Fresh: a.claimed.Fresh()}
	select {
	case <-a.sent:
	case <-ctx.Done():
		if !errors.Is(context.Cause(ctx), ErrHardStop) || a.cut == nil {
			// The request is still at the provider: nothing of its
			// answer is known (or may be read) yet.
			call.Due = true
			return Answer{Told: record.Tell(call), Fresh: call.Fresh, Sent: true}
		}
		a.cut()
		<-a.sent
	}
	call.Sent, call.Result = true, a.result
	var patience <-chan time.Time
	for {
		select {
		case <-a.entry.landed:
			call.Written, call.Lost = a.entry.written(), !a.entry.written()
		default:
		}
		if t := record.Tell(call); t != record.Wait {
			return e.told(ctx, t, a)
		}
		if patience == nil {
			t := time.NewTimer(notCreatedWait)
			defer t.Stop()
			patience = t.C
		}
		select {
		case <-a.entry.landed:
		case <-ctx.Done():
			call.Due = true
		case <-patience:
			call.Patience = true
		}
	}
}

// told is the answer t for a, whose request has ended.
//
// A 2xx that landed late (its holder had lost the record: record.Late)
// may have found the record Succeeded already, with another reply (a
// person's finding, or another attempt's 2xx), which it keeps: the caller
// is told OK with the reply the record holds, read back, and hears that
// the outcome is unknown if it can't be read.
func (e *Engine) told(ctx context.Context, t record.Told, a *attempt) Answer {
	if t == record.TellPaid && a.entry.verdict == record.Late {
		start := time.Now()
		rec, err := e.store.Get(ctx, a.claimed.Key)
		e.metrics.StoreOp(OpGet, start, err)
		if err == nil && rec.State == record.Succeeded {
			return Answer{From: record.Late, Record: &rec}
		}
		t = record.TellUnknown
	}
	return Answer{Told: t, Reply: a.reply, Err: a.err, Fresh: a.claimed.Fresh(), Sent: a.why == 0, Why: a.why}
}

// sendBy is when a send for rec, claimed at claimedAt (this process's
// monotonic clock), must end: before its lease does; and, for a re-send of
// a key an earlier attempt may have created, before the settlement window
// closes. Both are read as durations from rec's ReadAt, the store's clock
// as it wrote the claim, which was after claimedAt: so the send ends no
// later than the store thinks, however this process's wall clock differs
// from the store's.
func (e *Engine) sendBy(claimedAt time.Time, rec *record.Record) time.Time {
	by := claimedAt.Add(rec.LeaseExpiresAt.Sub(rec.ReadAt))
	if !rec.Fresh() {
		if w := claimedAt.Add(rec.SettleBy.Sub(rec.ReadAt)); w.Before(by) {
			by = w
		}
	}
	return by
}

// leaseLeft is how long a send may take that must end by by, a margin
// before the lease on its record expires and another call or replica may
// take the record over: the request must be over, one way or the other,
// by then. It reports false when too little of the lease is left to send
// at all.
func (e *Engine) leaseLeft(by time.Time) (time.Duration, bool) {
	left := time.Until(by) - e.margin()
	return left, left > e.margin()
}
