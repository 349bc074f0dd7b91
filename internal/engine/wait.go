package engine

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"example.com/paymentsd/internal/record"
	"example.com/paymentsd/internal/store"
)

// takeoverRetry is how often a call waiting on a record whose expired
// lease it may not take over yet claims again.
const takeoverRetry = time.Second

// await waits, within ctx, for the record of key, which a claim found
// busy, to change: until this process's own outcome for the key is
// written, and the record leaves InProgress or its holder's lease expires
// (the caller then claims again). Another process may hold the key, so it
// polls the store as well as listening to this process's outbox. It
// reports false if ctx ended first, or the store failed: either way
// another claim holds the key, and may be at the provider now.
func (e *Engine) await(ctx context.Context, key string, busy record.Record) (record.Record, bool) {
	e.metrics.waits.Inc()
	// A lease that had expired when the claim found it may not be taken
	// over yet: claim again when it changes hands, or every
	// takeoverRetry.
	refused := !busy.LeaseExpiresAt.After(busy.ReadAt)
	begun := time.Now()
	poll := 5 * time.Millisecond
	for {
		if !e.Await(ctx, key) {
			return record.Record{}, false
		}
		changed := e.outbox.watch(key)
		start := time.Now()
		rec, err := e.store.Get(ctx, key)
		e.metrics.StoreOp(OpGet, start, err)
		expired := !rec.LeaseExpiresAt.After(rec.ReadAt)
		switch {
		case errors.Is(err, store.ErrNotFound):
			// Gone (retention, which leaves a tombstone): claim again.
			return record.Record{State: record.InProgress}, true
		case err == nil && rec.State != record.InProgress:
			return rec, true
		case err == nil && expired && (!refused || rec.LeaseOwner != busy.LeaseOwner || time.Since(begun) >= takeoverRetry):
			return rec, true
		case err != nil && ctx.Err() == nil:
			e.logger.ErrorContext(ctx, "record store failed while waiting on a key in flight", slog.String("error", err.Error()))
			return record.Record{}, false
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return record.Record{}, false
		case <-changed:
			t.Stop()
		case <-t.C:
			poll = min(poll*2, 200*time.Millisecond)
		}
	}
}

// Await waits until every outcome this process holds for key is written
// (or never will be), so that a lookup after a caller's answer finds it.
// It reports false if ctx ended first.
func (e *Engine) Await(ctx context.Context, key string) bool {
	for p := e.outbox.pendingFor(key); p != nil; p = e.outbox.pendingFor(key) {
		select {
		case <-p.landed:
		case <-ctx.Done():
			return false
		}
	}
	return true
}
