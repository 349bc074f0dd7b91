-- Attempts: the record never forgets a request paymentsd sent, nor a 2xx.
--
-- The attempt being made now lives on the record itself: its number
-- (attempt_seq counts the attempts started), its kind (1: a call, 2:
-- settlement) and its call's request ID, beside lease_owner and
-- attempt_started_at. Its row in attempts is written when it ends, in the
-- transaction that records its outcome; or, if its holder never recorded
-- one, by whoever takes the record over or gives it up ("abandoned"). A
-- record in flight when this migration runs counts its attempt as number 1:
-- attempts before it were not kept one by one.
ALTER TABLE records ADD COLUMN attempt_seq integer NOT NULL DEFAULT 0;
ALTER TABLE records ADD COLUMN attempt_kind integer NOT NULL DEFAULT 0;
ALTER TABLE records ADD COLUMN attempt_request_id text NOT NULL DEFAULT '';
UPDATE records SET attempt_seq = 1 WHERE state = 1;

-- One row per ended attempt, deleted with its record. owner is the claim
-- that made it ("<replica>/<claim id>") and replica the process; reply is
-- the provider's body exactly (a 2xx body, or the error body), state the
-- outcome it recorded, http_requests the requests it sent (0 when nothing
-- was sent, or when nobody knows: abandoned).
CREATE TABLE attempts (
	id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	key_hash        bytea NOT NULL REFERENCES records (key_hash) ON DELETE CASCADE,
	attempt         integer NOT NULL,
	kind            integer NOT NULL,
	owner           text NOT NULL,
	replica         text NOT NULL,
	request_id      text NOT NULL,
	started_at      timestamptz NOT NULL,
	ended_at        timestamptz NOT NULL,
	provider_status integer NOT NULL,
	http_requests   integer NOT NULL,
	reply           bytea,
	state           integer NOT NULL,
	code            integer NOT NULL,
	error           text NOT NULL,
	abandoned       boolean NOT NULL
);
CREATE INDEX attempts_key ON attempts (key_hash, id);

-- The audit entry's request_id is paymentsd's own; the caller's
-- X-Request-Id, if it sent a valid one, is kept beside it.
ALTER TABLE audit_entries ADD COLUMN caller_request_id text NOT NULL DEFAULT '';
