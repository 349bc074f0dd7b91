-- Provider quiet periods, one clock for leases, and tombstones.
--
-- quiet_until: until when the key's last request may still be at the
-- provider (it ended without the provider's answer, or its holder died);
-- nothing is sent with the key before then. attempt_started_at: when the
-- last attempt began. prior_state: the state an acquisition took the record
-- over from (0 for a new record). tombstoned_at: when retention wrote the
-- record's tombstone; the record itself is deleted a grace period later.
-- Times are microseconds since the epoch; the zero time.Time is
-- -62135596800000000, as the store writes it.
ALTER TABLE records ADD COLUMN quiet_until INTEGER NOT NULL DEFAULT -62135596800000000;
ALTER TABLE records ADD COLUMN attempt_started_at INTEGER NOT NULL DEFAULT -62135596800000000;
ALTER TABLE records ADD COLUMN prior_state INTEGER NOT NULL DEFAULT 0;
ALTER TABLE records ADD COLUMN tombstoned_at INTEGER;

CREATE INDEX records_tombstoned_at ON records (tombstoned_at) WHERE tombstoned_at IS NOT NULL;

-- A tombstone is what is kept of a record once retention deletes it: the
-- SHA-256 of its key and of its request body, its final state and its
-- dates. A key with a tombstone is never sent to the provider again.
CREATE TABLE tombstones (
	key_sha256  BLOB PRIMARY KEY,
	body_sha256 BLOB NOT NULL,
	state       INTEGER NOT NULL,
	gave_up     INTEGER NOT NULL,
	created_at  INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL,
	expired_at  INTEGER NOT NULL
) WITHOUT ROWID;

CREATE INDEX tombstones_expired_at ON tombstones (expired_at);
