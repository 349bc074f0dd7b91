-- A btree can't index a long, incompressible key (index rows stop at about
-- 2.7 KB, and keys may be as long as a request), so records are keyed by
-- the SHA-256 of the key's bytes, which the store computes; key keeps the
-- key itself, exactly.
ALTER TABLE records ADD COLUMN key_hash bytea;
UPDATE records SET key_hash = sha256(convert_to(key, 'UTF8'));
ALTER TABLE records ALTER COLUMN key_hash SET NOT NULL;
ALTER TABLE records DROP CONSTRAINT records_pkey;
ALTER TABLE records ADD PRIMARY KEY (key_hash);
