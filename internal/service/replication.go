package service

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"example.com/paymentsd/internal/store"
)

// DefaultReplicationInterval is how often ReplicationWatch.Watch reads the
// record store's replication settings when given no interval.
const DefaultReplicationInterval = 30 * time.Second

// replicationReadTimeout bounds one read of the settings.
const replicationReadTimeout = 10 * time.Second

// replicationLoss is what a failover of a primary that does not commit
// synchronously can lose, as the log and the docs say it.
const replicationLoss = "acknowledged payments; keys told OK may be sent again"

// ReplicationWatch reads whether the record store's primary commits
// synchronously (store.Replication), exports it as
// paymentsd_store_synchronous_commit (1 or 0; NaN until first read) and
// paymentsd_store_replication_info (the settings, as labels), and logs
// what it finds of a PostgreSQL primary at start and whenever it changes. paymentsd's guarantee,
// that a caller told OK holds a durable payment, needs a store that loses
// no acknowledged commit in a failover: strict synchronous replication
// (docs/postgresql.md).
type ReplicationWatch struct {
	store       *store.Store
	logger      *slog.Logger
	synchronous prometheus.Gauge
	info        *prometheus.GaugeVec

	mu      sync.Mutex
	last    *store.Replication // nil until a read succeeds
	failing bool               // the last read failed
}

// NewReplicationWatch registers the replication metrics on reg and
// returns a watch of st that logs to logger (nil discards).
func NewReplicationWatch(st *store.Store, reg prometheus.Registerer, logger *slog.Logger) *ReplicationWatch {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	w := &ReplicationWatch{
		store:  st,
		logger: logger,
		synchronous: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paymentsd_store_synchronous_commit",
			Help: "1 when every commit the record store acknowledges is durable beyond its primary: PostgreSQL with synchronous_commit on (or remote_apply, remote_write) and synchronous_standby_names set, or a local SQLite file; 0 when a failover may lose acknowledged commits (" + replicationLoss + "); NaN until first read. Read at start and every 30s.",
		}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "paymentsd_store_replication_info",
			Help: "The record store's replication settings as last read, as labels (value 1): backend, synchronous_commit, synchronous_standby_names, standbys streaming, and sync_standbys among them (unknown when the role may not read pg_stat_replication's sync_state).",
		}, []string{"backend", "synchronous_commit", "synchronous_standby_names", "standbys", "sync_standbys"}),
	}
	w.synchronous.Set(math.NaN())
	reg.MustRegister(w.synchronous, w.info)
	return w
}

// Check reads the settings once (for at most 10s), updates the metrics and logs: at the
// first read, what it found, and what a failover could lose if the
// primary is not synchronous; later, only a change. A failed read leaves
// the metrics as they were, and is logged once until a read succeeds.
func (w *ReplicationWatch) Check(ctx context.Context) (store.Replication, error) {
	rctx, cancel := context.WithTimeout(ctx, replicationReadTimeout)
	r, err := w.store.Replication(rctx)
	cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err != nil && errors.Is(ctx.Err(), context.Canceled):
		// Shutting down.
		return store.Replication{}, err
	case err != nil:
		if !w.failing {
			w.logger.Warn("could not read the record store's replication settings; paymentsd_store_synchronous_commit keeps its last value",
				slog.String("error", err.Error()))
		}
		w.failing = true
		return store.Replication{}, err
	}
	w.failing = false
	if w.last != nil && *w.last == r {
		return r, nil
	}
	w.export(r)
	w.log(r, w.last)
	w.last = &r
	return r, nil
}

// Watch runs Check every interval (DefaultReplicationInterval if not
// positive) until ctx ends.
func (w *ReplicationWatch) Watch(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = DefaultReplicationInterval
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			w.Check(ctx)
		}
	}
}

func (w *ReplicationWatch) export(r store.Replication) {
	if r.Synchronous() {
		w.synchronous.Set(1)
	} else {
		w.synchronous.Set(0)
	}
	sync := "unknown"
	if r.SyncStandbys >= 0 {
		sync = strconv.Itoa(r.SyncStandbys)
	}
	w.info.Reset()
	w.info.WithLabelValues(r.Backend, r.SynchronousCommit, r.SynchronousStandbyNames, strconv.Itoa(r.Standbys), sync).Set(1)
}

// log says what r means, at start (prev nil) or as a change from prev.
func (w *ReplicationWatch) log(r store.Replication, prev *store.Replication) {
	attrs := []any{
		slog.String("backend", r.Backend),
		slog.String("synchronous_commit", r.SynchronousCommit),
		slog.String("synchronous_standby_names", r.SynchronousStandbyNames),
		slog.Int("standbys", r.Standbys),
		slog.Int("sync_standbys", r.SyncStandbys),
	}
	switch {
	case r.Backend == "sqlite":
		// Local and never failed over: nothing to say.
	case !r.Synchronous():
		w.logger.Warn("the record store's primary does not commit synchronously: a failover to a standby may lose commits it acknowledged",
			append(attrs,
				slog.String("can_lose", replicationLoss),
				slog.String("fix", "replicate synchronously and strictly: Patroni's synchronous_mode and synchronous_mode_strict, or synchronous_commit on with synchronous_standby_names set (docs/postgresql.md); a PostgreSQL server that never fails over may ignore this"))...)
	case r.SyncStandbys == 0:
		w.logger.Warn("the record store's primary commits synchronously, and no synchronous standby streams from it: commits wait until one does",
			append(attrs, slog.Bool("synchronous", true))...)
	case prev == nil:
		w.logger.Info("the record store's primary commits synchronously: a failover to its synchronous standby loses no acknowledged commit",
			append(attrs,
				slog.Bool("synchronous", true),
				slog.String("requires", "that the primary never drops its synchronous standby to go on alone (Patroni's synchronous_mode_strict); paymentsd sees that only once it happens"))...)
	case !prev.Synchronous() || prev.SyncStandbys == 0:
		w.logger.Info("the record store's primary commits synchronously again, to a synchronous standby", append(attrs, slog.Bool("synchronous", true))...)
	default:
		w.logger.Info("the record store's replication settings changed; its primary still commits synchronously", append(attrs, slog.Bool("synchronous", true))...)
	}
}
