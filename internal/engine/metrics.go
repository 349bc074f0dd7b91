package engine

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"example.com/paymentsd/internal/store"
)

// Metrics are the payment engine's metrics, and the record store's
// operations (the transport counts its own lookups, lists and
// resolutions here too).
type Metrics struct {
	records     *prometheus.GaugeVec
	unsettled   prometheus.Gauge
	gaveUp      prometheus.Counter
	replays     prometheus.Counter
	reuses      prometheus.Counter
	waits       prometheus.Counter
	settlements *prometheus.CounterVec
	storeTime   *prometheus.HistogramVec
	storeErrors *prometheus.CounterVec
	clockOffset prometheus.Gauge
	quietWaits  prometheus.Counter
	expired     prometheus.Counter
	// Resolutions counts people's resolutions, by outcome.
	Resolutions *prometheus.CounterVec
	// outcomesPending counts the outcomes in the outbox, and
	// outcomeCommit times each from the provider's answer to its commit.
	outcomesPending prometheus.Gauge
	outcomeCommit   prometheus.Histogram
}

// NewMetrics registers the engine's metrics on reg, with the counts st
// keeps itself.
func NewMetrics(reg prometheus.Registerer, st *store.Store) *Metrics {
	m := &Metrics{
		records: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "paymentsd_records",
			Help: "Payment records by state, as of the last count.",
		}, []string{"state"}),
		unsettled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paymentsd_records_unsettled",
			Help: "Records whose outcome is still unknown after their settlement window closed: alert on any, and resolve them (ResolveMultiCardPayment). It counts the whole record store, so replicas sharing one PostgreSQL all report the same number: aggregate with max(), not sum().",
		}),
		gaveUp: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paymentsd_settlement_gave_up_total",
			Help: "Records whose settlement window closed with the outcome unknown.",
		}),
		replays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paymentsd_replays_total",
			Help: "Calls answered from a succeeded record without calling the provider.",
		}),
		reuses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paymentsd_idempotency_key_reuses_total",
			Help: "Calls refused because their key was first used for a different request.",
		}),
		waits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paymentsd_in_progress_waits_total",
			Help: "Calls that waited on another call with the same key.",
		}),
		settlements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paymentsd_settlement_attempts_total",
			Help: "Background settlement re-sends, by outcome (succeeded, unknown).",
		}, []string{"outcome"}),
		storeTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "paymentsd_store_duration_seconds",
			Help:    "Record store operation latency.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"op"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paymentsd_store_errors_total",
			Help: "Record store operations that failed: the database erred or did not answer. The store's answers about a record (none for the key, a lease lost, a key it can't store exactly, a resolution refused by the record's state) are not failures.",
		}, []string{"op"}),
		clockOffset: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paymentsd_clock_offset_seconds",
			Help: "How far this replica's clock is ahead of the record store's (PostgreSQL: the database server's, which decides leases), as last measured; negative if behind. paymentsd warns past one second.",
		}),
		quietWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paymentsd_provider_quiet_refusals_total",
			Help: "Calls answered PAYMENT_IN_PROGRESS because an earlier request with their key may still be at the provider (its quiet period).",
		}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paymentsd_idempotency_key_expired_total",
			Help: "Calls refused because their key's record was deleted by retention (its tombstone refuses the key).",
		}),
		Resolutions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paymentsd_resolutions_total",
			Help: "Payments in doubt resolved by a person (ResolveMultiCardPayment), by outcome (succeeded, not_created).",
		}, []string{"outcome"}),
		outcomesPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paymentsd_outcomes_pending",
			Help: "Outcomes (a provider's answer, or that nothing was sent) this replica has learnt and not yet written to their records; it retries each until the record store takes it, and holds its key meanwhile. Above 0 for long: the store is refusing writes. Outcomes still pending when the replica stops are logged at error level.",
		}),
		outcomeCommit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "paymentsd_outcome_commit_seconds",
			Help: "Time from the provider's answer (or the decision to send nothing) to the commit of its record: a replica that dies within it leaves the record in progress, and settlement sends the key again.",
			// Fine at the bottom, where a healthy store commits, for the
			// window's percentiles (paymentsbench reports them).
			Buckets: []float64{.0001, .00025, .0005, .00075, .001, .0015, .002, .003, .004, .005, .0075, .01, .015, .02, .03,
				.05, .075, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}),
	}
	reg.MustRegister(m.outcomesPending, m.outcomeCommit, m.Resolutions, m.records, m.unsettled, m.gaveUp, m.replays, m.reuses, m.waits, m.settlements, m.storeTime, m.storeErrors,
		m.clockOffset, m.quietWaits, m.expired)
	for _, outcome := range []string{"succeeded", "unknown"} {
		m.settlements.WithLabelValues(outcome)
	}
	for _, outcome := range []string{"succeeded", "not_created"} {
		m.Resolutions.WithLabelValues(outcome)
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "paymentsd_store_commits_total",
		Help: "Write transactions the record store committed; with group commit one holds the records of many calls.",
	}, func() float64 { return float64(st.Commits()) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "paymentsd_store_write_healthy_seconds",
		Help: "How long every write of this replica's record store has been committing, without a failure or a gap of more than 1.5s: a record whose holder's lease expired is taken over only past 5s of it, so that the holder's outcome, retried meanwhile, is written first. 0 while the store's writes fail.",
	}, func() float64 { return st.WriteHealthyFor().Seconds() }))
	// Counters alerts take a rate of start at zero: a series born at its
	// first error has no earlier sample, and rate() would miss that error.
	for _, op := range storeOps {
		m.storeErrors.WithLabelValues(op)
	}
	return m
}

// Record store operations: the op label of paymentsd_store_duration_seconds
// and paymentsd_store_errors_total.
const (
	OpBegin    = "begin"
	OpFinish   = "finish"
	OpGet      = "get"
	OpAudit    = "audit"
	OpList     = "list"
	OpResolve  = "resolve"
	OpSettle   = "settle_due"
	OpRelease  = "release"
	OpStats    = "stats"
	OpDelete   = "delete"
	OpAttempts = "attempts"
)

var storeOps = []string{OpBegin, OpFinish, OpGet, OpAudit, OpAttempts, OpList, OpResolve, OpSettle, OpRelease, OpStats, OpDelete}

// storeAnswers are the store's answers about a record: each is the store
// working, and each is answered to the caller as such, so none counts as a
// store error (which pages).
var storeAnswers = []error{
	store.ErrNotFound,       // no record for the key
	store.ErrKeyNotStorable, // the key can't be stored exactly
	store.ErrNotUnknown,     // Resolve: the record is not in doubt
	store.ErrChanged,        // Resolve: the record changed since it was looked at
	store.ErrInFlight,       // Resolve: a request with the key may be at the provider
}

// StoreOp records an operation's latency and, unless err is nil or one of
// the store's answers, its failure.
func (m *Metrics) StoreOp(op string, start time.Time, err error) {
	m.storeTime.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err != nil && !slices.ContainsFunc(storeAnswers, func(answer error) bool { return errors.Is(err, answer) }) && !callerLeft(err) {
		m.storeErrors.WithLabelValues(op).Inc()
	}
}

// callerLeft reports whether err is only its caller's giving up (its
// context ended while the operation was queued or committing): the store
// did not fail. A commit whose answer never came did.
func callerLeft(err error) bool {
	return !errors.Is(err, store.ErrCommitUnknown) &&
		(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled))
}
