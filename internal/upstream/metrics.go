package upstream

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics records the client's calls to the provider. A nil *Metrics records
// nothing.
type Metrics struct {
	requests    *prometheus.CounterVec
	duration    prometheus.Histogram
	retries     prometheus.Counter
	inFlight    prometheus.Gauge
	connections prometheus.Counter
	keyInUse    *prometheus.GaugeVec
}

// NewMetrics registers the provider-call metrics with reg. Labels common to
// every series, such as the environment, belong on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paymentsd_provider_requests_total",
			Help: "Requests to the payment provider, by HTTP status or, when no reply came, by transport outcome (unreachable, connection_lost, deadline_exceeded, canceled, circuit_open).",
		}, []string{"outcome"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "paymentsd_provider_request_duration_seconds",
			Help:    "Time from sending a request to the payment provider to reading its whole reply, per attempt.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paymentsd_provider_retries_total",
			Help: "Attempts after the first, with the same idempotency key and body.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paymentsd_provider_requests_in_flight",
			Help: "Requests to the payment provider now under way.",
		}),
		connections: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paymentsd_provider_connections_opened_total",
			Help: "New connections opened to the payment provider; reused ones are not counted.",
		}),
		keyInUse: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "paymentsd_provider_api_key_in_use",
			Help: "One series per provider API key loaded, labelled with its fingerprint (the first 8 hex characters of its SHA-256, never the key): 1 for the key requests carry first, 0 for the other while rotating.",
		}, []string{"fingerprint"}),
	}
	reg.MustRegister(m.requests, m.duration, m.retries, m.inFlight, m.connections, m.keyInUse)
	// Outcomes alerts take a rate of start at zero: a series born at its
	// first request has no earlier sample, and rate() would miss that
	// request (the first short episode of an open circuit, or of a revoked
	// key). 401 and 403 are the statuses the provider documents; other
	// statuses appear as they are seen.
	for _, outcome := range []string{outcomeCircuitOpen, outcomeUnreachable, outcomeConnectionLost, outcomeDeadlineExceeded, outcomeCanceled, "401", "403"} {
		m.requests.WithLabelValues(outcome)
	}
	return m
}

// Transport outcomes: the outcome label of a request that got no status.
const (
	outcomeCircuitOpen      = "circuit_open"
	outcomeUnreachable      = "unreachable"
	outcomeConnectionLost   = "connection_lost"
	outcomeDeadlineExceeded = "deadline_exceeded"
	outcomeCanceled         = "canceled"
)

// setKeys shows the set's keys, and no other.
func (m *Metrics) setKeys(s *keySet) {
	m.keyInUse.Reset()
	for i, k := range s.keys {
		v := 0.0
		if i == s.inUse {
			v = 1
		}
		m.keyInUse.WithLabelValues(Fingerprint(k)).Set(v)
	}
}

func (m *Metrics) observe(outcome string, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(outcome).Inc()
	if d > 0 {
		m.duration.Observe(d.Seconds())
	}
}

func (m *Metrics) retry() {
	if m != nil {
		m.retries.Inc()
	}
}

func (m *Metrics) start() {
	if m != nil {
		m.inFlight.Inc()
	}
}

func (m *Metrics) end() {
	if m != nil {
		m.inFlight.Dec()
	}
}

func (m *Metrics) connOpened() {
	if m != nil {
		m.connections.Inc()
	}
}

func transportLabel(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return outcomeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		return outcomeCanceled
	case errors.Is(err, ErrUnreachable):
		return outcomeUnreachable
	default:
		return outcomeConnectionLost
	}
}
