-- Times are INTEGER microseconds since the Unix epoch, UTC. Keys are TEXT
-- with SQLite's default BINARY collation: stored and compared byte for byte.

CREATE TABLE meta (
	name  TEXT PRIMARY KEY,
	value TEXT NOT NULL
);

CREATE TABLE records (
	key              TEXT PRIMARY KEY,
	body             BLOB,
	body_sha256      BLOB NOT NULL,
	currency         TEXT NOT NULL,
	amount           INTEGER NOT NULL,
	state            INTEGER NOT NULL,
	attempts         INTEGER NOT NULL DEFAULT 0,
	provider_status  INTEGER NOT NULL DEFAULT 0,
	reply            BLOB,
	last_error       TEXT NOT NULL DEFAULT '',
	code             INTEGER NOT NULL DEFAULT 0,
	request_id       TEXT NOT NULL,
	trace_id         TEXT NOT NULL,
	caller           TEXT NOT NULL,
	created_at       INTEGER NOT NULL,
	updated_at       INTEGER NOT NULL,
	settle_by        INTEGER NOT NULL,
	next_settle_at   INTEGER NOT NULL,
	settle_attempts  INTEGER NOT NULL DEFAULT 0,
	lease_owner      TEXT NOT NULL DEFAULT '',
	lease_expires_at INTEGER NOT NULL,
	gave_up          INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

CREATE INDEX records_state ON records (state, next_settle_at);
CREATE INDEX records_updated_at ON records (updated_at);

-- event_counter's single row hands out sequences inside the appending
-- transaction, so sequences commit in order.
CREATE TABLE event_counter (
	id   INTEGER PRIMARY KEY CHECK (id = 1),
	last INTEGER NOT NULL
);
INSERT INTO event_counter (id, last) VALUES (1, 0);

CREATE TABLE events (
	seq          INTEGER PRIMARY KEY,
	received_at  INTEGER NOT NULL,
	content_type TEXT NOT NULL,
	headers      TEXT NOT NULL,
	body         BLOB,
	body_sha256  BLOB NOT NULL,
	duplicate_of INTEGER NOT NULL DEFAULT 0
);

CREATE INDEX events_body_sha256 ON events (body_sha256, seq);
CREATE INDEX events_received_at ON events (received_at);
