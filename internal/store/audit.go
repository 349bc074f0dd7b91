package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"example.com/paymentsd/internal/record"
)

// AuditEntry is one change a person made to a record.
type AuditEntry struct {
	CreatedAt time.Time
	Actor     string
	From, To  record.State
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

// AuditEntries returns the audit entries of r (a record as Get returned
// it), oldest first. Entries of an earlier record with the same key (one
// retention deleted) are not r's.
func (s *Store) AuditEntries(ctx context.Context, r record.Record) ([]AuditEntry, error) {
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
		if err := rows.Scan(timeCol{&e.CreatedAt}, &e.Actor, byteCol[record.State]{&e.From}, byteCol[record.State]{&e.To},
			&e.Evidence, &e.RequestID, &e.ReplyRecorded, &e.GaveUp, &e.CallerRequestID); err != nil {
			return nil, s.wrap(fmt.Errorf("audit entries %.64q: %w", r.Key, err))
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap(fmt.Errorf("audit entries %.64q: %w", r.Key, err))
	}
	return out, nil
}

// appendAudit appends e, an entry about r (as it was before it), in tx.
func (s *Store) appendAudit(ctx context.Context, tx *sql.Tx, r *record.Record, e AuditEntry) error {
	sum := keySHA256(r.Key)
	d := s.d
	st, err := s.txStmt(ctx, tx, s.stmts.audit)
	if err != nil {
		return err
	}
	if _, err := st.ExecContext(ctx, sum[:], d.t(r.CreatedAt), d.t(e.CreatedAt), e.Actor, int(e.From), int(e.To),
		int(e.To), e.Evidence, e.RequestID, e.ReplyRecorded, e.GaveUp, e.CallerRequestID); err != nil {
		return fmt.Errorf("append audit entry: %w", err)
	}
	return nil
}
