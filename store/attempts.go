package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrAttemptSucceeded: a resolution said a key's payment was not created,
// and an attempt for the key got a 2xx; nothing was written.
var ErrAttemptSucceeded = errors.New("an attempt for the key got a 2xx")

// AttemptKind says who made an attempt.
type AttemptKind int

const (
	// AttemptCall: a CreateMultiCardPayment call sent it.
	AttemptCall AttemptKind = 1
	// AttemptSettlement: settlement re-sent the recorded body.
	AttemptSettlement AttemptKind = 2
)

func (k AttemptKind) String() string {
	switch k {
	case AttemptCall:
		return "call"
	case AttemptSettlement:
		return "settlement"
	}
	return "unspecified"
}

// Attempt is one attempt to send a key's request: the claim of its record
// by a call or by settlement, and what came of it.
type Attempt struct {
	// Number counts the record's attempts from 1 (from when attempts were
	// first kept, for a record older than that).
	Number int
	Kind   AttemptKind
	// Owner is the claim that made it, "<replica>/<claim id>", and
	// Replica the process; RequestID is its call's request ID (none for
	// settlement).
	Owner     string
	Replica   string
	RequestID string
	StartedAt time.Time
	// EndedAt is when its outcome was recorded; zero while InFlight.
	EndedAt time.Time
	// ProviderStatus is the provider's HTTP status (0: none), Reply its
	// body exactly (the payment for a 2xx, else the error body), and
	// HTTPRequests the requests the attempt sent (0 when nothing was
	// sent, or when nobody knows: Abandoned).
	ProviderStatus int
	HTTPRequests   int
	Reply          []byte
	// State is the outcome it recorded; Code and Error what its caller was
	// answered, as Record's Code and LastError.
	State State
	Code  int32
	Error string
	// Abandoned: its holder recorded no outcome (it died, or its lease
	// ran out first); whoever took the record over or gave it up wrote
	// the row. Its request may have reached the provider.
	Abandoned bool
	// InFlight: the attempt is being made now; it has no row yet.
	InFlight bool
}

// abandonedError is the Error of an abandoned attempt.
const abandonedError = "abandoned: no answer recorded"

const attemptColumns = `attempt, kind, owner, replica, request_id, started_at, ended_at,
	provider_status, http_requests, reply, state, code, error, abandoned`

// insertAttemptQuery writes one attempt row.
func (s *Store) insertAttemptQuery() string {
	d := s.d
	return d.q(`
		INSERT INTO attempts (` + d.keyCol + `, ` + attemptColumns + `)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`)
}

// finishAttemptQuery writes the row of the attempt a record holds in
// flight, as its holder's outcome is recorded: its number, kind, request
// ID and start from the record, the rest from the arguments.
func (s *Store) finishAttemptQuery() string {
	d := s.d
	return d.q(`
		INSERT INTO attempts (` + d.keyCol + `, ` + attemptColumns + `)
		SELECT ` + d.keyCol + `, attempt_seq, attempt_kind, $2, $3, attempt_request_id, attempt_started_at, $4,
			$5, $6, $7, $8, $9, $10, $11
		FROM records WHERE ` + d.keyCol + ` = $1`)
}

// insertAttempt writes a row for attempt a of key.
func (s *Store) insertAttempt(ctx context.Context, tx *sql.Tx, key string, a Attempt) error {
	d := s.d
	st, err := s.txStmt(ctx, tx, s.hot.insertAttempt)
	if err != nil {
		return fmt.Errorf("write attempt: %w", err)
	}
	_, err = st.ExecContext(ctx,
		d.k(key), a.Number, int(a.Kind), a.Owner, a.Replica, a.RequestID, d.t(a.StartedAt), d.t(a.EndedAt),
		a.ProviderStatus, a.HTTPRequests, a.Reply, int(a.State), a.Code, a.Error, a.Abandoned)
	if err != nil {
		return fmt.Errorf("write attempt: %w", err)
	}
	return nil
}

// abandon writes the row of r's attempt in flight, whose holder recorded
// no outcome, as r is taken over or given up at now.
func (s *Store) abandon(ctx context.Context, tx *sql.Tx, r Record, now time.Time) error {
	return s.insertAttempt(ctx, tx, r.Key, Attempt{
		Number: r.AttemptSeq, Kind: r.AttemptKind, Owner: r.LeaseOwner, Replica: ownerProcess(r.LeaseOwner),
		RequestID: r.AttemptRequestID, StartedAt: r.AttemptStartedAt, EndedAt: now,
		State: StateOutcomeUnknown, Error: abandonedError, Abandoned: true,
	})
}

// attemptRow is what finishWithoutLease reads of an attempt's row.
type attemptRow struct {
	id             int64
	abandoned      bool
	state          State
	providerStatus int
}

// ownAttempt is the row of owner's attempt of key, if any.
func (s *Store) ownAttempt(ctx context.Context, tx *sql.Tx, key, owner string) (attemptRow, bool, error) {
	d := s.d
	var a attemptRow
	var state int
	err := tx.QueryRowContext(ctx, d.q(`SELECT id, abandoned, state, provider_status FROM attempts
		WHERE `+d.keyCol+` = $1 AND owner = $2 ORDER BY id DESC LIMIT 1`),
		d.k(key), owner).Scan(&a.id, &a.abandoned, &state, &a.providerStatus)
	if errors.Is(err, sql.ErrNoRows) {
		return attemptRow{}, false, nil
	}
	a.state = State(state)
	return a, err == nil, err
}

// hasSucceededAttempt reports whether any attempt of key got a 2xx.
func (s *Store) hasSucceededAttempt(ctx context.Context, tx *sql.Tx, key string) (bool, error) {
	d := s.d
	var n int
	err := tx.QueryRowContext(ctx, d.q(`SELECT COUNT(*) FROM attempts WHERE `+d.keyCol+` = $1 AND provider_status >= 200 AND provider_status < 300`),
		d.k(key)).Scan(&n)
	return n > 0, err
}

// Attempts returns r's attempts (r as Get returned it), oldest first: the
// ended ones, then, while r is InProgress, the one in flight.
func (s *Store) Attempts(ctx context.Context, r Record) ([]Attempt, error) {
	d := s.d
	out, err := func() ([]Attempt, error) {
		st, err := s.prepared(ctx, s.r, d.q(`SELECT `+attemptColumns+` FROM attempts WHERE `+d.keyCol+` = $1 ORDER BY id`))
		if err != nil {
			return nil, err
		}
		rows, err := st.QueryContext(ctx, d.k(r.Key))
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []Attempt
		for rows.Next() {
			a, err := scanAttempt(rows)
			if err != nil {
				return nil, err
			}
			out = append(out, a)
		}
		return out, rows.Err()
	}()
	if err != nil {
		return nil, s.wrap(fmt.Errorf("attempts %.64q: %w", r.Key, err))
	}
	if r.State == StateInProgress {
		out = append(out, inFlight(r))
	}
	return out, nil
}

// scanAttempt reads a row of attemptColumns, after the columns of
// before.
func scanAttempt(row scanner, before ...any) (Attempt, error) {
	var a Attempt
	var kind, state int
	dest := append(before, &a.Number, &kind, &a.Owner, &a.Replica, &a.RequestID, timeCol{&a.StartedAt}, timeCol{&a.EndedAt},
		&a.ProviderStatus, &a.HTTPRequests, &a.Reply, &state, &a.Code, &a.Error, &a.Abandoned)
	err := row.Scan(dest...)
	a.Kind, a.State = AttemptKind(kind), State(state)
	return a, err
}

// inFlight is r's attempt in flight, as the record holds it.
func inFlight(r Record) Attempt {
	return Attempt{
		Number: r.AttemptSeq, Kind: r.AttemptKind, Owner: r.LeaseOwner, Replica: ownerProcess(r.LeaseOwner),
		RequestID: r.AttemptRequestID, StartedAt: r.AttemptStartedAt, State: StateInProgress, InFlight: true,
	}
}

// Written names an outcome a claim wrote: its key, and the claim's owner.
type Written struct{ Key, Owner string }

// lostBatch bounds the keys Lost asks about in one query.
const lostBatch = 200

// Lost returns the indexes in ws of the outcomes the store no longer
// holds: no row of the owner's attempt of the key is left, so the record
// is gone or has gone back to before the outcome was written (the
// database went back in time: a failover to an asynchronous standby that
// lacked the last commits). A key whose record retention deleted (it has
// a tombstone) is not lost. The outcomes' writers may write them again
// (FinishWrite with Finish.Claimed).
func (s *Store) Lost(ctx context.Context, ws []Written) ([]int, error) {
	d := s.d
	id := func(key string) string {
		switch k := d.k(key).(type) {
		case []byte:
			return string(k)
		default:
			return k.(string)
		}
	}
	var lost []int
	for from := 0; from < len(ws); from += lostBatch {
		part := ws[from:min(from+lostBatch, len(ws))]
		held := make(map[Written]bool, len(part))
		var keys []any
		for _, w := range part {
			if d.storable(w.Key) {
				keys = append(keys, d.k(w.Key))
			}
		}
		err := s.scanIn(ctx, `SELECT `+d.keyCol+`, owner FROM attempts WHERE `+d.keyCol+` IN `, keys, func(rows *sql.Rows) error {
			var key []byte
			var owner string
			if err := rows.Scan(&key, &owner); err != nil {
				return err
			}
			held[Written{Key: string(key), Owner: owner}] = true
			return nil
		})
		if err != nil {
			return nil, s.wrap(fmt.Errorf("look for lost outcomes: %w", err))
		}
		var missing []int
		var sums []any
		for i, w := range part {
			if d.storable(w.Key) && !held[Written{Key: id(w.Key), Owner: w.Owner}] {
				missing = append(missing, i)
				sum := keySHA256(w.Key)
				sums = append(sums, sum[:])
			}
		}
		expired := map[string]bool{}
		err = s.scanIn(ctx, `SELECT key_sha256 FROM tombstones WHERE key_sha256 IN `, sums, func(rows *sql.Rows) error {
			var sum []byte
			if err := rows.Scan(&sum); err != nil {
				return err
			}
			expired[string(sum)] = true
			return nil
		})
		if err != nil {
			return nil, s.wrap(fmt.Errorf("look for lost outcomes: %w", err))
		}
		for _, i := range missing {
			if sum := keySHA256(part[i].Key); !expired[string(sum[:])] {
				lost = append(lost, from+i)
			}
		}
	}
	return lost, nil
}

// scanIn runs query, which ends in "IN ", with the list of args, on the
// readers, calling scan for each row; with no args it runs nothing.
func (s *Store) scanIn(ctx context.Context, query string, args []any, scan func(*sql.Rows) error) error {
	if len(args) == 0 {
		return nil
	}
	var in strings.Builder
	in.WriteString("(")
	for i := range args {
		if i > 0 {
			in.WriteString(", ")
		}
		fmt.Fprintf(&in, "$%d", i+1)
	}
	in.WriteString(")")
	rows, err := s.r.QueryContext(ctx, s.d.q(query+in.String()), args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
