-- The journal, written by the statement that ends an attempt; and an index
-- for settlement.
--
-- A payment's outcome is one statement (the store's finish): the UPDATE
-- that writes it on the record, guarded by its holder's lease, counts it in
-- outcomes (unless the holder sent nothing after all), and this trigger
-- writes the attempt's row from the record before and after: the attempt
-- the record held in flight, ended now by its holder with the provider's
-- answer. No other statement sets outcomes, so no other write fires it: not
-- the store's takeovers, give-ups and late 2xxs, which write their rows
-- themselves, nor an older paymentsd's finish during a rollout, which
-- writes its own.
ALTER TABLE records ADD COLUMN outcomes INTEGER NOT NULL DEFAULT 0;

CREATE TRIGGER attempts_journal AFTER UPDATE OF outcomes ON records
WHEN NEW.outcomes <> OLD.outcomes
BEGIN
	INSERT INTO attempts (key, attempt, kind, owner, replica, request_id, started_at, ended_at,
		provider_status, http_requests, reply, state, code, error, abandoned)
	VALUES (NEW.key, OLD.attempt_seq, OLD.attempt_kind, OLD.lease_owner,
		CASE WHEN instr(OLD.lease_owner, '/') > 0 THEN substr(OLD.lease_owner, 1, instr(OLD.lease_owner, '/') - 1) ELSE '' END,
		OLD.attempt_request_id, OLD.attempt_started_at, NEW.updated_at,
		NEW.provider_status, NEW.attempts - OLD.attempts, NEW.reply, NEW.state, NEW.code, NEW.last_error, 0);
END;

-- records_due is settlement's work: the unknown records it has not given up
-- on, in the order it reads them (next settlement, then key). Given-up
-- records, which stay until retention, are not in it.
CREATE INDEX records_due ON records (next_settle_at, key) WHERE state = 4 AND gave_up = 0;
