package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
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
	// ErrChanged: the record's UpdatedAt is not Resolution.UnchangedSince;
	// nothing was written.
	ErrChanged = errors.New("the record has changed since it was looked at")
)

// Resolution is a person's finding about a record whose outcome is
// unknown.
type Resolution struct {
	Key string
	// To is StateSucceeded (the provider created the payment) or
	// StateNotCreated (it certainly did not).
	To State
	// Reply, only with StateSucceeded, is the provider's payment JSON as
	// the person got it; nil if they have none.
	Reply []byte
	// Evidence, Actor, RequestID (paymentsd's own for the resolving
	// call) and CallerRequestID (the X-Request-Id the caller sent, if
	// any) go into the audit entry.
	Evidence        string
	Actor           string
	RequestID       string
	CallerRequestID string
	// UnchangedSince, if set, is the record's UpdatedAt as the person saw
	// it: Resolve writes nothing (ErrChanged) if it is no longer.
	UnchangedSince time.Time
}

// AuditEntry is one change a person made to a record.
type AuditEntry struct {
	CreatedAt time.Time
	Actor     string
	From, To  State
	Evidence  string
	// RequestID is paymentsd's own ID of the resolving call, and
	// CallerRequestID the one its caller sent (not checked: a caller
	// may send any).
	RequestID       string
	CallerRequestID string
	ReplyRecorded   bool
	// GaveUp is whether settlement had given up on the record.
	GaveUp bool
}

// Resolved is Resolve's result.
type Resolved struct {
	// Record is the record after the resolution, or as found when Resolve
	// refused (ErrNotUnknown, ErrInFlight).
	Record Record
	Entry  AuditEntry
}

// Resolve records res in one transaction, by the store's clock: the
// record, if it is OutcomeUnknown and no request for its key may be at the
// provider, becomes res.To, with its lease, quiet period and gave-up mark
// cleared (so that settlement leaves it alone and it no longer counts as
// unsettled) and ResolvedAt set; and an audit entry is appended. For
// Succeeded, Reply becomes res.Reply and ProviderStatus 0 (the provider's
// answer was never seen); for NotCreated both are kept, and the next Begin
// starts the key afresh.
//
// It returns ErrNotFound for no record (or a tombstoned one), ErrNotUnknown,
// ErrInFlight, ErrChanged or, for NotCreated when an attempt for the key
// got a 2xx, ErrAttemptSucceeded (writing nothing), or a database error.
//
// Settlement and calls claim a record with a row lock (or SQLite's one
// writer) and mark it InProgress before they send, so a resolution and a
// send never overlap: whichever commits first wins, and the other finds
// the record changed.
func (s *Store) Resolve(ctx context.Context, res Resolution) (Resolved, error) {
	if res.To != StateSucceeded && res.To != StateNotCreated {
		return Resolved{}, fmt.Errorf("resolve %.64q: state %v is not a resolution", res.Key, res.To)
	}
	if res.To != StateSucceeded && res.Reply != nil {
		return Resolved{}, fmt.Errorf("resolve %.64q: a reply goes only with succeeded", res.Key)
	}
	if !s.d.storable(res.Key) {
		return Resolved{}, fmt.Errorf("resolve %.64q: %w", res.Key, ErrNotFound)
	}
	d := s.d
	var out Resolved
	err := s.transact(ctx, func(tx *sql.Tx) error {
		now, err := s.txNow(ctx, tx)
		if err != nil {
			return err
		}
		r, err := s.getRecordTx(ctx, tx, res.Key)
		if err != nil {
			return err
		}
		r.ReadAt = now
		out.Record = r
		switch {
		case !r.TombstonedAt.IsZero():
			return ErrNotFound
		case r.State == StateInProgress:
			return ErrInFlight
		case r.State != StateOutcomeUnknown:
			return ErrNotUnknown
		case now.Before(r.QuietUntil):
			return ErrInFlight
		case !res.UnchangedSince.IsZero() && !r.UpdatedAt.Equal(res.UnchangedSince.Truncate(time.Microsecond)):
			return ErrChanged
		}
		if res.To == StateNotCreated {
			// A record whose attempt got a 2xx is Succeeded; this guards
			// that, should anything ever leave one otherwise.
			paid, err := s.hasSucceededAttempt(ctx, tx, res.Key)
			if err != nil {
				return fmt.Errorf("read attempts: %w", err)
			}
			if paid {
				return ErrAttemptSucceeded
			}
		}
		set := `state = $2, updated_at = $3, resolved_at = $3, gave_up = $4, lease_owner = '',
			lease_expires_at = $5, quiet_until = $5, next_settle_at = $5`
		args := []any{int(res.To), d.t(now), false, d.t(time.Time{})}
		if res.To == StateSucceeded {
			set += `, reply = $6, provider_status = 0, last_error = '', code = 0`
			args = append(args, res.Reply)
		}
		nr, err := updateRecord(ctx, tx, d, now, set, res.Key, args...)
		if err != nil {
			return fmt.Errorf("update record: %w", err)
		}
		e := AuditEntry{CreatedAt: now, Actor: res.Actor, From: r.State, To: res.To, Evidence: res.Evidence,
			RequestID: res.RequestID, CallerRequestID: res.CallerRequestID, ReplyRecorded: res.Reply != nil, GaveUp: r.GaveUp}
		sum := keySHA256(res.Key)
		if _, err := tx.ExecContext(ctx, d.q(`
			INSERT INTO audit_entries (key_sha256, record_created_at, created_at, actor, from_state, to_state,
				outcome, evidence, request_id, reply_recorded, gave_up, caller_request_id)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`),
			sum[:], d.t(r.CreatedAt), d.t(now), e.Actor, int(e.From), int(e.To), int(e.To), e.Evidence,
			e.RequestID, e.ReplyRecorded, e.GaveUp, e.CallerRequestID); err != nil {
			return fmt.Errorf("append audit entry: %w", err)
		}
		out = Resolved{Record: nr, Entry: e}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrNotUnknown) || errors.Is(err, ErrInFlight) || errors.Is(err, ErrChanged) || errors.Is(err, ErrAttemptSucceeded) {
			return out, fmt.Errorf("resolve %.64q: %w", res.Key, err)
		}
		return Resolved{}, s.wrap(fmt.Errorf("resolve %.64q: %w", res.Key, err))
	}
	return out, nil
}

// AuditEntries returns the audit entries of r (a record as Get returned
// it), oldest first. Entries of an earlier record with the same key (one
// retention deleted) are not r's.
func (s *Store) AuditEntries(ctx context.Context, r Record) ([]AuditEntry, error) {
	sum := keySHA256(r.Key)
	st, err := s.prepared(ctx, s.r, s.d.q(`
		SELECT created_at, actor, from_state, to_state, evidence, request_id, reply_recorded, gave_up, caller_request_id
		FROM audit_entries WHERE key_sha256 = $1 AND record_created_at = $2 ORDER BY id`))
	if err != nil {
		return nil, s.wrap(fmt.Errorf("audit entries %.64q: %w", r.Key, err))
	}
	rows, err := st.QueryContext(ctx, sum[:], s.d.t(r.CreatedAt))
	if err != nil {
		return nil, s.wrap(fmt.Errorf("audit entries %.64q: %w", r.Key, err))
	}
	defer rows.Close()
	var out []AuditEntry
	for rows.Next() {
		var e AuditEntry
		var from, to int
		if err := rows.Scan(timeCol{&e.CreatedAt}, &e.Actor, &from, &to, &e.Evidence, &e.RequestID,
			&e.ReplyRecorded, &e.GaveUp, &e.CallerRequestID); err != nil {
			return nil, s.wrap(fmt.Errorf("audit entries %.64q: %w", r.Key, err))
		}
		e.From, e.To = State(from), State(to)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap(fmt.Errorf("audit entries %.64q: %w", r.Key, err))
	}
	return out, nil
}
