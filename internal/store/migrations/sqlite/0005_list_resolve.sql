-- Listing records, and resolving payments in doubt.
--
-- records_list_state and records_list_caller answer ListRecords: one range
-- scan per (state, gave_up) pair asked for, of the index alone (it holds
-- every column the scan reads; tombstoned_at trails so that tombstoned
-- records are skipped without reading the table), already in page order
-- (created_at, then key), optionally within one caller's records.
CREATE INDEX records_list_state ON records (state, gave_up, created_at, key, tombstoned_at);
CREATE INDEX records_list_caller ON records (caller, state, gave_up, created_at, key, tombstoned_at);

-- resolved_at is when a person last resolved the record (NULL: never).
ALTER TABLE records ADD COLUMN resolved_at INTEGER;

-- audit_entries is append-only: each row is a person's change to a record,
-- written in the transaction that made it. Rows are never updated or
-- deleted (the triggers refuse it), and outlive the record: they name it by
-- the SHA-256 of its key and its created_at, so a key used again after
-- retention starts with no history.
CREATE TABLE audit_entries (
	id                INTEGER PRIMARY KEY AUTOINCREMENT,
	key_sha256        BLOB NOT NULL,
	record_created_at INTEGER NOT NULL,
	created_at        INTEGER NOT NULL,
	actor             TEXT NOT NULL,
	from_state        INTEGER NOT NULL,
	to_state          INTEGER NOT NULL,
	outcome           INTEGER NOT NULL,
	evidence          TEXT NOT NULL,
	request_id        TEXT NOT NULL,
	reply_recorded    INTEGER NOT NULL,
	gave_up           INTEGER NOT NULL
);
CREATE INDEX audit_entries_key ON audit_entries (key_sha256, record_created_at, id);

CREATE TRIGGER audit_entries_no_update BEFORE UPDATE ON audit_entries BEGIN
	SELECT RAISE(ABORT, 'audit entries are append-only');
END;
CREATE TRIGGER audit_entries_no_delete BEFORE DELETE ON audit_entries BEGIN
	SELECT RAISE(ABORT, 'audit entries are append-only');
END;

-- A tombstone keeps the caller of its record, so that with caller
-- identities on, another caller's expired key tells nothing of it. NULL for
-- tombstones written before this migration: caller unknown.
ALTER TABLE tombstones ADD COLUMN caller TEXT;
