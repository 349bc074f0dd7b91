package service

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"example.com/paymentsd/store"
)

// recordMetrics are the payment records' metrics.
type recordMetrics struct {
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
	resolutions *prometheus.CounterVec
	// outcomesPending counts the outcomes in the outbox, and
	// outcomeCommit times each from the provider's answer to its commit.
	outcomesPending prometheus.Gauge
	outcomeCommit   prometheus.Histogram
}

func newRecordMetrics(reg prometheus.Registerer) *recordMetrics {
	m := &recordMetrics{
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
			Help: "Record store operations that failed (not counting not-found and lost leases).",
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
		resolutions: resolutionsCounter(),
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
	reg.MustRegister(m.outcomesPending, m.outcomeCommit, m.resolutions, m.records, m.unsettled, m.gaveUp, m.replays, m.reuses, m.waits, m.settlements, m.storeTime, m.storeErrors,
		m.clockOffset, m.quietWaits, m.expired)
	for _, outcome := range []string{"succeeded", "unknown"} {
		m.settlements.WithLabelValues(outcome)
	}
	for _, outcome := range []string{"succeeded", "not_created"} {
		m.resolutions.WithLabelValues(outcome)
	}
	return m
}

func (m *recordMetrics) storeOp(op string, start time.Time, err error) {
	m.storeTime.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrLeaseLost) && !errors.Is(err, store.ErrKeyNotStorable) {
		m.storeErrors.WithLabelValues(op).Inc()
	}
}
