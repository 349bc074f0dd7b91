package store

import (
	"context"
	"database/sql"
	"fmt"
)

// Replication is what the record store's primary says of how its commits
// are kept: whether a commit it acknowledges is already on a synchronous
// standby, so that a failover to that standby loses nothing acknowledged.
//
// paymentsd's guarantee (a caller told OK holds a durable payment) needs
// it: a failover to a standby without the last acknowledged commits puts
// records back as they were, and keys whose callers were told OK are sent
// to the provider again (docs/postgresql.md).
type Replication struct {
	// Backend is "sqlite" or "postgres".
	Backend string
	// SynchronousCommit is the primary's synchronous_commit for this
	// store's sessions (on, remote_apply, remote_write, local or off); ""
	// for SQLite.
	SynchronousCommit string
	// SynchronousStandbyNames is the primary's synchronous_standby_names:
	// the standbys a commit waits for; "" when it waits for none.
	SynchronousStandbyNames string
	// Standbys counts the standbys streaming from the primary (rows of
	// pg_stat_replication, which every role may count).
	Standbys int
	// SyncStandbys counts those the primary deems synchronous
	// (sync_state sync or quorum), or is -1 when this store's role may not
	// read their state (it needs pg_read_all_stats or superuser).
	SyncStandbys int
}

// Synchronous reports whether every commit the store acknowledges is
// durable beyond its primary: a SQLite file is local and never fails
// over, and counts as durable; a PostgreSQL primary is synchronous when
// its commits wait for a standby (synchronous_commit on, remote_apply or
// remote_write, and synchronous_standby_names set). Whether such a
// standby is attached decides whether commits are acknowledged at all,
// not what they may lose: without one, commits wait. A lone PostgreSQL
// server with no standby is not synchronous: paymentsd can't tell it from
// a primary whose standby was dropped (Patroni without
// synchronous_mode_strict drops it), which a failover may undo.
func (r Replication) Synchronous() bool {
	if r.Backend == "sqlite" {
		return true
	}
	switch r.SynchronousCommit {
	case "on", "remote_apply", "remote_write":
		return r.SynchronousStandbyNames != ""
	}
	return false
}

// Replication reads the primary's replication settings: synchronous_commit
// and synchronous_standby_names as this store's sessions see them, and
// the standbys attached (pg_stat_replication). Through a pooler the
// settings are those of whichever server session answers, for the same
// role, as the store's writes get.
func (s *Store) Replication(ctx context.Context) (Replication, error) {
	if s.pg == nil {
		return Replication{Backend: s.d.name}, nil
	}
	r := Replication{Backend: s.d.name}
	var sync sql.NullInt64
	err := s.w.QueryRowContext(ctx, `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
		(SELECT count(*) FROM pg_stat_replication),
		(SELECT CASE WHEN count(*) > 0 AND count(sync_state) = 0 THEN NULL
			ELSE count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')) END FROM pg_stat_replication)`).
		Scan(&r.SynchronousCommit, &r.SynchronousStandbyNames, &r.Standbys, &sync)
	if err != nil {
		return Replication{}, s.wrap(fmt.Errorf("read the replication settings: %w", err))
	}
	r.SyncStandbys = -1
	if sync.Valid {
		r.SyncStandbys = int(sync.Int64)
	}
	return r, nil
}
