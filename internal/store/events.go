package store

import (
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Header is one HTTP header field of a webhook delivery. Value holds the
// bytes as received, which need not be UTF-8.
type Header struct {
	Name, Value string
}

// Event is one webhook delivery in the inbox.
type Event struct {
	// Sequence is assigned by AppendEvent. Sequences commit in order: a
	// reader that has seen sequence n will never later find an event < n
	// appear.
	Sequence   int64
	ReceivedAt time.Time
	// ContentType is the Content-Type header's bytes as received, or "".
	ContentType string
	Headers     []Header
	Body        []byte
	BodySHA256  [32]byte
	// DuplicateOf is the lowest sequence of a stored event with the same
	// BodySHA256, or 0. Assigned by AppendEvent.
	DuplicateOf int64
	// Size is the bytes the event takes in the inbox: its body, content
	// type and headers. A page's byte budget and the inbox quota count it.
	// Assigned by AppendEvent.
	Size int64
	// BodyOmitted: ListEvents left Body out, because the event's Size was
	// over EventQuery.OmitBodyOver.
	BodyOmitted bool
}

// AppendEvent stores e durably, assigning its Sequence, DuplicateOf and
// Size, and returns it once committed. It refuses, writing nothing, with
// ErrInboxFull when e would take the inbox past Options.InboxQuota or the
// SQLite volume's free space below Options.InboxReserve. Appends in one
// process take the writer one at a time.
func (s *Store) AppendEvent(ctx context.Context, e Event) (Event, error) {
	select {
	case s.appends <- struct{}{}:
		defer func() { <-s.appends }()
	case <-ctx.Done():
		return Event{}, fmt.Errorf("append event: %w", ctx.Err())
	}
	d := s.d
	headerBytes := encodeHeaderBytes(e.Headers)
	headers, err := encodeHeaders(e.Headers)
	if err != nil {
		return Event{}, fmt.Errorf("append event: %w", err)
	}
	e.Size = int64(len(e.Body) + len(e.ContentType) + len(headerBytes))
	if err := s.checkReserve(ctx, e.Size); err != nil {
		return Event{}, s.wrap(fmt.Errorf("append event: %w", err))
	}
	e.ReceivedAt = e.ReceivedAt.Truncate(time.Microsecond).UTC()
	err = s.transact(ctx, func(tx *sql.Tx, _ time.Time) error {
		// The counter row's lock is held until commit, so the next append
		// can't take a sequence until this one is visible, and the quota is
		// checked against every append before this one.
		if err := tx.QueryRowContext(ctx, `UPDATE event_counter SET last = last + 1 WHERE id = 1 RETURNING last`).Scan(&e.Sequence); err != nil {
			return fmt.Errorf("next sequence: %w", err)
		}
		if s.inboxQuota > 0 {
			var used int64
			if err := tx.QueryRowContext(ctx, `SELECT stored_bytes FROM event_usage WHERE id = 1`).Scan(&used); err != nil {
				return fmt.Errorf("inbox usage: %w", err)
			}
			if used+e.Size > s.inboxQuota {
				return fmt.Errorf("%d bytes stored and %d more would pass the quota of %d: %w", used, e.Size, s.inboxQuota, ErrInboxFull)
			}
		}
		var dup sql.NullInt64
		since := time.Time{}
		if s.retention > 0 {
			since = e.ReceivedAt.Add(-s.retention)
		}
		if err := tx.QueryRowContext(ctx, d.q(`SELECT MIN(seq) FROM events WHERE body_sha256 = $1 AND received_at >= $2`), e.BodySHA256[:], d.t(since)).Scan(&dup); err != nil {
			return fmt.Errorf("find duplicates: %w", err)
		}
		e.DuplicateOf = dup.Int64
		// The bytes columns are exact; content_type and headers keep a
		// copy that text (and readers of the old columns) can hold.
		_, err := tx.ExecContext(ctx, d.q(`
			INSERT INTO events (seq, received_at, content_type, headers, body, body_sha256, duplicate_of,
				content_type_bytes, header_bytes, size)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`),
			e.Sequence, d.t(e.ReceivedAt), text(e.ContentType), headers, e.Body, e.BodySHA256[:], e.DuplicateOf,
			[]byte(e.ContentType), headerBytes, e.Size)
		return err
	})
	if err != nil {
		return Event{}, s.wrap(fmt.Errorf("append event: %w", err))
	}
	return e, nil
}

// text is s as a PostgreSQL text column can hold it: valid UTF-8, without
// NUL, each run of invalid bytes and each NUL replaced with U+FFFD.
func text(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// encodeHeaders is the old headers column: a JSON list of [name, value]
// pairs, in which bytes that aren't UTF-8 become U+FFFD, as in any JSON.
// header_bytes is the exact form.
func encodeHeaders(hs []Header) (string, error) {
	pairs := make([][2]string, len(hs))
	for i, h := range hs {
		pairs[i] = [2]string{h.Name, h.Value}
	}
	b, err := json.Marshal(pairs)
	return string(b), err
}

func decodeHeaders(s string) ([]Header, error) {
	var pairs [][2]string
	if err := json.Unmarshal([]byte(s), &pairs); err != nil {
		return nil, fmt.Errorf("decode headers: %w", err)
	}
	if len(pairs) == 0 {
		return nil, nil
	}
	hs := make([]Header, len(pairs))
	for i, p := range pairs {
		hs[i] = Header{Name: p[0], Value: p[1]}
	}
	return hs, nil
}

// headerFormat is header_bytes' first byte: after it come the headers in
// order, each as its name and then its value, each of those a uvarint
// length and that many bytes.
const headerFormat = 1

func encodeHeaderBytes(hs []Header) []byte {
	n := 1
	for _, h := range hs {
		n += 2*binary.MaxVarintLen32 + len(h.Name) + len(h.Value)
	}
	b := make([]byte, 0, n)
	b = append(b, headerFormat)
	for _, h := range hs {
		b = binary.AppendUvarint(b, uint64(len(h.Name)))
		b = append(b, h.Name...)
		b = binary.AppendUvarint(b, uint64(len(h.Value)))
		b = append(b, h.Value...)
	}
	return b
}

var errHeaderBytes = errors.New("decode header bytes: malformed")

func decodeHeaderBytes(b []byte) ([]Header, error) {
	if len(b) == 0 || b[0] != headerFormat {
		return nil, errHeaderBytes
	}
	b = b[1:]
	next := func() (string, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return "", false
		}
		s := string(b[k : k+int(n)])
		b = b[k+int(n):]
		return s, true
	}
	var hs []Header
	for len(b) > 0 {
		name, ok := next()
		value, ok2 := next()
		if !ok || !ok2 {
			return nil, errHeaderBytes
		}
		hs = append(hs, Header{Name: name, Value: value})
	}
	return hs, nil
}

// EventQuery says which events ListEvents returns.
type EventQuery struct {
	// After: events with a greater sequence, in order.
	After int64
	// Limit is the most events.
	Limit int
	// MaxBytes, if set, bounds the events' Size in all: the events stop
	// before the one that would pass it. The first is returned whatever
	// its size, so a reader always moves on.
	MaxBytes int64
	// OmitBodyOver, if set: an event whose Size is over it is returned
	// without its body (BodyOmitted), which is never read.
	OmitBodyOver int64
}

// omittedCost is what an event returned without its body counts against
// EventQuery.MaxBytes: at most its headers.
const omittedCost = 64 << 10

// ListEvents returns the events q asks for. Their sizes are read first, and
// then only the bodies that fit, so a reader never holds more than
// q.MaxBytes of bodies (or the first event's).
func (s *Store) ListEvents(ctx context.Context, q EventQuery) ([]Event, error) {
	if q.Limit <= 0 {
		return nil, nil
	}
	out, err := s.listEvents(ctx, q)
	if err != nil {
		return nil, s.wrap(fmt.Errorf("list events after %d: %w", q.After, err))
	}
	return out, nil
}

func (s *Store) listEvents(ctx context.Context, q EventQuery) ([]Event, error) {
	omitOver := q.OmitBodyOver
	if omitOver <= 0 {
		omitOver = math.MaxInt64
	}
	through, err := s.eventsThrough(ctx, q, omitOver)
	if err != nil || through == 0 {
		return nil, err
	}
	// Sequences commit in order, so no event up to through can appear now
	// that the first query missed; one deleted since (retention) is gone.
	rows, err := s.r.QueryContext(ctx, s.d.q(`
		SELECT seq, received_at, content_type, headers, content_type_bytes, header_bytes,
			CASE WHEN size > $3 THEN NULL ELSE body END, size > $3, body_sha256, duplicate_of, size
		FROM events WHERE seq > $1 AND seq <= $2 ORDER BY seq`), q.After, through, omitOver)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var e Event
		var headers string
		var contentType, headerBytes []byte
		if err := rows.Scan(&e.Sequence, timeCol{&e.ReceivedAt}, &e.ContentType, &headers, &contentType, &headerBytes,
			&e.Body, &e.BodyOmitted, shaCol{&e.BodySHA256}, &e.DuplicateOf, &e.Size); err != nil {
			return nil, err
		}
		// Rows from before migration 4 have only the text columns.
		if contentType != nil {
			e.ContentType = string(contentType)
		}
		if headerBytes != nil {
			e.Headers, err = decodeHeaderBytes(headerBytes)
		} else {
			e.Headers, err = decodeHeaders(headers)
		}
		if err != nil {
			return nil, fmt.Errorf("event %d: %w", e.Sequence, err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// eventsThrough returns the sequence of the last event q takes, by size
// alone, or 0 if there is none.
func (s *Store) eventsThrough(ctx context.Context, q EventQuery, omitOver int64) (int64, error) {
	rows, err := s.r.QueryContext(ctx, s.d.q(`SELECT seq, size FROM events WHERE seq > $1 ORDER BY seq LIMIT $2`), q.After, q.Limit)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var through, total int64
	for rows.Next() {
		var seq, size int64
		if err := rows.Scan(&seq, &size); err != nil {
			return 0, err
		}
		cost := size
		if size > omitOver {
			cost = omittedCost
		}
		if through != 0 && q.MaxBytes > 0 && total+cost > q.MaxBytes {
			break
		}
		total += cost
		through = seq
	}
	return through, rows.Err()
}

// LastSequence returns the highest committed event sequence, or 0.
func (s *Store) LastSequence(ctx context.Context) (int64, error) {
	// The counter, not MAX(seq): it keeps counting when old events are
	// deleted.
	var n int64
	if err := s.r.QueryRowContext(ctx, `SELECT last FROM event_counter WHERE id = 1`).Scan(&n); err != nil {
		return 0, s.wrap(fmt.Errorf("last event sequence: %w", err))
	}
	return n, nil
}

// InboxUsage is how full the webhook inbox is.
type InboxUsage struct {
	// StoredBytes is the stored events' Size in all.
	StoredBytes int64
	// Quota is Options.InboxQuota; 0 means none.
	Quota int64
	// VolumeFree is the free space on the SQLite database's volume, its
	// free pages included, and Reserve what the inbox leaves of it; -1 and
	// 0 where it can't be seen (PostgreSQL, memory).
	VolumeFree, Reserve int64
}

// InboxUsage reports how full the webhook inbox is.
func (s *Store) InboxUsage(ctx context.Context) (InboxUsage, error) {
	u := InboxUsage{Quota: s.inboxQuota, VolumeFree: -1}
	if err := s.r.QueryRowContext(ctx, `SELECT stored_bytes FROM event_usage WHERE id = 1`).Scan(&u.StoredBytes); err != nil {
		return InboxUsage{}, s.wrap(fmt.Errorf("inbox usage: %w", err))
	}
	free, ok, err := s.volumeFree(ctx)
	if err != nil {
		return InboxUsage{}, s.wrap(fmt.Errorf("inbox usage: %w", err))
	}
	if ok {
		u.VolumeFree, u.Reserve = free, s.inboxReserve
	}
	return u, nil
}

// checkReserve refuses (ErrInboxFull) to let an event of size bytes take
// the SQLite volume's free space below the reserve kept for payments.
func (s *Store) checkReserve(ctx context.Context, size int64) error {
	free, ok, err := s.volumeFree(ctx)
	if err != nil || !ok {
		return err
	}
	if free-size < s.inboxReserve {
		return fmt.Errorf("%d bytes free on the database's volume, of which %d are kept for payments: %w", free, s.inboxReserve, ErrInboxFull)
	}
	return nil
}

// volumeFree returns the free space for the SQLite file: the volume's
// space available to paymentsd plus the database's free pages, which
// SQLite reuses (a file never shrinks when events are deleted, so the
// volume's alone would never recover). ok is false where there is no
// volume to see.
func (s *Store) volumeFree(ctx context.Context) (free int64, ok bool, err error) {
	if s.sqlitePath == "" {
		return 0, false, nil
	}
	avail, ok, err := diskAvailable(s.sqlitePath)
	if err != nil || !ok {
		return 0, ok, err
	}
	var pages, pageSize int64
	if err := s.r.QueryRowContext(ctx, `SELECT freelist_count, page_size FROM pragma_freelist_count(), pragma_page_size()`).Scan(&pages, &pageSize); err != nil {
		return 0, false, fmt.Errorf("free pages: %w", err)
	}
	return avail + pages*pageSize, true, nil
}

// InboxQuota is Options.InboxQuota: 0 means none.
func (s *Store) InboxQuota() int64 { return s.inboxQuota }
