-- Listing records, and resolving payments in doubt.
--
-- records_list_state and records_list_caller answer ListRecords: one range
-- scan per (state, gave_up) pair asked for, of the index alone (it holds
-- every column the scan reads; tombstoned_at trails so that tombstoned
-- records are skipped without reading the table), already in page order
-- (created_at, then key_hash), optionally within one caller's records.
CREATE INDEX records_list_state ON records (state, gave_up, created_at, key_hash, tombstoned_at);
CREATE INDEX records_list_caller ON records (caller, state, gave_up, created_at, key_hash, tombstoned_at);

-- resolved_at is when a person last resolved the record (NULL: never).
ALTER TABLE records ADD COLUMN resolved_at timestamptz;

-- audit_entries is append-only: each row is a person's change to a record,
-- written in the transaction that made it. Rows are never updated or
-- deleted (the trigger refuses it), and outlive the record: they name it by
-- the SHA-256 of its key and its created_at, so a key used again after
-- retention starts with no history.
CREATE TABLE audit_entries (
	id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	key_sha256        bytea NOT NULL,
	record_created_at timestamptz NOT NULL,
	created_at        timestamptz NOT NULL,
	actor             text NOT NULL,
	from_state        integer NOT NULL,
	to_state          integer NOT NULL,
	outcome           integer NOT NULL,
	evidence          text NOT NULL,
	request_id        text NOT NULL,
	reply_recorded    boolean NOT NULL,
	gave_up           boolean NOT NULL
);
CREATE INDEX audit_entries_key ON audit_entries (key_sha256, record_created_at, id);

CREATE FUNCTION audit_entries_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'audit entries are append-only';
END;
$$;
CREATE TRIGGER audit_entries_append_only BEFORE UPDATE OR DELETE ON audit_entries
	FOR EACH ROW EXECUTE FUNCTION audit_entries_append_only();
CREATE TRIGGER audit_entries_no_truncate BEFORE TRUNCATE ON audit_entries
	FOR EACH STATEMENT EXECUTE FUNCTION audit_entries_append_only();

-- A tombstone keeps the caller of its record, so that with caller
-- identities on, another caller's expired key tells nothing of it. NULL for
-- tombstones written before this migration: caller unknown.
ALTER TABLE tombstones ADD COLUMN caller TEXT;
