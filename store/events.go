package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// Header is one HTTP header field of a webhook delivery.
type Header struct {
	Name, Value string
}

// Event is one webhook delivery in the inbox.
type Event struct {
	// Sequence is assigned by AppendEvent. Sequences commit in order: a
	// reader that has seen sequence n will never later find an event < n
	// appear.
	Sequence    int64
	ReceivedAt  time.Time
	ContentType string
	Headers     []Header
	Body        []byte
	BodySHA256  [32]byte
	// DuplicateOf is the lowest sequence of a stored event with the same
	// BodySHA256, or 0. Assigned by AppendEvent.
	DuplicateOf int64
}

// AppendEvent stores e durably, assigning its Sequence and DuplicateOf,
// and returns it once committed.
func (s *Store) AppendEvent(ctx context.Context, e Event) (Event, error) {
	d := s.d
	headers, err := encodeHeaders(e.Headers)
	if err != nil {
		return Event{}, fmt.Errorf("append event: %w", err)
	}
	e.ReceivedAt = e.ReceivedAt.Truncate(time.Microsecond).UTC()
	err = s.transact(ctx, func(tx *sql.Tx) error {
		// The counter row's lock is held until commit, so the next append
		// can't take a sequence until this one is visible.
		if err := tx.QueryRowContext(ctx, `UPDATE event_counter SET last = last + 1 WHERE id = 1 RETURNING last`).Scan(&e.Sequence); err != nil {
			return fmt.Errorf("next sequence: %w", err)
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
		_, err := tx.ExecContext(ctx, d.q(`
			INSERT INTO events (seq, received_at, content_type, headers, body, body_sha256, duplicate_of)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`),
			e.Sequence, d.t(e.ReceivedAt), e.ContentType, headers, e.Body, e.BodySHA256[:], e.DuplicateOf)
		return err
	})
	if err != nil {
		return Event{}, s.wrap(fmt.Errorf("append event: %w", err))
	}
	return e, nil
}

// encodeHeaders stores headers in order as a JSON list of [name, value]
// pairs. (Bytes that aren't UTF-8 become U+FFFD, as in any JSON.)
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

// ListEvents returns up to limit events with Sequence > after, in order.
func (s *Store) ListEvents(ctx context.Context, after int64, limit int) ([]Event, error) {
	if limit <= 0 {
		return nil, nil
	}
	out, err := func() ([]Event, error) {
		rows, err := s.r.QueryContext(ctx, s.d.q(`
			SELECT seq, received_at, content_type, headers, body, body_sha256, duplicate_of
			FROM events WHERE seq > $1 ORDER BY seq LIMIT $2`), after, limit)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []Event
		for rows.Next() {
			var e Event
			var headers string
			if err := rows.Scan(&e.Sequence, timeCol{&e.ReceivedAt}, &e.ContentType, &headers, &e.Body,
				shaCol{&e.BodySHA256}, &e.DuplicateOf); err != nil {
				return nil, err
			}
			if e.Headers, err = decodeHeaders(headers); err != nil {
				return nil, err
			}
			out = append(out, e)
		}
		return out, rows.Err()
	}()
	if err != nil {
		return nil, s.wrap(fmt.Errorf("list events after %d: %w", after, err))
	}
	return out, nil
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
