package service

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"

	"example.com/paymentsd/store"
)

// errNotYetRecorded: an outcome's record has not committed within the
// wait; the outbox goes on writing it.
var errNotYetRecorded = errors.New("the outcome is not recorded yet")

// Background work, as Run does it.
const (
	settleBatch      = 16
	retentionBatch   = 500
	retentionEvery   = 10 * time.Minute
	statsEvery       = 15 * time.Second
	maxSettleBackoff = time.Minute
)

// Run does the service's background work until ctx ends: it settles
// records whose outcome is unknown (or whose holder died) by re-sending
// their recorded body with the same key, gives up on those past the
// settlement window, deletes records and events past the retention period,
// and keeps the records gauges current. Replicas sharing a database may all
// run it: a record is claimed by one at a time.
func (s *Service) Run(ctx context.Context) {
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		s.watchLost(ctx)
	}()
	defer func() { <-watched }()
	tick := time.NewTicker(s.settleEvery)
	defer tick.Stop()
	var lastRetention, lastStats time.Time
	for {
		s.settleDue(ctx)
		s.sweepOwn(ctx)
		s.giveUp(ctx)
		if now := time.Now(); now.Sub(lastStats) >= statsEvery {
			s.updateStats(ctx)
			s.checkClock(ctx)
			lastStats = now
		}
		if now := time.Now(); s.retention > 0 && now.Sub(lastRetention) >= s.retentionEvery {
			s.deleteExpired(ctx)
			lastRetention = now
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// settleDue claims the records due for settlement and re-sends each, up
// to settleBatch of them per round. It claims one record at a time, just
// before sending it, so that each send has its whole lease: a batch
// claimed under one lease and sent one after another against a slow
// provider would outlive the lease, and a caller's retry or another
// replica could then send the same key at once.
func (s *Service) settleDue(ctx context.Context) {
	for range settleBatch {
		if ctx.Err() != nil {
			return
		}
		claimed := time.Now()
		owner := s.owner + "/" + newRequestID()[:12]
		s.claims.hold(owner)
		recs, err := s.store.ClaimDue(ctx, owner, s.leaseTTL, s.quiet, 1)
		s.metrics.storeOp(opClaimDue, claimed, err)
		if err != nil {
			if ctx.Err() == nil {
				s.logger.Warn("settlement could not claim records", slog.String("error", err.Error()))
			}
			if errors.Is(err, store.ErrCommitUnknown) {
				// The claim may hold a record that no replica of this
				// process would ever take over: release it.
				s.releaseClaim(owner, settleBackoff(s.settleBase, 0))
			} else {
				s.claims.done(owner)
			}
			return
		}
		if len(recs) == 0 {
			s.claims.done(owner)
			return
		}
		s.settle(ctx, claimed, recs[0])
	}
}

// settle re-sends one record's body, byte for byte, with its key, within
// its lease and its settlement window (claimed is when its claim began).
// Only a 2xx settles it: any other answer proves nothing about the attempt
// that may have created the payment, so the record stays unknown and is
// tried again later, until its window closes. The outcome goes through
// the outbox, as a call's does.
func (s *Service) settle(ctx context.Context, claimed time.Time, rec store.Record) {
	sendCtx, cancel, ok := s.withinLease(ctx, s.sendBy(claimed, rec, true))
	defer cancel()
	if !ok || sendCtx.Err() != nil {
		// Too late to send: the claim is released, unknown as before, for
		// the next round or for giving up. (Left to its lease's expiry, it
		// would wait for another replica: no process takes over its own.)
		s.writeOutcome(store.Finish{Key: rec.Key, Owner: rec.LeaseOwner, State: store.StateOutcomeUnknown,
			SettleAfter: settleBackoff(s.settleBase, rec.SettleAttempts), Code: rec.Code,
			LastError: "settlement claimed the record too late to send it within its lease or window; nothing was sent"}, time.Now())
		return
	}
	reply, callErr := s.client.Send(sendCtx, rec.Body)
	received := time.Now()
	fin := s.outcome(reply, callErr, true)
	fin.Key, fin.Owner, fin.Settlement, fin.Claimed = rec.Key, rec.LeaseOwner, true, rec.Claimed()
	if fin.State == store.StateOutcomeUnknown {
		fin.SettleAfter = settleBackoff(s.settleBase, rec.SettleAttempts+1)
	}
	var err error
	if o := s.writeOutcome(fin, received); !o.wait(ctx, notCreatedWait) {
		// The outbox goes on writing it; its first failure is logged.
		err = cmp.Or(o.err, errNotYetRecorded)
	}
	outcome := "succeeded"
	if fin.State != store.StateSucceeded {
		outcome = "unknown"
	}
	s.metrics.settlements.WithLabelValues(outcome).Inc()
	attrs := keyAttrs(rec.Key,
		slog.String("outcome", outcome),
		slog.Int("provider_status", fin.ProviderStatus),
		slog.Int("settle_attempts", rec.SettleAttempts+1),
		slog.String("request_id", rec.RequestID),
	)
	switch {
	case err != nil:
		s.logger.Warn("settlement's outcome is not recorded yet; paymentsd goes on writing it", append(attrs, slog.String("error", err.Error()))...)
	case callErr != nil:
		s.logger.Warn("settlement attempt left the outcome unknown", append(attrs, slog.String("error", callErr.Error()))...)
	default:
		s.logger.Info("settled", attrs...)
	}
}

// giveUp marks records whose settlement window closed unsettled, and logs
// each once at error level: someone must check the provider's dashboard.
func (s *Service) giveUp(ctx context.Context) {
	start := time.Now()
	recs, err := s.store.GiveUp(ctx, s.owner, settleBatch*4)
	s.metrics.storeOp(opGiveUp, start, err)
	if err != nil {
		return
	}
	for _, rec := range recs {
		s.metrics.gaveUp.Inc()
		s.logger.Error("settlement window closed with the payment's outcome unknown; check the provider's dashboard",
			keyAttrs(rec.Key,
				slog.Int("attempts", rec.Attempts),
				slog.String("request_id", rec.RequestID),
				slog.Time("created", rec.CreatedAt),
				slog.String("last_error", rec.LastError),
			)...)
	}
	if len(recs) > 0 {
		// The unsettled gauge rises now, not at the next count.
		s.updateStats(ctx)
	}
}

func (s *Service) updateStats(ctx context.Context) {
	start := time.Now()
	st, err := s.store.Stats(ctx)
	s.metrics.storeOp(opStats, start, err)
	if err != nil {
		return
	}
	for _, state := range []store.State{store.StateInProgress, store.StateSucceeded, store.StateNotCreated, store.StateOutcomeUnknown} {
		s.metrics.records.WithLabelValues(state.String()).Set(float64(st.ByState[state]))
	}
	s.metrics.unsettled.Set(float64(st.Unsettled))
}

// deleteExpired deletes, in small batches, what is older than the
// retention periods, leaving a tombstone for each record it deletes.
func (s *Service) deleteExpired(ctx context.Context) {
	keep := store.Retention{Records: s.retention, Tombstones: s.tombstoneRetention}
	for ctx.Err() == nil {
		start := time.Now()
		n, err := s.store.DeleteExpired(ctx, keep, retentionBatch)
		s.metrics.storeOp(opDelete, start, err)
		if err != nil {
			if ctx.Err() == nil {
				s.logger.Warn("retention could not delete expired records", slog.String("error", err.Error()))
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
func (s *Service) checkClock(ctx context.Context) {
	off, err := s.store.ClockOffset(ctx, s.now)
	if err != nil {
		return
	}
	s.metrics.clockOffset.Set(off.Seconds())
	far := off > maxClockOffset || off < -maxClockOffset
	if far != s.clockFar {
		s.clockFar = far
		if far {
			s.logger.Warn("this replica's clock differs from the record store's by more than a second; leases and settlement go by the store's clock, but fix the clock (NTP)",
				slog.Duration("offset", off), slog.String("store", s.store.Backend()))
		} else {
			s.logger.Info("this replica's clock agrees with the record store's again", slog.Duration("offset", off))
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
