-- An index for settlement. (A payment's outcome and its attempt's journal
-- row are one statement, a data-modifying CTE: PostgreSQL needs no trigger
-- for it.)
--
-- records_due is settlement's work: the unknown records it has not given up
-- on, in the order it reads them (next settlement, then key). Given-up
-- records, which stay until retention, are not in it.
CREATE INDEX records_due ON records (next_settle_at, key_hash) WHERE state = 4 AND gave_up = false;
