package store

import (
	"strconv"
	"strings"
	"time"

	"example.com/paymentsd/internal/record"
)

// Named statements. Every change to a record is record.Step's, and the
// store writes it with the statement named for its kind (record.Write),
// built here once per dialect at Open, as river names its queries per
// driver. A statement writes the columns its kind of change sets, taken
// from the record Step returned, and is guarded: it changes the row only
// while the record is as Step read it (a finish, only while its author
// holds the record), so that no statement writes over a change it did not
// see.

// column is one column of records: its name, its value in a record (to
// write it), and where scanning puts it.
type column struct {
	name string
	val  func(d dialect, r *record.Record) any
	dest func(r *record.Record) any
}

// recordCols are the columns of records, in the order scanRecord reads.
var recordCols = []column{
	{"key", func(_ dialect, r *record.Record) any { return r.Key }, func(r *record.Record) any { return &r.Key }},
	{"body", func(_ dialect, r *record.Record) any { return r.Body }, func(r *record.Record) any { return &r.Body }},
	{"body_sha256", func(_ dialect, r *record.Record) any { return r.BodySHA256[:] }, func(r *record.Record) any { return shaCol{&r.BodySHA256} }},
	{"currency", func(_ dialect, r *record.Record) any { return r.Currency }, func(r *record.Record) any { return &r.Currency }},
	{"amount", func(_ dialect, r *record.Record) any { return r.Amount }, func(r *record.Record) any { return &r.Amount }},
	{"state", func(_ dialect, r *record.Record) any { return int(r.State) }, func(r *record.Record) any { return byteCol[record.State]{&r.State} }},
	{"attempts", func(_ dialect, r *record.Record) any { return r.Requests }, func(r *record.Record) any { return &r.Requests }},
	{"provider_status", func(_ dialect, r *record.Record) any { return r.ProviderStatus }, func(r *record.Record) any { return &r.ProviderStatus }},
	{"reply", func(_ dialect, r *record.Record) any { return r.Reply }, func(r *record.Record) any { return &r.Reply }},
	{"last_error", func(_ dialect, r *record.Record) any { return r.LastError }, func(r *record.Record) any { return &r.LastError }},
	{"code", func(_ dialect, r *record.Record) any { return r.Code }, func(r *record.Record) any { return &r.Code }},
	{"request_id", func(_ dialect, r *record.Record) any { return r.RequestID }, func(r *record.Record) any { return &r.RequestID }},
	{"trace_id", func(_ dialect, r *record.Record) any { return r.TraceID }, func(r *record.Record) any { return &r.TraceID }},
	{"caller", func(_ dialect, r *record.Record) any { return r.Caller }, func(r *record.Record) any { return &r.Caller }},
	{"created_at", func(d dialect, r *record.Record) any { return d.t(r.CreatedAt) }, func(r *record.Record) any { return timeCol{&r.CreatedAt} }},
	{"updated_at", func(d dialect, r *record.Record) any { return d.t(r.UpdatedAt) }, func(r *record.Record) any { return timeCol{&r.UpdatedAt} }},
	{"settle_by", func(d dialect, r *record.Record) any { return d.t(r.SettleBy) }, func(r *record.Record) any { return timeCol{&r.SettleBy} }},
	{"next_settle_at", func(d dialect, r *record.Record) any { return d.t(r.NextSettleAt) }, func(r *record.Record) any { return timeCol{&r.NextSettleAt} }},
	{"settle_attempts", func(_ dialect, r *record.Record) any { return r.SettleAttempts }, func(r *record.Record) any { return &r.SettleAttempts }},
	{"lease_owner", func(_ dialect, r *record.Record) any { return r.LeaseOwner }, func(r *record.Record) any { return &r.LeaseOwner }},
	{"lease_expires_at", func(d dialect, r *record.Record) any { return d.t(r.LeaseExpiresAt) }, func(r *record.Record) any { return timeCol{&r.LeaseExpiresAt} }},
	{"gave_up", func(_ dialect, r *record.Record) any { return r.GaveUp }, func(r *record.Record) any { return &r.GaveUp }},
	{"quiet_until", func(d dialect, r *record.Record) any { return d.t(r.QuietUntil) }, func(r *record.Record) any { return timeCol{&r.QuietUntil} }},
	{"attempt_started_at", func(d dialect, r *record.Record) any { return d.t(r.AttemptStartedAt) }, func(r *record.Record) any { return timeCol{&r.AttemptStartedAt} }},
	{"prior_state", func(_ dialect, r *record.Record) any { return int(r.PriorState) }, func(r *record.Record) any { return byteCol[record.State]{&r.PriorState} }},
	{"tombstoned_at", func(d dialect, r *record.Record) any { return d.nt(r.TombstonedAt) }, func(r *record.Record) any { return timeCol{&r.TombstonedAt} }},
	{"resolved_at", func(d dialect, r *record.Record) any { return d.nt(r.ResolvedAt) }, func(r *record.Record) any { return timeCol{&r.ResolvedAt} }},
	{"attempt_seq", func(_ dialect, r *record.Record) any { return r.AttemptSeq }, func(r *record.Record) any { return &r.AttemptSeq }},
	{"attempt_kind", func(_ dialect, r *record.Record) any { return int(r.AttemptKind) }, func(r *record.Record) any { return byteCol[record.Kind]{&r.AttemptKind} }},
	{"attempt_request_id", func(_ dialect, r *record.Record) any { return r.AttemptRequestID }, func(r *record.Record) any { return &r.AttemptRequestID }},
}

// recordColumns are recordCols' names, as a select list.
var recordColumns = func() string {
	names := make([]string, len(recordCols))
	for i, c := range recordCols {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}()

// colsByName finds recordCols by name.
var colsByName = func() map[string]column {
	m := make(map[string]column, len(recordCols))
	for _, c := range recordCols {
		m[c.name] = c
	}
	return m
}()

// The columns each kind of change sets (record.Step changes no other; see
// TestWritesCoverStep). A new record's are insertCols.
var (
	insertCols = []string{"key", "body", "body_sha256", "currency", "amount", "state", "request_id", "trace_id", "caller",
		"created_at", "updated_at", "settle_by", "next_settle_at", "lease_owner", "lease_expires_at", "quiet_until",
		"attempt_started_at", "attempt_seq", "attempt_kind", "attempt_request_id"}
	acquireCols = []string{"state", "prior_state", "lease_owner", "lease_expires_at", "quiet_until", "attempt_seq",
		"attempt_kind", "attempt_request_id", "attempt_started_at", "updated_at", "settle_by", "gave_up"}
	abandonCols = []string{"state", "lease_owner", "lease_expires_at", "next_settle_at", "updated_at", "gave_up"}
	giveUpCols  = []string{"gave_up", "updated_at"}
	finishCols  = []string{"state", "attempts", "provider_status", "reply", "last_error", "code", "updated_at",
		"next_settle_at", "settle_attempts", "lease_owner", "lease_expires_at", "quiet_until", "attempt_seq"}
	lateCols = []string{"state", "attempts", "provider_status", "reply", "last_error", "code", "updated_at",
		"next_settle_at", "lease_owner", "lease_expires_at"}
	resolveCols = []string{"state", "updated_at", "resolved_at", "gave_up", "lease_owner", "lease_expires_at",
		"quiet_until", "next_settle_at", "reply", "provider_status", "last_error", "code"}
)

// writeCols are the columns each record.Write sets.
var writeCols = map[record.Write][]string{
	record.WriteInsert:   insertCols,
	record.WriteAcquire:  acquireCols,
	record.WriteTakeOver: acquireCols,
	record.WriteAbandon:  abandonCols,
	record.WriteGiveUp:   giveUpCols,
	record.WriteFinish:   finishCols,
	record.WriteLate:     lateCols,
	record.WriteResolve:  resolveCols,
}

const (
	// inProgress is record.InProgress in SQL.
	inProgress = "1"
	// attemptColumns are the attempts columns scanAttempt reads.
	attemptColumns = `attempt, kind, owner, replica, request_id, started_at, ended_at,
	provider_status, http_requests, reply, state, code, error, abandoned`
	// guardArgs is how many arguments a guarded UPDATE's WHERE takes
	// ($1 to $5, see guarded); its SET takes the next.
	guardArgs = 5
)

// statements are the store's queries in its dialect, each named for what
// it does.
type statements struct {
	// insert writes a new record (WriteInsert), unless the key has one
	// or a tombstone.
	insert string
	// acquire (WriteAcquire, and WriteTakeOver's record), abandon,
	// giveUp, late and resolve write a record read and locked in the
	// same transaction, guarded by what was read.
	acquire, abandon, giveUp, late, resolve string
	// finish writes the holder's outcome (WriteFinish), guarded by its
	// lease, with its attempt's journal row, in one statement.
	finish string
	// journal writes an attempt's row; rewrite gives an abandoned row
	// the answer a late 2xx brought (WriteLate); ownRow reads an owner's
	// latest row.
	journal, rewrite, ownRow string
	// locked reads and locks a key's record; get reads it with the
	// store's clock; held reads and locks the records one owner holds.
	locked, get, held string
	// dueUnknown and dueLeases read and lock a page of SettleDue's
	// candidates.
	dueUnknown, dueLeases string
	// audit appends an audit entry.
	audit string
}

func (s *Store) buildStatements() statements {
	d := s.d
	return statements{
		insert:  s.insertQuery(),
		acquire: guarded(d, acquireCols),
		abandon: guarded(d, abandonCols),
		giveUp:  guarded(d, giveUpCols),
		late:    guarded(d, lateCols),
		resolve: guarded(d, resolveCols),
		finish:  finishQuery(d),
		journal: d.q(`INSERT INTO attempts (` + d.keyCol + `, ` + attemptColumns + `)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`),
		rewrite: d.q(`UPDATE attempts SET provider_status = $2, http_requests = $3, reply = $4, state = $5, code = $6,
			error = $7, abandoned = $8 WHERE id = $1 AND abandoned = $9`),
		ownRow: d.q(`SELECT id, ` + attemptColumns + ` FROM attempts WHERE ` + d.keyCol + ` = $1 AND owner = $2
			ORDER BY id DESC LIMIT 1`),
		locked: d.q(`SELECT ` + recordColumns + ` FROM records WHERE ` + d.keyCol + ` = $1 ` + d.lockRows),
		get:    d.q(`SELECT ` + recordColumns + `, ` + s.readClock() + ` FROM records WHERE ` + d.keyCol + ` = $1 AND tombstoned_at IS NULL`),
		held: d.q(`SELECT ` + recordColumns + ` FROM records WHERE state = ` + inProgress + ` AND lease_owner = $1
			ORDER BY ` + d.keyCol + ` ` + d.lockRows),
		// Candidates are narrowed by index and time alone: Step decides.
		// Each is read a page at a time in a fixed order, after a
		// position ($2, $3), so that candidates Step leaves (quiet, a
		// lease of this process, a key its outbox holds) don't keep
		// others from being read; SKIP LOCKED leaves another replica's
		// to it. records_due holds exactly the unknown records not given
		// up.
		dueUnknown: d.q(`SELECT ` + recordColumns + ` FROM records` + d.dueIndex + `
			WHERE state = 4 AND gave_up = ` + d.no + ` AND (next_settle_at <= $1 OR settle_by <= $1)
			AND (next_settle_at, ` + d.keyCol + `) > ($2, $3) AND tombstoned_at IS NULL
			ORDER BY next_settle_at, ` + d.keyCol + ` LIMIT $4 ` + d.skipLocked),
		dueLeases: d.q(`SELECT ` + recordColumns + ` FROM records
			WHERE state = ` + inProgress + ` AND lease_expires_at <= $1
			AND (lease_expires_at, ` + d.keyCol + `) > ($2, $3) AND tombstoned_at IS NULL
			ORDER BY lease_expires_at, ` + d.keyCol + ` LIMIT $4 ` + d.skipLocked),
		audit: d.q(`INSERT INTO audit_entries (key_sha256, record_created_at, created_at, actor, from_state, to_state,
			outcome, evidence, request_id, reply_recorded, gave_up, caller_request_id)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`),
	}
}

// writerQueries are the named statements the writer runs, prepared at
// Open.
func (s *Store) writerQueries() []string {
	st := s.stmts
	return []string{st.insert, st.acquire, st.abandon, st.giveUp, st.late, st.resolve, st.finish, st.journal, st.rewrite,
		st.ownRow, st.locked, st.held, st.dueUnknown, st.dueLeases, st.audit}
}

// insertQuery inserts a new record, unless the key has one or a
// tombstone: it changes one row or none.
func (s *Store) insertQuery() string {
	d := s.d
	names, marks := setList(insertCols, 1, false)
	n := len(insertCols)
	tomb := "$" + strconv.Itoa(n+1)
	if d.keyCol != "key" {
		// key_hash is the key's SHA-256, as the tombstone's is.
		names += ", " + d.keyCol
		marks += ", " + tomb
	}
	return d.q(`INSERT INTO records (` + names + `)
		SELECT ` + marks + `
		WHERE NOT EXISTS (SELECT 1 FROM tombstones WHERE key_sha256 = ` + tomb + `)
		ON CONFLICT (` + d.keyCol + `) DO NOTHING`)
}

// insertArgs are insertQuery's arguments for n, a new record.
func (s *Store) insertArgs(n *record.Record) []any {
	args := colArgs(s.d, insertCols, n, nil)
	sum := keySHA256(n.Key)
	return append(args, sum[:])
}

// guarded is an UPDATE of cols on a record that changes it only while
// it is as it was read: its key, state, holder, attempt and last change
// are $1 to $5 (guardArgs), and cols' values follow.
func guarded(d dialect, cols []string) string {
	set, _ := setList(cols, guardArgs+1, true)
	return d.q(`UPDATE records SET ` + set + ` WHERE ` + d.keyCol + ` = $1 AND state = $2 AND lease_owner = $3
		AND attempt_seq = $4 AND updated_at = $5`)
}

// guardedArgs are a guarded statement's arguments: the guard from was
// (the record as read), then cols' values from n.
func guardedArgs(d dialect, cols []string, was, n *record.Record) []any {
	args := make([]any, 0, guardArgs+len(cols))
	args = append(args, d.k(was.Key), int(was.State), was.LeaseOwner, was.AttemptSeq, d.t(was.UpdatedAt))
	return colArgs(d, cols, n, args)
}

// finishQuery records the holder's outcome: the record as Step wrote it
// ($3 onwards) while owner $2 still holds it, and the journal row of the
// attempt it ends, unless the outcome sent nothing. It changes one record
// or none, and reads back how many.
//
// Both writes are one statement, so that a payment's finish is one round
// trip and one statement, as the record floor's is. On SQLite the row is
// written by the trigger attempts_journal (migration 7) when the
// statement counts an outcome (outcomes), from the record before and
// after: SQLite has no data-modifying CTE. On PostgreSQL a CTE writes it
// from Step's Effect.Ended, passed as arguments: the row is exactly what
// Step said, no trigger runs on anyone else's writes (an older paymentsd
// during a rollout writes its own rows), and the INSERT sees only the row
// the guarded UPDATE changed.
func finishQuery(d dialect) string {
	set, _ := setList(finishCols, 3, true)
	where := ` WHERE ` + d.keyCol + ` = $1 AND lease_owner = $2 AND state = ` + inProgress
	if d.name == "sqlite" {
		n := 3 + len(finishCols)
		return d.q(`UPDATE records SET ` + set + `, outcomes = outcomes + $` + strconv.Itoa(n) + where)
	}
	n := 3 + len(finishCols)
	marks := make([]string, 12)
	for i := range marks {
		marks[i] = "$" + strconv.Itoa(n+i)
	}
	return d.q(`WITH fin AS (UPDATE records SET ` + set + where + ` RETURNING ` + d.keyCol + `),
		journal AS (INSERT INTO attempts (` + d.keyCol + `, attempt, kind, owner, replica, request_id, started_at, ended_at,
			provider_status, http_requests, reply, state, code, error, abandoned)
			SELECT ` + d.keyCol + `, ` + marks[0] + `, ` + marks[1] + `, $2, ` + strings.Join(marks[2:], ", ") + `, false
			FROM fin WHERE $` + strconv.Itoa(n+12) + `)
		SELECT count(*) FROM fin`)
}

// finishArgs are finishQuery's arguments: n is the record after the
// outcome of owner, and ended the journal row (nil: none).
func finishArgs(d dialect, owner string, n *record.Record, ended *record.Attempt) []any {
	args := colArgs(d, finishCols, n, []any{d.k(n.Key), owner})
	if d.name == "sqlite" {
		journal := 0
		if ended != nil {
			journal = 1
		}
		return append(args, journal)
	}
	a := ended
	if a == nil {
		a = &record.Attempt{}
	}
	return append(args, a.Number, int(a.Kind), record.Process(owner), a.RequestID, d.t(a.StartedAt), d.t(a.EndedAt),
		a.ProviderStatus, a.HTTPRequests, a.Reply, int(a.State), a.Code, a.Error, ended != nil)
}

// journalArgs are the journal statement's arguments for key's attempt a.
func journalArgs(d dialect, key string, a *record.Attempt) []any {
	return []any{d.k(key), a.Number, int(a.Kind), a.Owner, a.Replica(), a.RequestID, d.t(a.StartedAt), d.t(a.EndedAt),
		a.ProviderStatus, a.HTTPRequests, a.Reply, int(a.State), a.Code, a.Error, a.Abandoned}
}

// setList is cols as "c = $from, …" (set) or as names and "$from, …".
func setList(cols []string, from int, set bool) (string, string) {
	var a, b strings.Builder
	for i, c := range cols {
		if i > 0 {
			a.WriteString(", ")
			b.WriteString(", ")
		}
		mark := "$" + strconv.Itoa(from+i)
		if set {
			a.WriteString(c + " = " + mark)
			continue
		}
		a.WriteString(c)
		b.WriteString(mark)
	}
	return a.String(), b.String()
}

// colArgs appends the values of cols in r to args.
func colArgs(d dialect, cols []string, r *record.Record, args []any) []any {
	for _, c := range cols {
		args = append(args, colsByName[c].val(d, r))
	}
	return args
}

// nt is t as a nullable time column holds it: NULL for the zero time.
func (d dialect) nt(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return d.t(t)
}
