package engine

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"

	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store"
)

// Background work, as Run does it.
const (
	settleBatch      = 16
	retentionBatch   = 500
	statsEvery       = 15 * time.Second
	maxSettleBackoff = time.Minute
)

// Run does the engine's background work until ctx ends: it settles
// records whose outcome is unknown (or whose holder died) by re-sending
// their recorded body with the same key, gives up on those past their
// settlement window, deletes records and events past the retention period,
// and keeps the records gauges current. Replicas sharing a database may all
// run it: a record is claimed by one at a time.
func (e *Engine) Run(ctx context.Context) {
	tick := time.NewTicker(e.settleEvery)
	defer tick.Stop()
	var lastRetention, lastStats time.Time
	for {
		e.Settle(ctx)
		if now := time.Now(); now.Sub(lastStats) >= statsEvery {
			e.updateStats(ctx)
			e.checkClock(ctx)
			lastStats = now
		}
		if now := time.Now(); e.retention > 0 && now.Sub(lastRetention) >= e.retentionEvery {
			e.deleteExpired(ctx)
			lastRetention = now
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Settle runs one round of settlement, as Run does every interval: it
// re-sends the records due for settlement, one claim at a time,
// just before each send, so that each send has its whole lease; and gives
// up on those whose window has closed. Nothing is sent with a key this
// process holds an unwritten outcome for (record.Settle.Pending).
func (e *Engine) Settle(ctx context.Context) {
	pending := func(key string) bool { return e.outbox.pendingFor(key) != nil }
	for range settleBatch {
		if ctx.Err() != nil {
			return
		}
		owner := e.owner()
		claimedAt := time.Now()
		acquired, gaveUp, err := e.store.SettleDue(ctx, record.Settle{Owner: owner, LeaseTTL: e.leaseTTL, Quiet: e.quiet,
			MinSend: e.minSend()}, pending, 1)
		e.metrics.StoreOp(OpSettle, claimedAt, err)
		e.gaveUp(ctx, gaveUp)
		if err != nil {
			if ctx.Err() == nil {
				e.logger.Warn("settlement could not claim records", slog.String("error", err.Error()))
			}
			if errors.Is(err, store.ErrCommitUnknown) {
				// The claim may hold a record: release it.
				e.outbox.release("", owner)
			}
			return
		}
		if len(acquired) == 0 {
			return
		}
		e.settle(ctx, claimedAt, &acquired[0])
	}
}

// settle re-sends one record's body, byte for byte, with its key, within
// its lease and its settlement window (claimedAt is when its claim began),
// on the path a call's send takes. Only a 2xx settles it: any other answer
// proves nothing about the attempt that may have created the payment, so
// the record stays unknown and is tried again later, until its window
// closes.
func (e *Engine) settle(ctx context.Context, claimedAt time.Time, rec *record.Record) {
	a := e.start(ctx, rec, claimedAt)
	select {
	case <-a.sent:
	case <-ctx.Done():
		// paymentsd is stopping: the request runs on, and Shutdown waits
		// for it (or cuts it off at its deadline).
		return
	}
	outcome := "succeeded"
	if a.result != record.Paid {
		outcome = "unknown"
	}
	if a.result != record.NothingSent {
		e.metrics.settlements.WithLabelValues(outcome).Inc()
	}
	attrs := keyAttrs(rec.Key,
		slog.String("outcome", outcome),
		slog.Int("settle_attempts", rec.SettleAttempts+1),
		slog.String("request_id", rec.RequestID),
	)
	t := time.NewTimer(notCreatedWait)
	defer t.Stop()
	select {
	case <-a.entry.landed:
	case <-t.C:
	case <-ctx.Done():
	}
	switch {
	case a.result == record.NothingSent:
		e.logger.Warn("settlement claimed a record too late to send it within its lease; nothing was sent", attrs...)
	case !a.entry.written():
		e.logger.Warn("settlement's outcome is not recorded yet; paymentsd goes on writing it", attrs...)
	case a.err != nil:
		e.logger.Warn("settlement attempt left the outcome unknown", append(attrs, slog.String("error", a.err.Error()))...)
	default:
		e.logger.Info("settled", attrs...)
	}
}

// gaveUp logs, once each at error level, the records whose settlement
// window closed unsettled: someone must check the provider's dashboard.
func (e *Engine) gaveUp(ctx context.Context, recs []record.Record) {
	for _, rec := range recs {
		e.metrics.gaveUp.Inc()
		e.logger.Error("settlement window closed with the payment's outcome unknown; check the provider's dashboard",
			keyAttrs(rec.Key,
				slog.Int("attempts", rec.Requests),
				slog.String("request_id", rec.RequestID),
				slog.Time("created", rec.CreatedAt),
				slog.String("last_error", rec.LastError),
			)...)
	}
	if len(recs) > 0 {
		// The unsettled gauge rises now, not at the next count.
		e.updateStats(ctx)
	}
}

func (e *Engine) updateStats(ctx context.Context) {
	start := time.Now()
	st, err := e.store.Stats(ctx)
	e.metrics.StoreOp(OpStats, start, err)
	if err != nil {
		return
	}
	for _, state := range []record.State{record.InProgress, record.Succeeded, record.NotCreated, record.OutcomeUnknown} {
		e.metrics.records.WithLabelValues(state.String()).Set(float64(st.ByState[state]))
	}
	e.metrics.unsettled.Set(float64(st.Unsettled))
}

// deleteExpired deletes, in small batches, what is older than the
// retention periods, leaving a tombstone for each record it deletes.
func (e *Engine) deleteExpired(ctx context.Context) {
	keep := store.Retention{Records: e.retention, Tombstones: e.tombstoneRetention}
	for ctx.Err() == nil {
		start := time.Now()
		n, err := e.store.DeleteExpired(ctx, keep, retentionBatch)
		e.metrics.StoreOp(OpDelete, start, err)
		if err != nil {
			if ctx.Err() == nil {
				e.logger.Warn("retention could not delete expired records", slog.String("error", err.Error()))
			}
			return
		}
		if n == 0 {
			return
		}
	}
}

// checkClock measures this process's clock against the store's (for
// PostgreSQL, the database server's, which decides every lease), exports
// the difference, and warns when it passes maxClockOffset and again when
// it comes back. Nothing paymentsd decides depends on this clock, but a
// replica that far off has a broken clock, and its logs and traces are
// misdated.
func (e *Engine) checkClock(ctx context.Context) {
	off, err := e.store.ClockOffset(ctx, e.now)
	if err != nil {
		return
	}
	e.metrics.clockOffset.Set(off.Seconds())
	far := off > maxClockOffset || off < -maxClockOffset
	if far != e.clockFar {
		e.clockFar = far
		if far {
			e.logger.Warn("this replica's clock differs from the record store's by more than a second; leases and settlement go by the store's clock, but fix the clock (NTP)",
				slog.Duration("offset", off), slog.String("store", e.store.Backend()))
		} else {
			e.logger.Info("this replica's clock agrees with the record store's again", slog.Duration("offset", off))
		}
	}
}

// maxClockOffset is how far this process's clock may be from the store's
// before checkClock warns.
const maxClockOffset = time.Second

// settleBackoff is the wait before settlement attempt n+1: exponential from
// base, capped at a minute, with jitter so replicas spread out.
func settleBackoff(base time.Duration, n int) time.Duration {
	d := base << min(n, 16)
	if d <= 0 || d > maxSettleBackoff {
		d = maxSettleBackoff
	}
	return d/2 + rand.N(d/2+1)
}

// Recount counts the records by state now, for the records gauges, rather
// than at the next count: after a person's resolution, say.
func (e *Engine) Recount(ctx context.Context) { e.updateStats(ctx) }
