package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"example.com/paymentsd/internal/record"
)

// Errors of Resolve. With each, Resolved.Record is the record as found.
var (
	// ErrNotUnknown: the record's state is not OutcomeUnknown, so there is
	// nothing to resolve; nothing was written.
	ErrNotUnknown = errors.New("the record's outcome is not unknown")
	// ErrInFlight: a request for the key is being sent now (InProgress),
	// or may still be at the provider (QuietUntil has not passed);
	// nothing was written.
	ErrInFlight = errors.New("a request with the key may be at the provider now")
	// ErrChanged: the record's UpdatedAt is not the resolution's
	// UnchangedSince; nothing was written.
	ErrChanged = errors.New("the record has changed since it was looked at")
)

// AuditInfo is who resolved a record, how, and why: it goes into the
// audit entry.
type AuditInfo struct {
	// Evidence is what the person found, Actor who they are; RequestID is
	// paymentsd's own ID of the resolving call, and CallerRequestID the
	// X-Request-Id its caller sent, if any.
	Evidence        string
	Actor           string
	RequestID       string
	CallerRequestID string
}

// Resolved is Resolve's result.
type Resolved struct {
	// Record is the record after the resolution, or as found when Resolve
	// refused (ErrNotUnknown, ErrInFlight, ErrChanged).
	Record record.Record
	Entry  AuditEntry
}

// Resolve writes a person's finding res about key's record, with its
// audit entry, in one transaction, by the store's clock: record.Step
// decides (WriteResolve). It returns ErrNotFound for no record (or a
// tombstoned one), ErrNotUnknown, ErrInFlight or ErrChanged for Step's
// refusals, writing nothing, or a database error.
//
// Settlement and calls claim a record with a row lock (or SQLite's one
// writer) and mark it InProgress before they send, so a resolution and a
// send never overlap: whichever commits first wins, and the other finds
// the record changed.
func (s *Store) Resolve(ctx context.Context, key string, res record.Resolve, audit AuditInfo) (Resolved, error) {
	if res.To != record.Succeeded && res.To != record.NotCreated {
		return Resolved{}, fmt.Errorf("resolve %.64q: state %v is not a resolution", key, res.To)
	}
	if res.To != record.Succeeded && res.Reply != nil {
		return Resolved{}, fmt.Errorf("resolve %.64q: a reply goes only with succeeded", key)
	}
	if !s.d.storable(key) {
		return Resolved{}, fmt.Errorf("resolve %.64q: %w", key, ErrNotFound)
	}
	var out Resolved
	err := s.transact(ctx, func(tx *sql.Tx, now time.Time) error {
		r, err := s.lockedRecord(ctx, tx, key, now)
		var found *record.Record
		switch {
		case err == nil:
			found = &r
		case !errors.Is(err, ErrNotFound):
			return err
		}
		n, eff := record.Step(found, res, now)
		out.Record = n
		switch eff.Verdict {
		case record.NoRecord:
			out.Record = record.Record{}
			return ErrNotFound
		case record.NotUnknown:
			return ErrNotUnknown
		case record.InFlight:
			return ErrInFlight
		case record.Changed:
			return ErrChanged
		}
		if err := s.apply(ctx, tx, &r, &n, eff, 0); err != nil {
			return err
		}
		out.Entry = AuditEntry{CreatedAt: now, Actor: audit.Actor, From: r.State, To: n.State, Evidence: audit.Evidence,
			RequestID: audit.RequestID, CallerRequestID: audit.CallerRequestID, ReplyRecorded: res.Reply != nil, GaveUp: r.GaveUp}
		return s.appendAudit(ctx, tx, &r, out.Entry)
	})
	if err != nil {
		if errors.Is(err, ErrNotUnknown) || errors.Is(err, ErrInFlight) || errors.Is(err, ErrChanged) {
			return out, fmt.Errorf("resolve %.64q: %w", key, err)
		}
		return Resolved{}, s.wrap(fmt.Errorf("resolve %.64q: %w", key, err))
	}
	return out, nil
}
