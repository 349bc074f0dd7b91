package store

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"example.com/paymentsd/internal/record"
)

// ListQuery asks ListRecords for a page of records, in page order: by
// CreatedAt, then by a tie-break on the key (the key itself in SQLite, its
// SHA-256 in PostgreSQL). Every filter set must match.
type ListQuery struct {
	// States: only records in one of these; empty means every state.
	States []record.State
	// CreatedAfter (inclusive) and CreatedBefore (exclusive) bound
	// CreatedAt; zero leaves that side open.
	CreatedAfter, CreatedBefore time.Time
	// ByCaller: only records whose Caller is Caller.
	ByCaller bool
	Caller   string
	// GaveUp, if set: only records whose GaveUp is *GaveUp.
	GaveUp *bool
	// After, if set, starts the page after this position (a previous
	// page's Next).
	After *Cursor
	// Limit is the most records.
	Limit int
	// MaxBytes, if set, bounds the page's Size in all: the page stops
	// before the record that would pass it (but holds at least one).
	MaxBytes int64
	// WithReply reads each record's Reply (and counts it in Size); without
	// it Reply is nil.
	WithReply bool
	// WithAttempts reads each record's attempts into Page.Attempts (and,
	// with WithReply, counts them in Size).
	WithAttempts bool
}

// Cursor is a position in page order. Tie is opaque.
type Cursor struct {
	CreatedAt time.Time
	Tie       []byte
}

// Page is one page of ListRecords.
type Page struct {
	// Records are in page order. Their Body is never read.
	Records []record.Record
	// Next is the position after the last record, for the next page's
	// After; nil when the page is empty.
	Next *Cursor
	// More: at least one more record matched when the page was read.
	More bool
	// Attempts, with ListQuery.WithAttempts, holds each record's attempts
	// (as Attempts returns them) by key.
	Attempts map[string][]record.Attempt
}

// listOverhead is what ListRecords counts per record besides its key,
// caller, last error and reply: the summary's fixed fields and framing;
// attemptOverhead the same for each of its attempts, besides its owner,
// request ID, error and reply.
const (
	listOverhead    = 160
	attemptOverhead = 96
)

// ListRecords returns a page of the records q asks for (never tombstoned
// ones). It reads the page's positions from the indexes alone, then (with
// replies) the records' sizes, then only the records that fit, all in one
// read-only snapshot, so a page never holds more than q.MaxBytes (or its
// first record).
//
// Each (state, GaveUp) pair asked for is read as its own range scan of an
// index ordered like the page (records_list_state, or
// records_list_caller with ByCaller), and the scans are merged: a page
// reads at most Limit+1 index entries per pair, however many records there
// are.
func (s *Store) ListRecords(ctx context.Context, q ListQuery) (Page, error) {
	if q.Limit <= 0 {
		return Page{}, nil
	}
	p, err := s.listRecords(ctx, q)
	if err != nil {
		return Page{}, s.wrap(fmt.Errorf("list records: %w", err))
	}
	return p, nil
}

// listArgs numbers a query's arguments.
type listArgs []any

func (a *listArgs) add(v any) string {
	*a = append(*a, v)
	return "$" + strconv.Itoa(len(*a))
}

// bytesOf is the SQL for the length in bytes of a text or blob column.
func (d dialect) bytesOf(col string) string {
	if d.intTimes {
		return "COALESCE(length(CAST(" + col + " AS BLOB)), 0)"
	}
	return "COALESCE(octet_length(" + col + "), 0)"
}

// tie converts a Cursor's Tie for comparison with keyCol.
func (d dialect) tie(b []byte) any {
	if d.keyCol == "key" {
		return string(b)
	}
	return b
}

func (s *Store) listRecords(ctx context.Context, q ListQuery) (Page, error) {
	d := s.d
	var args listArgs
	var where []string
	if q.ByCaller {
		where = append(where, "caller = "+args.add(q.Caller))
	}
	// Past the first page the cursor is the lower bound: it is at or after
	// CreatedAfter, and a second lower bound on created_at makes SQLite
	// seek to CreatedAfter and scan every earlier page again, so each
	// page of a long time range took longer than the last.
	if !q.CreatedAfter.IsZero() && (q.After == nil || q.After.CreatedAt.Before(q.CreatedAfter)) {
		where = append(where, "created_at >= "+args.add(d.t(q.CreatedAfter)))
	}
	if !q.CreatedBefore.IsZero() {
		where = append(where, "created_at < "+args.add(d.t(q.CreatedBefore)))
	}
	if q.After != nil {
		where = append(where, "(created_at, "+d.keyCol+") > ("+args.add(d.t(q.After.CreatedAt))+", "+args.add(d.tie(q.After.Tie))+")")
	}
	where = append(where, "tombstoned_at IS NULL")
	limit := args.add(q.Limit + 1)

	states := q.States
	if len(states) == 0 {
		states = []record.State{record.InProgress, record.Succeeded, record.NotCreated, record.OutcomeUnknown}
	}
	gaveUps := []bool{false, true}
	if q.GaveUp != nil {
		gaveUps = []bool{*q.GaveUp}
	}
	var arms []string
	seen := map[record.State]bool{}
	for _, st := range states {
		if seen[st] {
			continue
		}
		seen[st] = true
		for _, g := range gaveUps {
			gv := "false"
			if g {
				gv = "true"
			}
			if d.intTimes {
				gv = map[bool]string{false: "0", true: "1"}[g]
			}
			// SQLite takes ORDER BY and LIMIT in a compound SELECT's
			// members only inside a subquery.
			arms = append(arms, `SELECT * FROM (SELECT created_at, `+d.keyCol+` AS tie FROM records
				WHERE state = `+strconv.Itoa(int(st))+` AND gave_up = `+gv+` AND `+strings.Join(where, " AND ")+`
				ORDER BY created_at, `+d.keyCol+` LIMIT `+limit+`) AS arm`+strconv.Itoa(len(arms)))
		}
	}
	positions := strings.Join(arms, "\nUNION ALL\n") + "\nORDER BY created_at, tie LIMIT " + limit

	size := d.bytesOf("key") + " + " + d.bytesOf("caller") + " + " + d.bytesOf("last_error") + " + " + d.bytesOf("reply")
	if q.WithAttempts {
		// An attempt in flight is counted too (it has no row yet).
		size += ` + (SELECT COALESCE(SUM(` + d.bytesOf("a.reply") + ` + 2 * ` + d.bytesOf("a.owner") + ` + ` + d.bytesOf("a.request_id") +
			` + ` + d.bytesOf("a.error") + ` + ` + strconv.Itoa(attemptOverhead) + `), 0) FROM attempts a WHERE a.` + d.keyCol + ` = records.` + d.keyCol + `)
			+ ` + strconv.Itoa(attemptOverhead) + ` + 2 * ` + d.bytesOf("lease_owner")
	}
	reply := "NULL"
	if q.WithReply {
		reply = "reply"
	}
	cols := strings.Replace(recordColumns, "key, body,", "key, NULL,", 1)
	cols = strings.Replace(cols, "reply,", reply+",", 1)

	var page Page
	err := s.readSnapshot(ctx, func(tx *sql.Tx) error {
		// The page's positions, from the indexes alone.
		rows, err := tx.QueryContext(ctx, d.q(positions), args...)
		if err != nil {
			return err
		}
		type pos struct {
			at  time.Time
			tie []byte
		}
		var ps []pos
		err = func() error {
			defer rows.Close()
			for rows.Next() {
				var p pos
				if err := rows.Scan(timeCol{&p.at}, &p.tie); err != nil {
					return err
				}
				ps = append(ps, p)
			}
			return rows.Err()
		}()
		if err != nil || len(ps) == 0 {
			return err
		}
		if len(ps) > q.Limit {
			page.More = true
			ps = ps[:q.Limit]
		}
		inList := func() (string, listArgs) {
			var in listArgs
			marks := make([]string, len(ps))
			for i, p := range ps {
				marks[i] = in.add(d.tie(p.tie))
			}
			return d.keyCol + ` IN (` + strings.Join(marks, ", ") + `)`, in
		}

		if q.WithReply {
			// Their sizes, to cut the page by bytes before reading a
			// reply.
			list, in := inList()
			sizes := make(map[string]int64, len(ps))
			rows, err = tx.QueryContext(ctx, d.q(`SELECT `+d.keyCol+`, `+size+` FROM records WHERE `+list), in...)
			if err != nil {
				return err
			}
			err = func() error {
				defer rows.Close()
				for rows.Next() {
					var tie []byte
					var n int64
					if err := rows.Scan(&tie, &n); err != nil {
						return err
					}
					sizes[string(tie)] = n
				}
				return rows.Err()
			}()
			if err != nil {
				return err
			}
			var total int64
			for i, p := range ps {
				cost := sizes[string(p.tie)] + listOverhead
				if i > 0 && q.MaxBytes > 0 && total+cost > q.MaxBytes {
					page.More = true
					ps = ps[:i]
					break
				}
				total += cost
			}
		}

		// The records, in page order. Without replies, a record's size is
		// what is read anyway (its key, caller and last error), so the
		// page is cut by bytes as they are read.
		list, in := inList()
		rows, err = tx.QueryContext(ctx, d.q(`SELECT `+cols+`, `+d.keyCol+` FROM records WHERE `+list+
			` ORDER BY created_at, `+d.keyCol), in...)
		if err != nil {
			return err
		}
		defer rows.Close()
		page.Records = make([]record.Record, 0, len(ps))
		var total int64
		for rows.Next() {
			var tie []byte
			r, err := scanRecord(rows, &tie)
			if err != nil {
				return err
			}
			if !q.WithReply {
				cost := int64(len(r.Key)+len(r.Caller)+len(r.LastError)) + listOverhead
				if len(page.Records) > 0 && q.MaxBytes > 0 && total+cost > q.MaxBytes {
					page.More = true
					break
				}
				total += cost
			}
			page.Records = append(page.Records, r)
			page.Next = &Cursor{CreatedAt: r.CreatedAt, Tie: tie}
		}
		if err := rows.Err(); err != nil || !q.WithAttempts || len(page.Records) == 0 {
			return err
		}
		rows.Close()
		page.Attempts, err = s.pageAttempts(ctx, tx, page.Records)
		return err
	})
	return page, err
}

// pageAttempts reads the attempts of a page's records, by key.
func (s *Store) pageAttempts(ctx context.Context, tx *sql.Tx, recs []record.Record) (map[string][]record.Attempt, error) {
	d := s.d
	var in listArgs
	marks := make([]string, len(recs))
	byCol := make(map[string]string, len(recs)) // keyCol's value → key
	for i, r := range recs {
		marks[i] = in.add(d.k(r.Key))
		byCol[keyColString(d.k(r.Key))] = r.Key
	}
	rows, err := tx.QueryContext(ctx, d.q(`SELECT `+d.keyCol+`, `+attemptColumns+` FROM attempts
		WHERE `+d.keyCol+` IN (`+strings.Join(marks, ", ")+`) ORDER BY id`), in...)
	if err != nil {
		return nil, fmt.Errorf("read attempts: %w", err)
	}
	defer rows.Close()
	out := make(map[string][]record.Attempt, len(recs))
	for rows.Next() {
		var col any
		a, err := scanAttempt(rows, &col)
		if err != nil {
			return nil, fmt.Errorf("read attempts: %w", err)
		}
		key := byCol[keyColString(col)]
		out[key] = append(out[key], a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read attempts: %w", err)
	}
	for _, r := range recs {
		if r.State == record.InProgress {
			out[r.Key] = append(out[r.Key], r.InFlight())
		}
	}
	return out, nil
}

// keyColString is a keyCol value (a key, or its hash) as a map key.
func keyColString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return fmt.Sprint(v)
}

// readSnapshot runs fn in a read-only transaction on the readers, whose
// queries all see one snapshot of the database (SQLite's WAL read
// transaction; PostgreSQL's REPEATABLE READ).
func (s *Store) readSnapshot(ctx context.Context, fn func(*sql.Tx) error) error {
	opts := &sql.TxOptions{ReadOnly: true}
	if !s.d.intTimes {
		opts.Isolation = sql.LevelRepeatableRead
	}
	if s.r == s.w && s.d.name == "sqlite" {
		// An in-memory SQLite database: one connection, which writes too.
		// (PostgreSQL's readers are its writer's pool as well, and take
		// the options.)
		opts = nil
	}
	tx, err := s.r.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("begin read: %w", err)
	}
	defer tx.Rollback()
	if s.pg != nil && !s.pg.direct.Load() {
		// Through a pooler, or before detectPooler found none: the
		// statement timeout is the transaction's to set, as the store's
		// own transactions set it (beginQuery), which a transaction with
		// options does not begin with.
		if _, err := tx.ExecContext(ctx, `SELECT set_config('statement_timeout', $1, true)`, strconv.FormatInt(statementTimeout.Milliseconds(), 10)); err != nil {
			return fmt.Errorf("begin read: %w", err)
		}
	}
	return fn(tx)
}
