package service

import (
	"context"
	"log/slog"
	"sync"

	"example.com/paymentsd/store"
)

// claims are this process's claims that may still write their records:
// each from just before it is asked for until its outcome is written (or
// refused), or until it is known to hold no record. A record held by a
// claim of this process that is not among them, once its lease has
// expired, is held by nobody: no replica of this process would ever take
// it over (its own records are left to its outbox), so sweepOwn gives it
// up to settlement.
type claims struct {
	mu sync.Mutex
	m  map[string]struct{}
}

func (c *claims) hold(owner string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]struct{})
	}
	c.m[owner] = struct{}{}
}

func (c *claims) done(owner string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, owner)
}

func (c *claims) held(owner string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.m[owner]
	return ok
}

// claimEnded notes that the claim owner of key, whose Begin failed, holds
// nothing more, unless it handed the outbox an outcome (which ends it once
// written).
func (s *Service) claimEnded(owner, key string) {
	for o := s.outbox.pendingFor(key); o != nil; o = o.prev {
		if o.fin.Owner == owner {
			return
		}
	}
	s.claims.done(owner)
}

// sweepOwn gives up to settlement the records this process's claims hold
// with expired leases and that the process no longer holds anything for
// (see claims), once the store's writes have been healthy for the
// takeover grace; and writes again an outcome it still remembers for one
// (the database lost it, and watchLost did not see it go).
func (s *Service) sweepOwn(ctx context.Context) {
	recs, err := s.store.AbandonOwn(ctx, s.owner, func(r store.Record) bool {
		if s.claims.held(r.LeaseOwner) {
			return true
		}
		if o := s.outbox.writtenFor(r.Key, r.LeaseOwner); o != nil {
			// Written again without waiting for this transaction: the
			// record is left to it.
			s.writeAgain([]*outcome{o})
			return true
		}
		return false
	}, settleBatch)
	if err != nil {
		return
	}
	for _, r := range recs {
		s.logger.Error("a record held by one of this replica's claims, which holds nothing for it any more, is left to settlement (did the database go back in time, to before its outcome was written?)",
			keyAttrs(r.Key, slog.String("claim_owner", r.LeaseOwner))...)
	}
}
