-- records_state (state, next_settle_at) is dropped: every query that reads
-- records by state is served by another index that begins with state
-- (records_list_state: the claims a replica holds, leases run out, the
-- counts of each state) or by records_due (settlement), so it was an index
-- every payment's claim and outcome wrote, and no query needed. Measured
-- (store BenchmarkPayment, SQLite, 32 at once), Begin and Finish took
-- 12-20% less CPU without it.
DROP INDEX IF EXISTS records_state;
