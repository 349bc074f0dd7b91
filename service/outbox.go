package service

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"example.com/paymentsd/store"
)

// The outbox. Every outcome this process learns for a key it holds (the
// provider's 2xx, its refusal, an unknown outcome, or "nothing was sent")
// is written to the key's record by the outbox, which retries it with
// capped, jittered backoff until the store takes it, however long the
// store is down, or until the store says it never can (the lease was lost
// to a takeover: only a non-success can be refused so). Meanwhile the key
// is pending here: lookups and calls on this process wait for it, the
// record stays InProgress under this process's lease, and no replica may
// take it over (store.Options.TakeoverGrace: not until its writes have
// been healthy for longer than the outbox's longest retry interval).
//
// What remains is this process dying with an outcome still in its outbox:
// the record stays InProgress, and once its lease and quiet period have
// passed settlement re-sends the key (docs/durability.md).
//
// The outbox also remembers, for a while, the outcomes of requests it has
// written (landedKeep, at most landedMax of them). A database can go
// back in time under paymentsd: a failover to an asynchronous standby
// that lacked the last commits loses whole records and outcomes, so that a
// record the caller was told had succeeded is gone, or is back in
// progress under a claim whose process has long written its outcome (and
// never takes over its own records). Each time the store's writes resume
// after a failure, the outbox asks it which of those outcomes it no longer
// holds, and writes them again (watchLost).

// Outbox retry intervals: doubling from the first, jittered, capped.
const (
	outboxFirstRetry = 25 * time.Millisecond
	outboxMaxRetry   = time.Second
	// outboxAttemptTimeout bounds one write of an outcome.
	outboxAttemptTimeout = 30 * time.Second
	// outboxLastChance is how long Shutdown gives the outcomes of the
	// requests it cut off, after its deadline, before it gives up on
	// them.
	outboxLastChance = time.Second
	// landedKeep and landedMax bound the outcomes the outbox remembers
	// once written, to write them again should the database lose them:
	// a failover that loses more than the last landedMax outcomes, or
	// older ones than landedKeep, loses them for good.
	landedKeep = 5 * time.Minute
	landedMax  = 20000
)

// errOutboxStopped is a pending outcome's error once Shutdown gave up on
// it.
var errOutboxStopped = errors.New("paymentsd shut down before the outcome could be recorded")

// outcome is one outcome on its way to the record.
type outcome struct {
	fin store.Finish
	// received is when it was learnt (the provider's answer came).
	received time.Time
	// prev is an earlier outcome for the same key still pending: it is
	// written first.
	prev *outcome
	// again: it was written before, and the store lost it.
	again bool
	// landed is closed once the outcome is written, or never will be;
	// err then says which (nil: written), and landedAt when.
	landed   chan struct{}
	err      error
	landedAt time.Time
}

// wait waits, up to max (0: no bound) or until ctx ends, for o to be
// written, and reports whether it was.
func (o *outcome) wait(ctx context.Context, max time.Duration) bool {
	select {
	case <-o.landed:
		return o.err == nil
	default:
	}
	var timeout <-chan time.Time
	if max > 0 {
		t := time.NewTimer(max)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-o.landed:
		return o.err == nil
	case <-ctx.Done():
	case <-timeout:
	}
	return false
}

// outbox holds the outcomes not yet written, by key.
type outbox struct {
	mu      sync.Mutex
	pending map[string]*outcome
	stopped bool
	// stop ends every wait between retries, and the writes in progress
	// (that have not yet run).
	stop       context.Context
	stopOutbox context.CancelFunc
	wg         sync.WaitGroup
	// written are the outcomes of requests written lately, oldest first
	// (see landedKeep).
	written []*outcome
}

// remember keeps o, just written, among the outcomes written lately.
func (b *outbox) remember(o *outcome) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.written = append(b.written, o)
	drop := max(len(b.written)-landedMax, 0)
	for drop < len(b.written) && o.landedAt.Sub(b.written[drop].landedAt) > landedKeep {
		drop++
	}
	if drop == 0 {
		return
	}
	// Not copied down: append moves what is left to a new array when
	// this one's end is reached.
	clear(b.written[:drop])
	b.written = b.written[drop:]
}

// writtenFor is the latest outcome of owner's claim of key written lately,
// if any.
func (b *outbox) writtenFor(key, owner string) *outcome {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := len(b.written) - 1; i >= 0; i-- {
		if o := b.written[i]; o.fin.Key == key && o.fin.Owner == owner {
			return o
		}
	}
	return nil
}

// forget drops os from the outcomes written lately: they are being
// written again, and will be remembered once they are.
func (b *outbox) forget(os []*outcome) {
	b.mu.Lock()
	defer b.mu.Unlock()
	gone := make(map[*outcome]bool, len(os))
	for _, o := range os {
		gone[o] = true
	}
	b.written = slices.DeleteFunc(b.written, func(o *outcome) bool { return gone[o] })
}

// writtenLately returns the outcomes written lately, oldest first.
func (b *outbox) writtenLately() []*outcome {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.written)
}

func newOutbox() *outbox {
	o := &outbox{pending: make(map[string]*outcome)}
	o.stop, o.stopOutbox = context.WithCancel(context.Background())
	return o
}

// pendingFor returns the outcome pending for key, if any.
func (b *outbox) pendingFor(key string) *outcome {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pending[key]
}

// writeOutcome hands fin, learnt at received, to the outbox and returns its
// outcome, which the caller may wait on.
func (s *Service) writeOutcome(fin store.Finish, received time.Time) *outcome {
	o, pending := s.pendOutcome(fin, received)
	if pending {
		go s.land(o)
	}
	return o
}

// pendOutcome is writeOutcome, less the writing: the outcome is pending,
// its key held, and the caller must call land(o) if pending. When the
// outbox has stopped it is written (or not) at once, and is not pending.
func (s *Service) pendOutcome(fin store.Finish, received time.Time) (o *outcome, pending bool) {
	return s.enqueue(&outcome{fin: fin, received: received, landed: make(chan struct{})})
}

// writeAgain hands the outbox, again, outcomes written lately that the
// store has lost. Each holds its claim until it lands, and is remembered
// again once it has.
func (s *Service) writeAgain(os []*outcome) {
	s.outbox.forget(os)
	for _, o := range os {
		s.logger.Error(msgLostOutcome,
			keyAttrs(o.fin.Key, slog.String("state", o.fin.State.String()), slog.Int("provider_status", o.fin.ProviderStatus),
				slog.Duration("written_ago", time.Since(o.landedAt)))...)
		s.claims.hold(o.fin.Owner)
		if again, pending := s.enqueue(&outcome{fin: o.fin, received: o.received, again: true, landed: make(chan struct{})}); pending {
			go s.land(again)
		}
	}
}

// enqueue hands o to the outbox, and returns it, and whether it is
// pending: then the caller must call land(o).
func (s *Service) enqueue(o *outcome) (*outcome, bool) {
	fin := o.fin
	b := s.outbox
	b.mu.Lock()
	stopped := b.stopped
	if !stopped {
		o.prev = b.pending[fin.Key]
		b.pending[fin.Key] = o
		b.wg.Add(1)
	}
	b.mu.Unlock()
	if stopped {
		// Learnt after Shutdown gave up on the outbox (a settlement
		// re-send that was still running): one try.
		ctx, cancel := context.WithTimeout(context.Background(), outboxLastChance)
		defer cancel()
		_, o.err = s.store.FinishWrite(ctx, fin)
		if o.err != nil {
			s.logPendingAtStop(o)
		}
		close(o.landed)
		s.waiters.notify(fin.Key)
		s.claims.done(fin.Owner)
		return o, false
	}
	s.metrics.outcomesPending.Inc()
	return o, true
}

// land writes o, retrying until the store takes it or says it never
// will, or until Shutdown stops the outbox.
func (s *Service) land(o *outcome) {
	b := s.outbox
	defer b.wg.Done()
	if o.prev != nil {
		select {
		case <-o.prev.landed:
		case <-b.stop.Done():
		}
	}
	delay := outboxFirstRetry
	var failures int
	var landing store.Landing
	for {
		// Once the store's writes resume after an outage, the outcome
		// is tried again at once, not after its backoff: the takeover
		// grace counts from that moment.
		resumed := s.store.WritesResumed()
		ctx, cancel := context.WithTimeout(b.stop, outboxAttemptTimeout)
		start := time.Now()
		var err error
		landing, err = s.store.FinishWrite(ctx, o.fin)
		cancel()
		s.metrics.storeOp(opFinish, start, err)
		if err == nil || errors.Is(err, store.ErrLeaseLost) || errors.Is(err, store.ErrClosed) {
			o.err = err
			break
		}
		if b.stop.Err() != nil {
			o.err = errOutboxStopped
			break
		}
		failures++
		if failures == 1 {
			s.logger.Error("could not record a payment's outcome; retrying until the record store takes it (the key is held meanwhile: no replica sends it)",
				keyAttrs(o.fin.Key, slog.String("state", o.fin.State.String()), slog.Int("provider_status", o.fin.ProviderStatus),
					slog.String("error", err.Error()))...)
		}
		t := time.NewTimer(delay/2 + rand.N(delay/2+1))
		select {
		case <-t.C:
		case <-resumed:
			t.Stop()
		case <-b.stop.Done():
			t.Stop()
		}
		delay = min(2*delay, outboxMaxRetry)
	}
	b.mu.Lock()
	if b.pending[o.fin.Key] == o {
		delete(b.pending, o.fin.Key)
	}
	b.mu.Unlock()
	s.metrics.outcomesPending.Dec()
	took := time.Since(o.received)
	switch {
	case o.err == nil:
		o.landedAt = time.Now()
		if o.fin.Claimed != nil {
			b.remember(o)
		}
		if !o.again {
			// The window from the answer to its commit; not a commit
			// made again long after.
			s.metrics.outcomeCommit.Observe(took.Seconds())
		}
		if landing == store.Restored {
			s.logger.Error("the record store had lost a payment's record, or the claim that made its request (did the database fail over to a standby without the last commits?); paymentsd wrote the outcome again",
				keyAttrs(o.fin.Key, slog.String("state", o.fin.State.String()), slog.Int("provider_status", o.fin.ProviderStatus))...)
		}
		if failures > 0 {
			s.logger.Error("recorded a payment's outcome after the record store failed",
				keyAttrs(o.fin.Key, slog.String("state", o.fin.State.String()), slog.Int("provider_status", o.fin.ProviderStatus),
					slog.Int("tries", failures+1), slog.Duration("took", took))...)
		}
	case errors.Is(o.err, store.ErrLeaseLost):
		// Only an outcome that is not a success is refused so: the key
		// was taken over, and its record says what its taker learnt.
		s.logger.Warn("a payment's outcome was not recorded: another claim took the key over first",
			keyAttrs(o.fin.Key, slog.String("state", o.fin.State.String()), slog.Int("provider_status", o.fin.ProviderStatus))...)
	default:
		s.logPendingAtStop(o)
	}
	close(o.landed)
	s.waiters.notify(o.fin.Key)
	s.claims.done(o.fin.Owner)
}

// msgLostOutcome is logged, at error level, for each outcome written
// lately that the store has lost, as it is written again.
const msgLostOutcome = "the record store lost a payment's recorded outcome (did the database fail over to a standby without the last commits?); paymentsd writes it again"

// watchLost runs until ctx ends: each time the store's writes resume
// after a failure or a gap, it writes again the outcomes written lately
// that the store no longer holds (see the outbox). It does so at once, as
// the outbox retries at once: another replica may take an expired lease
// over only once its writes have been healthy for the takeover grace.
func (s *Service) watchLost(ctx context.Context) {
	resumed := s.store.WritesResumed()
	for {
		select {
		case <-ctx.Done():
			return
		case <-resumed:
		}
		resumed = s.store.WritesResumed()
		s.rewriteLost(ctx)
	}
}

// rewriteLost asks the store which of the outcomes written lately it has
// lost, retrying until it answers or ctx ends, and writes those again.
func (s *Service) rewriteLost(ctx context.Context) {
	written := s.outbox.writtenLately()
	if len(written) == 0 {
		return
	}
	ws := make([]store.Written, len(written))
	for i, o := range written {
		ws[i] = store.Written{Key: o.fin.Key, Owner: o.fin.Owner}
	}
	delay := outboxFirstRetry
	for {
		lost, err := s.store.Lost(ctx, ws)
		if err == nil {
			again := make([]*outcome, len(lost))
			for j, i := range lost {
				again[j] = written[i]
			}
			s.writeAgain(again)
			return
		}
		if ctx.Err() != nil {
			return
		}
		t := time.NewTimer(delay/2 + rand.N(delay/2+1))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		delay = min(2*delay, outboxMaxRetry)
	}
}

// releaseClaim hands the outbox a settlement claim by owner whose commit
// was lost (it may have committed, holding a record this process will
// never take over, being its own): it retries store.Release until the
// store answers, as for an outcome.
func (s *Service) releaseClaim(owner string, settleAfter time.Duration) {
	b := s.outbox
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		s.claims.done(owner)
		return
	}
	b.wg.Add(1)
	b.mu.Unlock()
	s.metrics.outcomesPending.Inc()
	go func() {
		defer b.wg.Done()
		defer s.metrics.outcomesPending.Dec()
		defer s.claims.done(owner)
		delay := outboxFirstRetry
		for {
			resumed := s.store.WritesResumed()
			ctx, cancel := context.WithTimeout(b.stop, outboxAttemptTimeout)
			n, err := s.store.Release(ctx, owner, settleAfter)
			cancel()
			if err == nil {
				if n > 0 {
					s.logger.Warn("released a settlement claim whose commit was not confirmed; nothing was sent",
						slog.String("claim_owner", owner), slog.Int("records", n))
				}
				return
			}
			if errors.Is(err, store.ErrClosed) || b.stop.Err() != nil {
				s.logger.Error("paymentsd stopped before it could release a settlement claim whose commit was not confirmed; the record stays in progress until another replica, or this one restarted, takes it over",
					slog.String("claim_owner", owner), slog.String("error", err.Error()))
				return
			}
			t := time.NewTimer(delay/2 + rand.N(delay/2+1))
			select {
			case <-t.C:
			case <-resumed:
				t.Stop()
			case <-b.stop.Done():
				t.Stop()
			}
			delay = min(2*delay, outboxMaxRetry)
		}
	}()
}

func (s *Service) logPendingAtStop(o *outcome) {
	s.logger.Error("paymentsd stopped with a payment's outcome not recorded: the record stays in progress, and settlement sends the key again once its lease and quiet period have passed",
		keyAttrs(o.fin.Key, slog.String("state", o.fin.State.String()), slog.Int("provider_status", o.fin.ProviderStatus),
			slog.Duration("pending_for", time.Since(o.received)), slog.String("error", errString(o.err)))...)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// waitOutbox waits until nothing is pending, or ctx ends.
func (b *outbox) waitIdle(ctx context.Context) bool {
	done := make(chan struct{})
	go func() {
		b.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// stopAndWait stops the outbox's retries, and waits for its goroutines:
// each outcome still pending is logged at error level.
func (b *outbox) stopAndWait() {
	b.mu.Lock()
	b.stopped = true
	b.mu.Unlock()
	b.stopOutbox()
	b.wg.Wait()
}
