-- The inbox keeps what a sender sent as bytes. content_type_bytes and
-- header_bytes hold the Content-Type and the headers exactly, whatever
-- bytes they hold (text refuses invalid UTF-8: SQLSTATE 22021);
-- content_type and headers keep a copy with invalid UTF-8 replaced, for
-- readers of the old columns. Rows from before this migration have NULL
-- bytes columns and are read from the old ones.
--
-- size is an event's bytes (body, content type and headers as stored): what
-- a page's byte budget and the inbox quota count. event_usage holds their
-- sum, kept by a trigger whatever writes or deletes events (retention
-- included). Old binaries still running during a rollout insert size 0.
ALTER TABLE events ADD COLUMN content_type_bytes bytea;
ALTER TABLE events ADD COLUMN header_bytes bytea;
ALTER TABLE events ADD COLUMN size bigint NOT NULL DEFAULT 0;
UPDATE events SET size = COALESCE(octet_length(body), 0) + octet_length(content_type) + octet_length(headers);

-- Pages are cut by size before any body is read: this index answers that
-- query without touching the rows.
CREATE INDEX events_seq_size ON events (seq, size);

CREATE TABLE event_usage (
	id           integer PRIMARY KEY CHECK (id = 1),
	stored_bytes bigint NOT NULL
);
INSERT INTO event_usage (id, stored_bytes) SELECT 1, COALESCE(SUM(size), 0) FROM events;

CREATE FUNCTION events_usage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		UPDATE event_usage SET stored_bytes = stored_bytes + NEW.size WHERE id = 1;
	ELSE
		UPDATE event_usage SET stored_bytes = stored_bytes - OLD.size WHERE id = 1;
	END IF;
	RETURN NULL;
END
$$;
CREATE TRIGGER events_usage AFTER INSERT OR DELETE ON events
	FOR EACH ROW EXECUTE FUNCTION events_usage();
