package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// State is what a record says about a payment's money.
type State int

const (
	// StateInProgress: a request for the key is being sent now, by the
	// holder of the record's lease. A payment may exist.
	StateInProgress State = 1
	// StateSucceeded: the provider answered 2xx; Reply holds its body.
	StateSucceeded State = 2
	// StateNotCreated: no attempt for the key can have created a payment.
	StateNotCreated State = 3
	// StateOutcomeUnknown: some attempt may have created a payment and no
	// 2xx has confirmed it. Settlement re-sends the body until SettleBy.
	StateOutcomeUnknown State = 4
)

func (s State) String() string {
	switch s {
	case StateInProgress:
		return "in_progress"
	case StateSucceeded:
		return "succeeded"
	case StateNotCreated:
		return "not_created"
	case StateOutcomeUnknown:
		return "outcome_unknown"
	}
	return "unspecified"
}

// Record is the durable record of one idempotency key.
type Record struct {
	Key string
	// Body is the exact provider request body (never the API key), and
	// BodySHA256 its hash, which decides whether a later call is the same
	// request.
	Body       []byte
	BodySHA256 [32]byte
	// Currency and Amount are the recorded request, for lookups.
	Currency string
	Amount   int64

	State State
	// Attempts counts requests sent to the provider for this key, by every
	// call and by settlement.
	Attempts int
	// ProviderStatus is the provider's last HTTP status (0: none), and
	// Reply its last reply body exactly (a 2xx body when Succeeded, else
	// the error body, or nil).
	ProviderStatus int
	Reply          []byte
	// LastError says why the last attempt failed ("" after a success), and
	// Code is the status code its call was answered with. Code is the
	// service's vocabulary; the store keeps it opaque.
	LastError string
	Code      int32

	// RequestID, TraceID and Caller identify the call that created the
	// record.
	RequestID string
	TraceID   string
	Caller    string

	CreatedAt time.Time
	UpdatedAt time.Time
	// SettleBy ends the settlement window: no request for the key is sent
	// after it. It is set when the first attempt that may create a payment
	// begins (a new record, or one that was NotCreated).
	SettleBy time.Time
	// NextSettleAt is when settlement may next re-send an OutcomeUnknown
	// record; SettleAttempts counts its re-sends.
	NextSettleAt   time.Time
	SettleAttempts int
	// LeaseOwner holds the record while it is InProgress, until
	// LeaseExpiresAt. An expired lease means its holder died or hung.
	LeaseOwner     string
	LeaseExpiresAt time.Time
	// GaveUp is set once when an unknown record passes SettleBy.
	GaveUp bool
	// QuietUntil is until when the key's last request may still be at the
	// provider (it ended without the provider's answer, or its sender died
	// mid-call): nothing may be sent with the key before then. Zero when
	// no request is presumed there.
	QuietUntil time.Time
	// AttemptStartedAt is when the last attempt for the key was claimed.
	AttemptStartedAt time.Time
	// PriorState is the state the last acquisition took the record over
	// from: 0 for a new record, or NotCreated (both start the key afresh),
	// OutcomeUnknown or InProgress (an earlier attempt may have created the
	// payment).
	PriorState State
	// TombstonedAt, if set, is when retention wrote the record's
	// tombstone: the key has expired, and the record is about to be
	// deleted. Get no longer returns it, and Begin answers Expired.
	TombstonedAt time.Time
	// ResolvedAt, if set, is when a person last resolved the record
	// (Resolve); its AuditEntries say how. It stays set when a new attempt
	// starts after a NotCreated resolution: see StateResolved.
	ResolvedAt time.Time
	// AttemptSeq counts the attempts started (see Attempts); the last one
	// started was made by AttemptKind, for the call AttemptRequestID.
	AttemptSeq       int
	AttemptKind      AttemptKind
	AttemptRequestID string

	// ReadAt is the store's clock when the record was read or written: the
	// time its other times are to be compared with (for PostgreSQL the
	// database server's clock, not this process's).
	ReadAt time.Time
}

// Claim asks Begin for the right to send a request for a key. Its times
// are durations: the store reads the clock (for PostgreSQL, the database
// server's) so that replicas whose clocks disagree never both hold a key.
type Claim struct {
	Key        string
	Body       []byte
	BodySHA256 [32]byte
	Currency   string
	Amount     int64
	RequestID  string
	TraceID    string
	Caller     string
	// OwnKeysOnly: the key may be used only by the caller that created its
	// record (Record.Caller == Caller); Begin answers NotOwned otherwise.
	OwnKeysOnly bool
	// Owner identifies the claimant for the lease: "<process>/<claim
	// id>", unique to the claim. A claim never takes over a record whose
	// holder is of its own process.
	Owner string
	// LeaseTTL is how long the lease lasts if acquired: the claimant must
	// be done with the provider before it ends.
	LeaseTTL time.Duration
	// Window is the settlement window the claim starts, if it starts the
	// key afresh.
	Window time.Duration
	// Quiet is the provider quiet period: until the claimant has recorded
	// its outcome, its request is presumed at the provider for LeaseTTL
	// plus Quiet (the longest it may be sent, and then be worked on).
	Quiet time.Duration
}

// Outcome is Begin's verdict on a Claim.
type Outcome int

const (
	// Acquired: the record is now InProgress with the claimant's lease,
	// committed; the claimant must send Body and call Finish.
	Acquired Outcome = iota + 1
	// Replay: the key's payment succeeded; answer from the record.
	Replay
	// Reused: the key's record holds a different request (another
	// BodySHA256); nothing changed.
	Reused
	// Busy: another owner holds an unexpired lease, or one that expired
	// but may not be taken over yet (the holder is of the claimant's own
	// process, or the store's writes have not been healthy for the
	// takeover grace: see Options.TakeoverGrace); nothing changed.
	Busy
	// PastWindow: the record's outcome is unknown and its settlement window
	// has closed, so nothing may be sent for the key again; the record is
	// left OutcomeUnknown (an expired InProgress record becomes
	// OutcomeUnknown).
	PastWindow
	// Quiet: the record's outcome is unknown and its last request may
	// still be at the provider (Record.QuietUntil has not passed), so
	// nothing may be sent for the key yet; nothing changed.
	Quiet
	// Expired: the key's record was deleted by retention; its tombstone
	// (Began.Tombstone) remains, and nothing may be sent for the key again.
	Expired
	// NotOwned: the claim has OwnKeysOnly and the key's record was
	// created by another caller (or by a call without an identity, when
	// Claim.Caller is not empty); nothing changed, and Began.Record is empty, so that
	// nothing of the other caller's record can leak.
	NotOwned
)

// Began is the result of Begin.
//
// With Claim.OwnKeysOnly, a tombstone whose caller is known and another's
// is NotOwned too; one whose caller is unknown (written before migration
// 5) is Expired.
type Began struct {
	Outcome Outcome
	// Record is the record after Begin: as found, or as acquired.
	Record Record
	// Prior is the record's state before an acquisition: 0 for a new
	// record; NotCreated, OutcomeUnknown, or InProgress with an expired
	// lease. A claimant that acquires a record whose Prior is not 0 or
	// NotCreated must never record it NotCreated: an earlier attempt may
	// have created the payment.
	Prior State
	// Tombstone is the key's tombstone when Outcome is Expired.
	Tombstone Tombstone
}

// Finish records the outcome of the claimant's request, and its attempt.
// Like Claim, it carries durations, measured from the store's clock when
// it is written.
type Finish struct {
	Key   string
	Owner string
	// State is Succeeded, NotCreated or OutcomeUnknown.
	State          State
	AddAttempts    int
	ProviderStatus int
	Reply          []byte
	LastError      string
	Code           int32
	// SettleAfter, for OutcomeUnknown, is how long settlement waits
	// before it may re-send.
	SettleAfter time.Duration
	// QuietFor, if positive, is how much longer the request may still be
	// at the provider (it ended without the provider's answer): nothing
	// is sent with the key until then. Zero or less: the provider is done
	// with it.
	QuietFor time.Duration
	// Settlement marks a finish by the settlement worker: SettleAttempts
	// is incremented.
	Settlement bool
	// Claimed, if set, is the record as the claim that made the request
	// acquired it (Begin's or ClaimDue's: Record.Claimed). With it, an
	// outcome whose record the store has lost since is written again
	// rather than refused: a failover to a standby that lacked the last
	// commits can take the record away, or take it back to before the
	// claim. See Finish.
	Claimed *ClaimedRecord
}

// ClaimedRecord is what Finish needs of the record as a claim acquired
// it, to write the record and the claim's attempt again should the store
// lose them: the request, who made it, and the claim's attempt. It is
// half a Record's size, and paymentsd's outbox keeps one with each
// outcome it has written lately (up to 20,000, for 5 minutes).
type ClaimedRecord struct {
	Body       []byte
	BodySHA256 [32]byte
	Currency   string
	Amount     int64
	// Attempts and SettleAttempts are the record's counts when claimed.
	Attempts       int
	SettleAttempts int
	RequestID      string
	TraceID        string
	Caller         string
	CreatedAt      time.Time
	SettleBy       time.Time
	PriorState     State
	// The claim's attempt.
	AttemptSeq       int
	AttemptKind      AttemptKind
	AttemptRequestID string
	AttemptStartedAt time.Time
}

// Claimed returns what Finish.Claimed needs of r, the record as a claim
// acquired it.
func (r *Record) Claimed() *ClaimedRecord {
	return &ClaimedRecord{
		Body: r.Body, BodySHA256: r.BodySHA256, Currency: r.Currency, Amount: r.Amount,
		Attempts: r.Attempts, SettleAttempts: r.SettleAttempts,
		RequestID: r.RequestID, TraceID: r.TraceID, Caller: r.Caller,
		CreatedAt: r.CreatedAt, SettleBy: r.SettleBy, PriorState: r.PriorState,
		AttemptSeq: r.AttemptSeq, AttemptKind: r.AttemptKind, AttemptRequestID: r.AttemptRequestID,
		AttemptStartedAt: r.AttemptStartedAt,
	}
}

// hotQueries are the queries a payment runs, in the store's dialect,
// built once at Open rather than for every statement.
type hotQueries struct {
	// insert claims a new key; lockedSelect reads (and locks) a key's
	// record.
	insert, lockedSelect string
	// finish records an outcome, finishReturning too and reads the record
	// back; finishAttempt then writes the attempt's row from the record.
	finish, finishReturning, finishAttempt string
	// insertAttempt writes an attempt's row from its values.
	insertAttempt string
	// get reads a record and the store's clock.
	get string
}

func (s *Store) buildHotQueries() hotQueries {
	return hotQueries{
		insert:          s.insertQuery(),
		lockedSelect:    s.d.q(`SELECT ` + recordColumns + ` FROM records WHERE ` + s.d.keyCol + ` = $1 ` + s.d.lockRows),
		finish:          s.finishQuery(false),
		finishReturning: s.finishQuery(true),
		finishAttempt:   s.finishAttemptQuery(),
		insertAttempt:   s.insertAttemptQuery(),
		get:             s.d.q(`SELECT ` + recordColumns + `, ` + s.readClock() + ` FROM records WHERE ` + s.d.keyCol + ` = $1 AND tombstoned_at IS NULL`),
	}
}

// Landing says how FinishWrite wrote an outcome.
type Landing int

const (
	// Landed: the outcome is written now.
	Landed Landing = iota + 1
	// LandedBefore: it had been written already (a Finish repeated after
	// a commit whose outcome was unknown); nothing more was written.
	LandedBefore
	// Restored: the store had lost the record, or the claim's attempt
	// (the database went back in time), and the outcome was written
	// again from Finish.Claimed: the record re-created, or a 2xx recorded
	// on the record as it now is.
	Restored
)

// writerQueries are the queries every payment runs on the writer.
func (s *Store) writerQueries() []string {
	h := s.hot
	qs := []string{h.insert, h.lockedSelect, h.finish, h.finishReturning, h.finishAttempt, h.insertAttempt}
	if s.clock == nil {
		qs = append(qs, nowQuery)
	}
	return qs
}

// insertQuery inserts a new record, unless the key has one or a tombstone:
// it changes one row or none. It returns nothing: the record it writes is
// the claim's, and claimedRecord builds it.
func (s *Store) insertQuery() string {
	d := s.d
	cols, vals := "", ""
	if d.keyCol != "key" {
		// key_hash is the key's SHA-256, as the tombstone's is.
		cols, vals = ", "+d.keyCol, ", $16"
	}
	return d.q(`
		INSERT INTO records (key, body, body_sha256, currency, amount, state,
			request_id, trace_id, caller, created_at, updated_at, settle_by,
			next_settle_at, lease_owner, lease_expires_at, quiet_until,
			attempt_started_at, attempt_seq, attempt_kind, attempt_request_id` + cols + `)
		SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, $11, $12, $13, $14, $15, $10, 1, ` + attemptCall + `, $7` + vals + `
		WHERE NOT EXISTS (SELECT 1 FROM tombstones WHERE key_sha256 = $16)
		ON CONFLICT (` + d.keyCol + `) DO NOTHING`)
}

// claimedRecord is the record that insertQuery writes for c at now, as
// reading it back would give it: every column insertQuery leaves out has
// its default (no attempts, reply or error yet, prior state 0, never
// tombstoned or resolved), and every time is now plus a duration, at the
// microsecond both backends keep.
func claimedRecord(c Claim, now time.Time) Record {
	now = now.Truncate(time.Microsecond).UTC()
	return Record{
		Key:              c.Key,
		Body:             c.Body,
		BodySHA256:       c.BodySHA256,
		Currency:         c.Currency,
		Amount:           c.Amount,
		State:            StateInProgress,
		RequestID:        c.RequestID,
		TraceID:          c.TraceID,
		Caller:           c.Caller,
		CreatedAt:        now,
		UpdatedAt:        now,
		SettleBy:         storedTime(now.Add(c.Window)),
		LeaseOwner:       c.Owner,
		LeaseExpiresAt:   storedTime(now.Add(c.LeaseTTL)),
		QuietUntil:       storedTime(now.Add(c.LeaseTTL + c.Quiet)),
		AttemptStartedAt: now,
		AttemptSeq:       1,
		AttemptKind:      AttemptCall,
		AttemptRequestID: c.RequestID,
		ReadAt:           now,
	}
}

// storedTime is t as a time column gives it back: UTC, to the
// microsecond.
func storedTime(t time.Time) time.Time { return t.Truncate(time.Microsecond).UTC() }

// attemptCall is AttemptCall in SQL.
const attemptCall = "1"

// finishQuery records an outcome on the record its owner still holds: it
// changes one row, or none when the owner no longer holds it. With
// returning it reads back the record it wrote.
func (s *Store) finishQuery(returning bool) string {
	d := s.d
	q := `
		UPDATE records SET state = $3, attempts = attempts + $4, provider_status = $5,
			reply = $6, last_error = $7, code = $8, updated_at = $9, next_settle_at = $10,
			settle_attempts = settle_attempts + $11, lease_owner = '', lease_expires_at = $12,
			quiet_until = $14
		WHERE ` + d.keyCol + ` = $1 AND lease_owner = $2 AND state = $13`
	if returning {
		q += `
		RETURNING ` + recordColumns
	}
	return d.q(q)
}

// recordColumns are the records columns in the order scanRecord reads.
const recordColumns = `key, body, body_sha256, currency, amount, state, attempts,
	provider_status, reply, last_error, code, request_id, trace_id, caller,
	created_at, updated_at, settle_by, next_settle_at, settle_attempts,
	lease_owner, lease_expires_at, gave_up, quiet_until, attempt_started_at,
	prior_state, tombstoned_at, resolved_at, attempt_seq, attempt_kind, attempt_request_id`

// StateResolved reports whether the record's state is a person's
// resolution: it was resolved, and no attempt has started since (a
// resolution needs the record out of flight, so its attempt started
// before; Begin after a NotCreated resolution starts a new one).
func (r Record) StateResolved() bool {
	return !r.ResolvedAt.IsZero() && !r.AttemptStartedAt.After(r.ResolvedAt)
}

type scanner interface{ Scan(dest ...any) error }

func scanRecord(row scanner, extra ...any) (Record, error) {
	var r Record
	var state, prior, kind int
	dest := []any{&r.Key, &r.Body, shaCol{&r.BodySHA256}, &r.Currency, &r.Amount, &state, &r.Attempts,
		&r.ProviderStatus, &r.Reply, &r.LastError, &r.Code, &r.RequestID, &r.TraceID, &r.Caller,
		timeCol{&r.CreatedAt}, timeCol{&r.UpdatedAt}, timeCol{&r.SettleBy}, timeCol{&r.NextSettleAt}, &r.SettleAttempts,
		&r.LeaseOwner, timeCol{&r.LeaseExpiresAt}, &r.GaveUp, timeCol{&r.QuietUntil}, timeCol{&r.AttemptStartedAt},
		&prior, timeCol{&r.TombstonedAt}, timeCol{&r.ResolvedAt}, &r.AttemptSeq, &kind, &r.AttemptRequestID}
	err := row.Scan(append(dest, extra...)...)
	r.State, r.PriorState, r.AttemptKind = State(state), State(prior), AttemptKind(kind)
	return r, err
}

// scanRecords reads rows of recordColumns, each read at now.
func scanRecords(rows *sql.Rows, now time.Time) ([]Record, error) {
	defer rows.Close()
	var out []Record
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, err
		}
		r.ReadAt = now
		out = append(out, r)
	}
	return out, rows.Err()
}

// Begin decides, in one transaction, what a call with c.Key may do, by the
// store's clock:
//   - no record and no tombstone: insert it InProgress with c's lease and
//     window → Acquired;
//   - no record but a tombstone, or a record retention has tombstoned and
//     is about to delete → Expired;
//   - a record another caller created, with c.OwnKeysOnly → NotOwned;
//   - a record with another BodySHA256 → Reused;
//   - Succeeded → Replay;
//   - InProgress with an unexpired lease → Busy;
//   - InProgress with an expired lease that may not be taken over yet
//     (its holder is of c's own process, or the store's writes have not
//     been healthy for the takeover grace) → Busy;
//   - OutcomeUnknown, or InProgress with an expired lease, past SettleBy →
//     PastWindow;
//   - the same before SettleBy, while QuietUntil has not passed → Quiet;
//   - the same once it has → Acquired (keeping SettleBy), Prior set;
//   - NotCreated → Acquired with a new window, Prior set.
//
// An acquisition also presumes the claimant's request at the provider
// until the lease ends plus c.Quiet (QuietUntil), until Finish says
// otherwise, so that a claimant that dies mid-call leaves the key quiet
// for as long as its request may still be worked on. Taking over an
// expired lease writes the row of the attempt its holder never ended
// (abandoned).
//
// It returns ErrKeyNotStorable for a key the backend can't hold exactly.
func (s *Store) Begin(ctx context.Context, c Claim) (Began, error) {
	if !s.d.storable(c.Key) {
		return Began{}, fmt.Errorf("begin %.64q: %w", c.Key, ErrKeyNotStorable)
	}
	var b Began
	// A caller must answer by its deadline, even while the transaction
	// that holds its claim is stuck: it then gets ErrCommitUnknown.
	err := s.batch.runDetachable(ctx, func(ctx context.Context, tx *sql.Tx, now time.Time) error {
		var err error
		b, err = s.begin(ctx, tx, c, now)
		return err
	})
	if err != nil {
		return Began{}, s.wrap(fmt.Errorf("begin %.64q: %w", c.Key, err))
	}
	return b, nil
}

// write runs fn in a write transaction, the batcher's next one, with the
// store's clock as it began.
func (s *Store) write(ctx context.Context, fn func(context.Context, *sql.Tx, time.Time) error) error {
	return s.batch.run(ctx, fn)
}

func (s *Store) begin(ctx context.Context, tx *sql.Tx, c Claim, now time.Time) (Began, error) {
	d := s.d
	keySum := keySHA256(c.Key)
	// The INSERT waits for a concurrent transaction inserting the same key
	// (PostgreSQL) and does nothing once it has committed; the SELECT then
	// locks the committed row. A row deleted in between (retention) sends
	// us round again, to find its tombstone.
	for range 3 {
		args := []any{c.Key, c.Body, c.BodySHA256[:], c.Currency, c.Amount, int(StateInProgress),
			c.RequestID, c.TraceID, c.Caller, d.t(now), d.t(now.Add(c.Window)),
			d.t(time.Time{}), c.Owner, d.t(now.Add(c.LeaseTTL)), d.t(now.Add(c.LeaseTTL + c.Quiet)),
			keySum[:]}
		ins, err := s.txStmt(ctx, tx, s.hot.insert)
		if err != nil {
			return Began{}, err
		}
		res, err := ins.ExecContext(ctx, args...)
		if err != nil {
			return Began{}, err
		}
		inserted, err := res.RowsAffected()
		if err != nil {
			return Began{}, err
		}
		if inserted == 1 {
			return Began{Outcome: Acquired, Record: claimedRecord(c, now)}, nil
		}
		r, err := s.getRecordTx(ctx, tx, c.Key)
		if errors.Is(err, ErrNotFound) {
			ts, err := s.tombstoneTx(ctx, tx, keySum)
			if err == nil {
				if c.OwnKeysOnly && ts.CallerKnown && ts.Caller != c.Caller {
					return Began{Outcome: NotOwned}, nil
				}
				return Began{Outcome: Expired, Tombstone: ts}, nil
			}
			if !errors.Is(err, ErrNotFound) {
				return Began{}, err
			}
			continue
		}
		if err != nil {
			return Began{}, err
		}
		r.ReadAt = now
		return s.decide(ctx, tx, c, r, now)
	}
	return Began{}, errors.New("record deleted and recreated repeatedly while beginning; retry")
}

// decide applies Begin's rules to the existing, locked record r.
func (s *Store) decide(ctx context.Context, tx *sql.Tx, c Claim, r Record, now time.Time) (Began, error) {
	d := s.d
	if c.OwnKeysOnly && r.Caller != c.Caller {
		return Began{Outcome: NotOwned}, nil
	}
	if !r.TombstonedAt.IsZero() {
		ts, err := s.tombstoneTx(ctx, tx, keySHA256(c.Key))
		if errors.Is(err, ErrNotFound) {
			// The tombstone has expired already (a tombstone retention
			// shorter than the grace period): the record says the same.
			ts = Tombstone{KeySHA256: keySHA256(c.Key), BodySHA256: r.BodySHA256, State: r.State, GaveUp: r.GaveUp,
				CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, ExpiredAt: r.TombstonedAt, Caller: r.Caller, CallerKnown: true}
		} else if err != nil {
			return Began{}, fmt.Errorf("tombstone of a tombstoned record: %w", err)
		}
		return Began{Outcome: Expired, Tombstone: ts}, nil
	}
	if r.BodySHA256 != c.BodySHA256 {
		return Began{Outcome: Reused, Record: r}, nil
	}
	expired := !now.Before(r.LeaseExpiresAt)
	acquire := `state = $2, lease_owner = $3, lease_expires_at = $4, updated_at = $5, quiet_until = $6,
		attempt_started_at = $5, prior_state = $7, attempt_seq = attempt_seq + 1, attempt_kind = $8,
		attempt_request_id = $9`
	acquireArgs := []any{int(StateInProgress), c.Owner, d.t(now.Add(c.LeaseTTL)), d.t(now), d.t(now.Add(c.LeaseTTL + c.Quiet)), int(r.State),
		int(AttemptCall), c.RequestID}
	switch {
	case r.State == StateSucceeded:
		return Began{Outcome: Replay, Record: r}, nil
	case r.State == StateInProgress && !expired:
		return Began{Outcome: Busy, Record: r}, nil
	case r.State == StateNotCreated:
		nr, err := updateRecord(ctx, tx, d, now, acquire+`, settle_by = $10, gave_up = $11`,
			c.Key, append(acquireArgs, d.t(now.Add(c.Window)), false)...)
		return Began{Outcome: Acquired, Record: nr, Prior: r.State}, err
	case r.State == StateOutcomeUnknown || r.State == StateInProgress:
		// An expired lease's holder may have an outcome on its way: see
		// writeHealth.
		takeover := r.State == StateInProgress
		if !now.Before(r.SettleBy) {
			if r.State == StateOutcomeUnknown {
				return Began{Outcome: PastWindow, Record: r}, nil
			}
			if !s.mayTakeOver(c.Owner, r.LeaseOwner) {
				return Began{Outcome: Busy, Record: r}, nil
			}
			if err := s.abandon(ctx, tx, r, now); err != nil {
				return Began{}, err
			}
			nr, err := updateRecord(ctx, tx, d, now, `state = $2, lease_owner = '', lease_expires_at = $3, updated_at = $4`,
				c.Key, int(StateOutcomeUnknown), d.t(time.Time{}), d.t(now))
			return Began{Outcome: PastWindow, Record: nr}, err
		}
		if now.Before(r.QuietUntil) {
			return Began{Outcome: Quiet, Record: r}, nil
		}
		if takeover {
			if !s.mayTakeOver(c.Owner, r.LeaseOwner) {
				return Began{Outcome: Busy, Record: r}, nil
			}
			if err := s.abandon(ctx, tx, r, now); err != nil {
				return Began{}, err
			}
		}
		nr, err := updateRecord(ctx, tx, d, now, acquire, c.Key, acquireArgs...)
		return Began{Outcome: Acquired, Record: nr, Prior: r.State}, err
	}
	return Began{}, fmt.Errorf("record in unknown state %d", r.State)
}

// getRecordTx reads and locks key's record in tx.
func (s *Store) getRecordTx(ctx context.Context, tx *sql.Tx, key string) (Record, error) {
	st, err := s.txStmt(ctx, tx, s.hot.lockedSelect)
	if err != nil {
		return Record{}, err
	}
	r, err := scanRecord(st.QueryRowContext(ctx, s.d.k(key)))
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, ErrNotFound
	}
	return r, err
}

// updateRecord sets columns ($2 onwards are args) on key's record and
// returns it, read at now.
func updateRecord(ctx context.Context, tx *sql.Tx, d dialect, now time.Time, set string, key string, args ...any) (Record, error) {
	args = append([]any{d.k(key)}, args...)
	r, err := scanRecord(tx.QueryRowContext(ctx, d.q(`UPDATE records SET `+set+` WHERE `+d.keyCol+` = $1 RETURNING `+recordColumns), args...))
	r.ReadAt = now
	return r, err
}

// Finish records f's outcome if f.Owner still holds the lease, clearing
// it, with the row of its attempt, in one transaction; and returns the
// record.
//
// If f.Owner no longer holds the lease (it expired and the record was
// taken over, or given up), only a success is written: a 2xx is never
// forgotten. Its attempt's row gets the reply, and the record becomes
// Succeeded with it unless it already is (a record that is Succeeded
// stays so, with its first reply; a taker's attempt in flight is ended
// as abandoned, and its own finish will find the record Succeeded). Any
// other outcome without the lease writes nothing and is ErrLeaseLost. A
// Finish that is repeated after it committed (its commit's outcome was
// unknown) finds its attempt's row and writes nothing more.
//
// The database may also have gone back in time since the claim (a
// failover to an asynchronous standby that lacked the last commits). A
// 2xx with f.Claimed set is written whatever the record now says, as
// above, even if the claim's attempt left no trace. And if the record is gone and
// f.Claimed is set, the record is written again, from f.Claimed, with
// f's outcome, whatever it is (unless the key has a tombstone).
func (s *Store) Finish(ctx context.Context, f Finish) (Record, error) {
	fin, err := s.finishOp(f, true)
	if err != nil {
		return Record{}, err
	}
	var r Record
	err = s.write(ctx, func(ctx context.Context, tx *sql.Tx, now time.Time) error {
		var err error
		r, _, err = fin(ctx, tx, now)
		return err
	})
	if err != nil {
		return Record{}, s.wrap(fmt.Errorf("finish %.64q: %w", f.Key, err))
	}
	return r, nil
}

// FinishWrite is Finish without reading the record back: for a caller
// that only needs to know that the outcome is durable (nil, and how it
// landed) or can never be (ErrLeaseLost). Its error is otherwise
// Finish's.
func (s *Store) FinishWrite(ctx context.Context, f Finish) (Landing, error) {
	fin, err := s.finishOp(f, false)
	if err != nil {
		return 0, err
	}
	var l Landing
	err = s.write(ctx, func(ctx context.Context, tx *sql.Tx, now time.Time) error {
		var err error
		_, l, err = fin(ctx, tx, now)
		return err
	})
	if err != nil {
		return 0, s.wrap(fmt.Errorf("finish %.64q: %w", f.Key, err))
	}
	return l, nil
}

// finishOp checks f and returns the statement that records it. Only with
// returning does the statement read back the record it wrote; without, the
// Record it returns is empty.
func (s *Store) finishOp(f Finish, returning bool) (func(context.Context, *sql.Tx, time.Time) (Record, Landing, error), error) {
	if !s.d.storable(f.Key) {
		return nil, fmt.Errorf("finish %.64q: %w", f.Key, ErrLeaseLost)
	}
	switch f.State {
	case StateSucceeded, StateNotCreated, StateOutcomeUnknown:
	default:
		return nil, fmt.Errorf("finish %.64q: state %v is not an outcome", f.Key, f.State)
	}
	d := s.d
	settle := 0
	if f.Settlement {
		settle = 1
	}
	return func(ctx context.Context, tx *sql.Tx, now time.Time) (Record, Landing, error) {
		query := s.hot.finish
		if returning {
			query = s.hot.finishReturning
		}
		st, err := s.txStmt(ctx, tx, query)
		if err != nil {
			return Record{}, 0, err
		}
		var next, quiet time.Time
		if f.State == StateOutcomeUnknown {
			next = now.Add(max(f.SettleAfter, 0))
		}
		if f.QuietFor > 0 {
			quiet = now.Add(f.QuietFor)
		}
		args := []any{d.k(f.Key), f.Owner, int(f.State), f.AddAttempts, f.ProviderStatus,
			f.Reply, f.LastError, f.Code, d.t(now), d.t(next),
			settle, d.t(time.Time{}), int(StateInProgress), d.t(quiet)}
		var r Record
		var held bool
		if returning {
			rows, err := st.QueryContext(ctx, args...)
			if err != nil {
				return Record{}, 0, err
			}
			rs, err := scanRecords(rows, now)
			if err != nil {
				return Record{}, 0, err
			}
			if held = len(rs) > 0; held {
				r = rs[0]
			}
		} else {
			res, err := st.ExecContext(ctx, args...)
			if err != nil {
				return Record{}, 0, err
			}
			n, err := res.RowsAffected()
			if err != nil {
				return Record{}, 0, err
			}
			held = n > 0
		}
		if !held {
			return s.finishWithoutLease(ctx, tx, f, now, returning)
		}
		// The attempt's number, kind, request ID and start are the
		// record's, which the UPDATE left as they were.
		at, err := s.txStmt(ctx, tx, s.hot.finishAttempt)
		if err != nil {
			return Record{}, 0, fmt.Errorf("write attempt: %w", err)
		}
		if _, err := at.ExecContext(ctx, d.k(f.Key), f.Owner, ownerProcess(f.Owner), d.t(now),
			f.ProviderStatus, f.AddAttempts, f.Reply, int(f.State), f.Code, f.LastError, false); err != nil {
			return Record{}, 0, fmt.Errorf("write attempt: %w", err)
		}
		return r, Landed, nil
	}, nil
}

// finishWithoutLease is Finish for an owner that no longer holds the
// record's lease (or whose Finish committed already, or whose claim the
// database lost).
func (s *Store) finishWithoutLease(ctx context.Context, tx *sql.Tx, f Finish, now time.Time, returning bool) (Record, Landing, error) {
	d := s.d
	r, err := s.getRecordTx(ctx, tx, f.Key)
	if errors.Is(err, ErrNotFound) {
		return s.restoreRecord(ctx, tx, f, now, returning)
	}
	if err != nil {
		return Record{}, 0, err
	}
	r.ReadAt = now
	a, found, err := s.ownAttempt(ctx, tx, f.Key, f.Owner)
	switch {
	case err != nil:
		return Record{}, 0, err
	case !r.TombstonedAt.IsZero():
		// Retention is about to delete it.
		return Record{}, 0, ErrLeaseLost
	case found && !a.abandoned && a.state == f.State && a.providerStatus == f.ProviderStatus:
		// Written already: this is a Finish repeated after a commit whose
		// outcome was unknown.
		return r, LandedBefore, nil
	case f.State != StateSucceeded || (found && !a.abandoned):
		return Record{}, 0, ErrLeaseLost
	case !found && f.Claimed == nil:
		// f.Owner left no trace and f says nothing of its claim: an owner
		// that never held the record.
		return Record{}, 0, ErrLeaseLost
	}
	// The record, gone and written anew by a call with another request
	// for the key (another amount), keeps that request's state: the 2xx
	// is kept as its attempt only.
	sameRequest := f.Claimed == nil || f.Claimed.BodySHA256 == r.BodySHA256
	// A 2xx is never forgotten: one that came after its lease ended (its
	// attempt's row says abandoned), or one whose claim, as f.Claimed
	// describes it, left no trace (the database went back to before it).
	landing := Landed
	if found {
		_, err = tx.ExecContext(ctx, d.q(`
			UPDATE attempts SET ended_at = $2, provider_status = $3, http_requests = $4, reply = $5,
				state = $6, code = $7, error = $8, abandoned = $9
			WHERE id = $1`),
			a.id, d.t(now), f.ProviderStatus, f.AddAttempts, f.Reply, int(f.State), f.Code, f.LastError, false)
	} else {
		landing = Restored
		err = s.insertAttempt(ctx, tx, f.Key, claimedAttempt(f, r, now))
	}
	if err != nil {
		return Record{}, 0, fmt.Errorf("record a 2xx after the lease: %w", err)
	}
	set := `attempts = attempts + $2, updated_at = $3`
	args := []any{f.AddAttempts, d.t(now)}
	if f.Claimed != nil && f.Claimed.AttemptSeq > r.AttemptSeq {
		// Later attempts are numbered after this one.
		set += `, attempt_seq = $4`
		args = append(args, f.Claimed.AttemptSeq)
	}
	if r.State != StateSucceeded && sameRequest {
		if r.State == StateInProgress && r.LeaseOwner != f.Owner {
			// Another holder is sending the key now: its attempt ends
			// here, and its own Finish will find the record Succeeded.
			if err := s.abandon(ctx, tx, r, now); err != nil {
				return Record{}, 0, err
			}
		}
		n := len(args)
		set += fmt.Sprintf(`, state = $%d, provider_status = $%d, reply = $%d, last_error = '', code = $%d,
			lease_owner = '', lease_expires_at = $%d, next_settle_at = $%d, resolved_at = NULL`, n+2, n+3, n+4, n+5, n+6, n+6)
		args = append(args, int(StateSucceeded), f.ProviderStatus, f.Reply, f.Code, d.t(time.Time{}))
	}
	nr, err := updateRecord(ctx, tx, d, now, set, f.Key, args...)
	if err != nil {
		return Record{}, 0, fmt.Errorf("record a 2xx after the lease: %w", err)
	}
	if !returning {
		return Record{}, landing, nil
	}
	return nr, landing, nil
}

// claimedAttempt is the row of f's attempt when the record holds no trace
// of its claim: from f.Claimed, or as well as r allows without it.
func claimedAttempt(f Finish, r Record, now time.Time) Attempt {
	a := Attempt{
		Number: r.AttemptSeq, Kind: r.AttemptKind, Owner: f.Owner, Replica: ownerProcess(f.Owner),
		EndedAt: now, ProviderStatus: f.ProviderStatus, HTTPRequests: f.AddAttempts, Reply: f.Reply,
		State: f.State, Code: f.Code, Error: f.LastError,
	}
	if c := f.Claimed; c != nil {
		a.Number, a.Kind, a.RequestID, a.StartedAt = c.AttemptSeq, c.AttemptKind, c.AttemptRequestID, c.AttemptStartedAt
	}
	return a
}

// restoreRecord writes f's record again, from f.Claimed, with f's
// outcome and its attempt's row: the record is gone, though f's claim
// acquired it (the database went back to before the claim committed). A
// key with a tombstone, or a Finish without Claimed, is ErrLeaseLost.
func (s *Store) restoreRecord(ctx context.Context, tx *sql.Tx, f Finish, now time.Time, returning bool) (Record, Landing, error) {
	c := f.Claimed
	if c == nil {
		return Record{}, 0, ErrLeaseLost
	}
	keySum := keySHA256(f.Key)
	if _, err := s.tombstoneTx(ctx, tx, keySum); err == nil {
		return Record{}, 0, ErrLeaseLost
	} else if !errors.Is(err, ErrNotFound) {
		return Record{}, 0, err
	}
	d := s.d
	var next, quiet time.Time
	if f.State == StateOutcomeUnknown {
		next = now.Add(max(f.SettleAfter, 0))
	}
	if f.QuietFor > 0 {
		quiet = now.Add(f.QuietFor)
	}
	settle := c.SettleAttempts
	if f.Settlement {
		settle++
	}
	args := []any{f.Key, c.Body, c.BodySHA256[:], c.Currency, c.Amount, int(f.State), c.Attempts + f.AddAttempts,
		f.ProviderStatus, f.Reply, f.LastError, f.Code, c.RequestID, c.TraceID, c.Caller,
		d.t(c.CreatedAt), d.t(now), d.t(c.SettleBy), d.t(next), settle,
		d.t(time.Time{}), false, d.t(quiet), d.t(c.AttemptStartedAt),
		int(c.PriorState), c.AttemptSeq, int(c.AttemptKind), c.AttemptRequestID}
	cols, vals := "", ""
	if d.keyCol != "key" {
		cols, vals = ", "+d.keyCol, ", $28"
		args = append(args, keySum[:])
	}
	// A claim that raced this (the record is not locked: there was none)
	// makes the INSERT fail, and the outcome is tried again.
	_, err := tx.ExecContext(ctx, d.q(`
		INSERT INTO records (key, body, body_sha256, currency, amount, state, attempts,
			provider_status, reply, last_error, code, request_id, trace_id, caller,
			created_at, updated_at, settle_by, next_settle_at, settle_attempts,
			lease_owner, lease_expires_at, gave_up, quiet_until, attempt_started_at,
			prior_state, attempt_seq, attempt_kind, attempt_request_id, resolved_at`+cols+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19,
			'', $20, $21, $22, $23, $24, $25, $26, $27, NULL`+vals+`)`), args...)
	if err != nil {
		return Record{}, 0, fmt.Errorf("write a lost record again: %w", err)
	}
	// The attempt is all f.Claimed's: there is no record to fall back on.
	if err := s.insertAttempt(ctx, tx, f.Key, claimedAttempt(f, Record{}, now)); err != nil {
		return Record{}, 0, err
	}
	if !returning {
		return Record{}, Restored, nil
	}
	r, err := s.getRecordTx(ctx, tx, f.Key)
	r.ReadAt = now
	return r, Restored, err
}

// Get returns the record for key, or ErrNotFound (see Tombstone for a key
// whose record retention deleted, or has tombstoned and is about to).
// Record.ReadAt is the store's clock at the read.
func (s *Store) Get(ctx context.Context, key string) (Record, error) {
	if !s.d.storable(key) {
		return Record{}, fmt.Errorf("get %.64q: %w", key, ErrNotFound)
	}
	r, err := func() (Record, error) {
		st, err := s.prepared(ctx, s.r, s.hot.get)
		if err != nil {
			return Record{}, err
		}
		var at timeCol
		var readAt time.Time
		at.t = &readAt
		r, err := scanRecord(st.QueryRowContext(ctx, s.d.k(key)), at)
		if errors.Is(err, sql.ErrNoRows) {
			return Record{}, ErrNotFound
		}
		r.ReadAt = s.readTime(readAt)
		return r, err
	}()
	if err != nil {
		return Record{}, s.wrap(fmt.Errorf("get %.64q: %w", key, err))
	}
	return r, nil
}

// ClaimDue takes the lease (for leaseTTL) on up to limit records due for
// settlement, by the store's clock, marking them InProgress, and returns
// them: OutcomeUnknown records with NextSettleAt passed, and InProgress
// records whose lease expired, both only while SettleBy has not passed and
// once QuietUntil has (no earlier request may still be at the provider).
// An expired lease is taken over only as Begin would: never one of
// owner's own process, and only once the store's writes have been healthy
// for the takeover grace; its holder's attempt gets its row (abandoned).
// Each claimed record's request is presumed at the provider until its
// lease ends plus quiet, until Finish says otherwise. Replicas never claim
// the same record at once.
//
// owner is "<process>/<claim id>", new for each call: a record's attempts
// are told apart by their owners.
func (s *Store) ClaimDue(ctx context.Context, owner string, leaseTTL, quiet time.Duration, limit int) ([]Record, error) {
	if limit <= 0 {
		return nil, nil
	}
	d := s.d
	var out []Record
	err := s.transact(ctx, func(tx *sql.Tx) error {
		out = nil
		now, err := s.txNow(ctx, tx)
		if err != nil {
			return err
		}
		due, err := s.lockDue(ctx, tx, `(state = $1 AND next_settle_at <= $2)`, ownerProcess(owner),
			`AND settle_by > $2 AND quiet_until <= $2 ORDER BY next_settle_at, key`, limit, now)
		if err != nil {
			return err
		}
		for _, r := range due {
			if r.State == StateInProgress {
				if err := s.abandon(ctx, tx, r, now); err != nil {
					return err
				}
			}
			nr, err := updateRecord(ctx, tx, d, now, `state = $2, lease_owner = $3, lease_expires_at = $4, updated_at = $5,
				quiet_until = $6, attempt_started_at = $5, prior_state = state, attempt_seq = attempt_seq + 1,
				attempt_kind = $7, attempt_request_id = ''`,
				r.Key, int(StateInProgress), owner, d.t(now.Add(leaseTTL)), d.t(now), d.t(now.Add(leaseTTL+quiet)), int(AttemptSettlement))
			if err != nil {
				return err
			}
			out = append(out, nr)
		}
		return nil
	})
	if err != nil {
		return nil, s.wrap(fmt.Errorf("claim due records: %w", err))
	}
	return out, nil
}

// Release ends owner's claims, which may have committed without its
// claimant learning it (ClaimDue's ErrCommitUnknown): every record
// InProgress under owner's lease becomes OutcomeUnknown again, due for
// settlement after settleAfter, and its attempt gets its row, nothing
// sent. It returns how many it released: none when the claim never
// committed. (A claimant never takes over its own process's records, so
// without this a lost claim would wait for another replica.)
func (s *Store) Release(ctx context.Context, owner string, settleAfter time.Duration) (int, error) {
	d := s.d
	var n int
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx, now time.Time) error {
		n = 0
		rows, err := tx.QueryContext(ctx, d.q(`SELECT `+recordColumns+` FROM records
			WHERE state = $1 AND lease_owner = $2 `+d.lockRows), int(StateInProgress), owner)
		if err != nil {
			return err
		}
		held, err := scanRecords(rows, now)
		if err != nil {
			return err
		}
		for _, r := range held {
			err := s.insertAttempt(ctx, tx, r.Key, Attempt{
				Number: r.AttemptSeq, Kind: r.AttemptKind, Owner: owner, Replica: ownerProcess(owner),
				RequestID: r.AttemptRequestID, StartedAt: r.AttemptStartedAt, EndedAt: now, State: StateOutcomeUnknown,
				Error: "released: the claim's commit was not confirmed to its claimant, which sent nothing",
			})
			if err != nil {
				return err
			}
			if _, err := updateRecord(ctx, tx, d, now, `state = $2, lease_owner = '', lease_expires_at = $3, quiet_until = $3,
				next_settle_at = $4, updated_at = $5`, r.Key, int(StateOutcomeUnknown), d.t(time.Time{}),
				d.t(now.Add(max(settleAfter, 0))), d.t(now)); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	if err != nil {
		return 0, s.wrap(fmt.Errorf("release claims: %w", err))
	}
	return n, nil
}

// lockDue reads and locks up to limit untombstoned records that are
// OutcomeUnknown and match unknown (with $1 for OutcomeUnknown and $2 for
// now), or, if the store's writes have been healthy for the takeover
// grace, InProgress with an expired lease held by another process than
// process; more (with $2 for now) follows the condition: further
// conditions and the order.
func (s *Store) lockDue(ctx context.Context, tx *sql.Tx, unknown, process, more string, limit int, now time.Time) ([]Record, error) {
	d := s.d
	cond := unknown
	args := []any{int(StateOutcomeUnknown), d.t(now), limit}
	if s.writesSettled() {
		expired := `(state = $4 AND lease_expires_at <= $2`
		args = append(args, int(StateInProgress))
		if process != "" {
			// Never this process's own: its outcome is in its outbox.
			expired += ` AND substr(lease_owner, 1, $5) <> $6`
			args = append(args, len(process)+1, process+"/")
		}
		cond = `(` + unknown + ` OR ` + expired + `))`
	}
	rows, err := tx.QueryContext(ctx, d.q(`SELECT `+recordColumns+` FROM records
		WHERE `+cond+` AND tombstoned_at IS NULL `+more+`
		LIMIT $3 `+d.skipLocked), args...)
	if err != nil {
		return nil, err
	}
	return scanRecords(rows, now)
}

// GiveUp marks up to limit records whose settlement window has closed, by
// the store's clock, unsettled and not yet marked: OutcomeUnknown records,
// and InProgress records with an expired lease (which become
// OutcomeUnknown; as ClaimDue does, it leaves those of its own process,
// and all of them until the store's writes have been healthy for the
// takeover grace, and writes the abandoned attempt's row). It returns the
// records it marked, each once ever, for logging. process names the
// calling process, as the part of its lease owners before the "/".
func (s *Store) GiveUp(ctx context.Context, process string, limit int) ([]Record, error) {
	if limit <= 0 {
		return nil, nil
	}
	d := s.d
	var out []Record
	err := s.transact(ctx, func(tx *sql.Tx) error {
		out = nil
		now, err := s.txNow(ctx, tx)
		if err != nil {
			return err
		}
		// false is a boolean in PostgreSQL, and 0 in SQLite.
		due, err := s.lockDue(ctx, tx, `state = $1`, process,
			`AND settle_by <= $2 AND gave_up = false ORDER BY settle_by, key`, limit, now)
		if err != nil {
			return err
		}
		for _, r := range due {
			set := `state = $2, gave_up = $3, updated_at = $4`
			if r.State == StateInProgress {
				if err := s.abandon(ctx, tx, r, now); err != nil {
					return err
				}
				set += `, lease_owner = '', lease_expires_at = $5`
			}
			args := []any{int(StateOutcomeUnknown), true, d.t(now)}
			if r.State == StateInProgress {
				args = append(args, d.t(time.Time{}))
			}
			nr, err := updateRecord(ctx, tx, d, now, set, r.Key, args...)
			if err != nil {
				return err
			}
			out = append(out, nr)
		}
		return nil
	})
	if err != nil {
		return nil, s.wrap(fmt.Errorf("give up on records: %w", err))
	}
	return out, nil
}

// AbandonOwn ends, by the store's clock, up to limit claims of process
// (the part of its lease owners before the "/") whose leases expired and
// that keep reports are no longer kept in memory: each record becomes
// OutcomeUnknown, due for settlement now, its quiet period kept (its
// request may have reached the provider), and its attempt gets its row
// (abandoned). It returns the records it ended, and does nothing until
// the store's writes have been healthy for the takeover grace.
//
// A process never takes over its own records (their outcomes are in its
// outbox), so a record whose holder's process lives on but holds nothing
// for it any more would be held for ever, unless another replica took it
// over: the database went back in time to before the claim's outcome
// was written, say, and the process no longer remembers it.
func (s *Store) AbandonOwn(ctx context.Context, process string, keep func(Record) bool, limit int) ([]Record, error) {
	if limit <= 0 || process == "" || !s.writesSettled() {
		return nil, nil
	}
	d := s.d
	var out []Record
	err := s.transact(ctx, func(tx *sql.Tx) error {
		out = nil
		now, err := s.txNow(ctx, tx)
		if err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, d.q(`SELECT `+recordColumns+` FROM records
			WHERE state = $1 AND lease_expires_at <= $2 AND substr(lease_owner, 1, $3) = $4 AND tombstoned_at IS NULL
			ORDER BY lease_expires_at LIMIT $5 `+d.skipLocked), int(StateInProgress), d.t(now), len(process)+1, process+"/", limit)
		if err != nil {
			return err
		}
		held, err := scanRecords(rows, now)
		if err != nil {
			return err
		}
		for _, r := range held {
			if keep(r) {
				continue
			}
			if err := s.abandon(ctx, tx, r, now); err != nil {
				return err
			}
			nr, err := updateRecord(ctx, tx, d, now, `state = $2, lease_owner = '', lease_expires_at = $3, next_settle_at = $4, updated_at = $4`,
				r.Key, int(StateOutcomeUnknown), d.t(time.Time{}), d.t(now))
			if err != nil {
				return err
			}
			out = append(out, nr)
		}
		return nil
	})
	if err != nil {
		return nil, s.wrap(fmt.Errorf("abandon own claims: %w", err))
	}
	return out, nil
}
