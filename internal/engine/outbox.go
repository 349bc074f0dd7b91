package engine

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store"
)

// The outbox. Every outcome this process learns for a claim it holds (the
// provider's 2xx, its refusal, an unknown outcome, or that nothing was
// sent) is written to the claim's record by the outbox, which retries until
// the store answers, however long the store is down. So is the release of
// a claim whose commit this process could not confirm. Meanwhile the key
// is pending here: calls and lookups on this process wait for it, the
// record stays InProgress under this process's lease, and no replica may
// take it over (record.MayTakeOver: not until its store writes have been
// healthy for longer than the outbox's longest retry interval).
//
// What remains is this process dying with an outcome still in its outbox:
// the record stays InProgress, and once its lease and quiet period have
// passed, settlement re-sends the key (docs/durability.md).

const (
	// Retries double from retryFirst, jittered, up to retryMax.
	retryFirst = 25 * time.Millisecond
	retryMax   = time.Second
	// writeTimeout bounds one write.
	writeTimeout = 30 * time.Second
	// outboxLastChance is how long Shutdown gives the outcomes of the
	// requests it cut off, after its deadline, before it gives up on them.
	outboxLastChance = time.Second
)

// errStopped is an entry's error once Shutdown gave up on it; errStuck,
// as Shutdown logs it, when its write was still in the store.
var (
	errStopped = errors.New("paymentsd shut down before the outcome could be recorded")
	errStuck   = errors.New("paymentsd shut down while the record store had not answered the outcome's write")
)

// entry is one write on its way to a record: the outcome of a claim this
// process holds, or (claimed nil) the release of a claim whose commit is
// unknown.
type entry struct {
	key     string
	claimed *record.Record
	out     record.Outcome
	// received is when the outcome was learnt.
	received time.Time
	// prev is an earlier entry for the same key still pending: it is
	// written first.
	prev *entry
	// landed is closed once the entry is written, or never will be:
	// verdict says how it landed, err (errStopped) that it never will.
	landed  chan struct{}
	verdict record.Verdict
	err     error
	// givenUp: stop logged it not written while its write was still in
	// the store (guarded by the outbox's mu).
	givenUp bool
}

// written reports whether e landed on its record (its outcome is what the
// record says now, or was, durably).
func (e *entry) written() bool {
	return e.err == nil && (e.verdict == record.Written || e.verdict == record.Late)
}

type outbox struct {
	e       *Engine
	mu      sync.Mutex
	pending map[string]*entry
	// writing holds every entry not yet landed.
	writing map[*entry]struct{}
	stopped bool
	// watchers wake calls waiting on a key when an entry for it lands.
	watchers map[string]chan struct{}
	// halt ends every wait between retries, and the writes in progress.
	halt    context.Context
	haltNow context.CancelFunc
	wg      sync.WaitGroup
}

func newOutbox(e *Engine) *outbox {
	b := &outbox{e: e, pending: make(map[string]*entry), writing: make(map[*entry]struct{}), watchers: make(map[string]chan struct{})}
	b.halt, b.haltNow = context.WithCancel(context.Background())
	return b
}

// finish hands the outbox the outcome o of the claim that acquired claimed,
// and returns its entry.
func (b *outbox) finish(claimed *record.Record, o record.Outcome) *entry {
	return b.put(&entry{key: claimed.Key, claimed: claimed, out: o, received: time.Now(), landed: make(chan struct{})})
}

// release hands the outbox the release of owner's claim of key (key ""
// when not known), whose commit is unknown: if it holds the record, the
// record goes back to as it was, nothing sent.
func (b *outbox) release(key, owner string) *entry {
	return b.put(&entry{key: key, out: record.Outcome{Owner: owner, Result: record.NothingSent}, received: time.Now(), landed: make(chan struct{})})
}

func (b *outbox) put(e *entry) *entry {
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		// Learnt after Shutdown gave up on the outbox: one try.
		ctx, cancel := context.WithTimeout(context.Background(), outboxLastChance)
		e.err = b.write(ctx, e)
		cancel()
		if e.err != nil {
			b.e.logNotWritten(e, e.err)
		}
		close(e.landed)
		b.notify(e.key)
		return e
	}
	if e.key != "" {
		e.prev = b.pending[e.key]
		b.pending[e.key] = e
	}
	b.writing[e] = struct{}{}
	b.wg.Add(1)
	b.mu.Unlock()
	b.e.metrics.outcomesPending.Inc()
	go b.land(e)
	return e
}

// pendingFor returns the latest entry pending for key, if any.
func (b *outbox) pendingFor(key string) *entry {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pending[key]
}

// watch returns a channel closed when an entry for key next lands.
func (b *outbox) watch(key string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch, ok := b.watchers[key]
	if !ok {
		ch = make(chan struct{})
		b.watchers[key] = ch
	}
	return ch
}

func (b *outbox) notify(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ch, ok := b.watchers[key]; ok {
		close(ch)
		delete(b.watchers, key)
	}
}

// write makes one attempt to write e.
func (b *outbox) write(ctx context.Context, e *entry) error {
	start := time.Now()
	var err error
	if e.claimed != nil {
		e.verdict, err = b.e.store.Finish(ctx, e.claimed, e.out)
		b.e.metrics.StoreOp(OpFinish, start, err)
	} else {
		var n int
		n, err = b.e.store.Release(ctx, e.out.Owner, settleBackoff(b.e.settleEvery, 0))
		b.e.metrics.StoreOp(OpRelease, start, err)
		if err == nil && n > 0 {
			e.verdict = record.Written
			b.e.logger.Warn("released a claim whose commit was not confirmed; nothing was sent",
				slog.String("claim_owner", e.out.Owner), slog.Int("records", n))
		}
	}
	return err
}

// land writes e, after any earlier entry for its key, retrying until the
// store answers or Shutdown stops the outbox.
func (b *outbox) land(e *entry) {
	defer b.wg.Done()
	if e.prev != nil {
		select {
		case <-e.prev.landed:
		case <-b.halt.Done():
		}
	}
	tries := 0
	err := b.e.retry(b.halt, func(ctx context.Context) error {
		tries++
		err := b.write(ctx, e)
		if err != nil && tries == 1 {
			b.e.logger.Error("could not record a payment's outcome; retrying until the record store takes it (the key is held meanwhile: no replica sends it)",
				keyAttrs(e.key, slog.String("result", resultName(e.out.Result)), slog.Int("provider_status", e.out.ProviderStatus),
					slog.String("error", err.Error()))...)
		}
		return err
	})
	if err != nil {
		e.err = errStopped
	}
	b.mu.Lock()
	if b.pending[e.key] == e {
		delete(b.pending, e.key)
	}
	delete(b.writing, e)
	givenUp := e.givenUp
	b.mu.Unlock()
	b.e.metrics.outcomesPending.Dec()
	took := time.Since(e.received)
	switch {
	case givenUp:
		// stop logged it not written; it has landed since, or failed.
	case e.err != nil:
		b.e.logNotWritten(e, e.err)
	case e.claimed != nil && e.verdict == record.LeaseLost:
		// Only an outcome that is not a 2xx is refused so, unless the
		// record is gone: another claim took the key over, and its record
		// says what that claim learnt.
		b.e.logger.Warn("a payment's outcome was not recorded: its record is no longer this claim's (another claim took the key over first)",
			keyAttrs(e.key, slog.String("result", resultName(e.out.Result)), slog.Int("provider_status", e.out.ProviderStatus))...)
	default:
		if e.claimed != nil {
			b.e.metrics.outcomeCommit.Observe(took.Seconds())
		}
		if tries > 1 {
			b.e.logger.Error("recorded a payment's outcome after the record store failed",
				keyAttrs(e.key, slog.String("result", resultName(e.out.Result)), slog.Int("provider_status", e.out.ProviderStatus),
					slog.Int("tries", tries), slog.Duration("took", took))...)
		}
	}
	close(e.landed)
	if e.key != "" {
		b.notify(e.key)
	}
}

// retry runs fn until it returns nil or an error that says trying again
// is pointless (store.ErrClosed), or until ctx ends; each try gets
// writeTimeout. Tries are spaced by a doubling, jittered backoff, and made
// again at once when the store's writes resume after a failure.
func (e *Engine) retry(ctx context.Context, fn func(context.Context) error) error {
	delay := retryFirst
	for {
		resumed := e.store.WritesResumed()
		tctx, cancel := context.WithTimeout(ctx, writeTimeout)
		err := fn(tctx)
		cancel()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, store.ErrClosed), ctx.Err() != nil:
			return err
		}
		t := time.NewTimer(delay/2 + rand.N(delay/2+1))
		select {
		case <-t.C:
		case <-resumed:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		delay = min(2*delay, retryMax)
	}
}

// idle waits until nothing is pending, or ctx ends.
func (b *outbox) idle(ctx context.Context) bool {
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

// stop stops the outbox's retries and waits for its goroutines: each entry
// still pending is logged at error level. A write already taken into a
// transaction that the store never answers (a frozen server: neither its
// commit nor its failure comes) can't be stopped: stop waits for it only
// outboxLastChance, and logs its entry as not written then.
func (b *outbox) stop() {
	b.mu.Lock()
	b.stopped = true
	b.mu.Unlock()
	b.haltNow()
	last, cancel := context.WithTimeout(context.Background(), outboxLastChance)
	defer cancel()
	if b.idle(last) {
		return
	}
	b.mu.Lock()
	var stuck []*entry
	for e := range b.writing {
		e.givenUp = true
		stuck = append(stuck, e)
	}
	b.mu.Unlock()
	for _, e := range stuck {
		b.e.logNotWritten(e, errStuck)
	}
}

func (e *Engine) logNotWritten(en *entry, err error) {
	e.logger.Error("paymentsd stopped with a payment's outcome not recorded: the record stays in progress, and settlement sends the key again once its lease and quiet period have passed",
		keyAttrs(en.key, slog.String("result", resultName(en.out.Result)), slog.Int("provider_status", en.out.ProviderStatus),
			slog.Duration("pending_for", time.Since(en.received)), slog.String("error", errString(err)))...)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func resultName(r record.Result) string {
	switch r {
	case record.Paid:
		return "paid"
	case record.Refused:
		return "refused"
	case record.Unknown:
		return "unknown"
	case record.NothingSent:
		return "nothing_sent"
	}
	return "unspecified"
}
