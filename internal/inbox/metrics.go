package inbox

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a delivery, the values of the outcome label.
const (
	OutcomeStored    = "stored"
	OutcomeDuplicate = "duplicate"
	// OutcomeBadToken: a path under /webhooks/ without a configured token.
	OutcomeBadToken = "bad_token"
	// OutcomeNotFound: any other path (probes, scanners, /healthz).
	OutcomeNotFound     = "not_found"
	OutcomeTooLarge     = "too_large"
	OutcomeStoreFailure = "store_failure"
	OutcomeBadMethod    = "bad_method"
	// OutcomeBadRequest: the body could not be read (cut off, or too slow).
	OutcomeBadRequest = "bad_request"
	// OutcomeBusy: the bodies being read and stored hold the deliveries'
	// byte budget; 503, and the provider retries.
	OutcomeBusy = "busy"
	// OutcomeOverQuota: the inbox holds its quota, or the database's volume
	// is down to the reserve kept for payments; 503, and the provider
	// retries.
	OutcomeOverQuota = "over_quota"
)

// Values of the token label: which configured token a delivery carried,
// in the order configured, so a rotation shows when the old one falls
// silent.
const (
	TokenFirst  = "first"
	TokenSecond = "second"
	TokenNone   = "none"
)

// Metrics counts deliveries and connections.
type Metrics struct {
	deliveries  *prometheus.CounterVec
	inProgress  prometheus.Gauge
	storedBytes prometheus.Gauge
	quotaBytes  prometheus.Gauge
	dropped     *prometheus.CounterVec
}

// NewMetrics registers the inbox's metrics on reg; labels common to every
// series, such as the environment, belong on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paymentsd_webhook_deliveries_total",
			Help: "Requests to the webhook port, by outcome (stored, duplicate: stored with the same body as an earlier event, bad_token, not_found, bad_method, too_large, bad_request, store_failure, busy, over_quota) and token (first or second configured; none without one).",
		}, []string{"outcome", "token"}),
		inProgress: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paymentsd_webhook_deliveries_in_progress",
			Help: "Webhook deliveries being read and stored now.",
		}),
		storedBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paymentsd_webhook_stored_bytes",
			Help: "Bytes the webhook inbox holds (bodies, content types and headers), as of the last count.",
		}),
		quotaBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paymentsd_webhook_max_stored_bytes",
			Help: "PAYMENTS_WEBHOOK_MAX_STORED_BYTES: past it, deliveries are refused (over_quota).",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paymentsd_webhook_connections_dropped_total",
			Help: "Webhook port connections closed by paymentsd, by reason: per_ip (the address had its share), full (every connection had shown a token), evicted (the oldest that had shown none, for a new one).",
		}, []string{"reason"}),
	}
	reg.MustRegister(m.deliveries, m.inProgress, m.storedBytes, m.quotaBytes, m.dropped)
	for _, o := range []string{OutcomeBadToken, OutcomeNotFound} {
		m.deliveries.WithLabelValues(o, TokenNone)
	}
	for _, r := range []string{dropPerIP, dropFull, dropEvicted} {
		m.dropped.WithLabelValues(r)
	}
	return m
}

func (m *Metrics) count(outcome, token string) {
	if m != nil {
		m.deliveries.WithLabelValues(outcome, token).Inc()
	}
}

// stored adds an event's bytes to the stored-bytes gauge, which WatchUsage
// sets right as it counts (retention deletes without the intake knowing).
func (m *Metrics) stored(size int64) {
	if m != nil {
		m.storedBytes.Add(float64(size))
	}
}

func (m *Metrics) started() {
	if m != nil {
		m.inProgress.Inc()
	}
}

func (m *Metrics) ended() {
	if m != nil {
		m.inProgress.Dec()
	}
}

// WatchUsage sets the inbox's stored-bytes gauge now and every interval
// until ctx ends; retention deletes events without the intake knowing.
func (h *Handler) WatchUsage(ctx context.Context, interval time.Duration) {
	if h.metrics == nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		uctx, cancel := context.WithTimeout(ctx, interval)
		u, err := h.store.InboxUsage(uctx)
		cancel()
		if err == nil {
			h.metrics.storedBytes.Set(float64(u.StoredBytes))
		} else if ctx.Err() == nil {
			h.logger.WarnContext(ctx, "count the webhook inbox's bytes", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
