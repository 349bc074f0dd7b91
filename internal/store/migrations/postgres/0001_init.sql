-- Keys are text COLLATE "C": compared byte for byte (PostgreSQL text can't
-- hold NUL; the store refuses such keys with ErrKeyNotStorable). Times are
-- timestamptz (microseconds).

CREATE TABLE meta (
	name  text PRIMARY KEY,
	value text NOT NULL
);

CREATE TABLE records (
	key              text COLLATE "C" PRIMARY KEY,
	body             bytea,
	body_sha256      bytea NOT NULL,
	currency         text NOT NULL,
	amount           bigint NOT NULL,
	state            integer NOT NULL,
	attempts         integer NOT NULL DEFAULT 0,
	provider_status  integer NOT NULL DEFAULT 0,
	reply            bytea,
	last_error       text NOT NULL DEFAULT '',
	code             integer NOT NULL DEFAULT 0,
	request_id       text NOT NULL,
	trace_id         text NOT NULL,
	caller           text NOT NULL,
	created_at       timestamptz NOT NULL,
	updated_at       timestamptz NOT NULL,
	settle_by        timestamptz NOT NULL,
	next_settle_at   timestamptz NOT NULL,
	settle_attempts  integer NOT NULL DEFAULT 0,
	lease_owner      text NOT NULL DEFAULT '',
	lease_expires_at timestamptz NOT NULL,
	gave_up          boolean NOT NULL DEFAULT false
);

CREATE INDEX records_state ON records (state, next_settle_at);
CREATE INDEX records_updated_at ON records (updated_at);

-- event_counter's single row hands out sequences inside the appending
-- transaction; its row lock makes appends commit in sequence order, so a
-- reader polling for sequence > n never misses a late commit.
CREATE TABLE event_counter (
	id   integer PRIMARY KEY CHECK (id = 1),
	last bigint NOT NULL
);
INSERT INTO event_counter (id, last) VALUES (1, 0);

CREATE TABLE events (
	seq          bigint PRIMARY KEY,
	received_at  timestamptz NOT NULL,
	content_type text NOT NULL,
	headers      text NOT NULL,
	body         bytea,
	body_sha256  bytea NOT NULL,
	duplicate_of bigint NOT NULL DEFAULT 0
);

CREATE INDEX events_body_sha256 ON events (body_sha256, seq);
CREATE INDEX events_received_at ON events (received_at);
