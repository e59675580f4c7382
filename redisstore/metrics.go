package redisstore

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Store's Prometheus collectors.
type metrics struct {
	latency   *prometheus.HistogramVec // by op: do, undo, ping
	errors    *prometheus.CounterVec   // by op
	fallbacks *prometheus.CounterVec   // by mode: error, allow, deny, local
	cacheHits prometheus.Counter
	// reservations counts the calls for blocks by event; blockAnswers the
	// requests answered from a block.
	reservations *prometheus.CounterVec
	blockAnswers prometheus.Counter
	up           prometheus.Gauge
	batch        prometheus.Histogram // Store operations per round trip
	// ops holds the latency and error series of each operation, looked up
	// once: WithLabelValues hashes its labels on every call.
	ops map[string]opMetrics
}

// opMetrics are one operation's series of latency and errors.
type opMetrics struct {
	latency prometheus.Observer
	errors  prometheus.Counter
}

// op returns the series of operation name.
func (m *metrics) op(name string) opMetrics {
	if o, ok := m.ops[name]; ok {
		return o
	}
	return opMetrics{m.latency.WithLabelValues(name), m.errors.WithLabelValues(name)}
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "leapgate_redis_call_duration_seconds",
			Help:    "Duration of calls to Redis as the caller waits for them (queueing for a shared pipeline included), by operation.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leapgate_redis_errors_total",
			Help: "Calls to Redis that failed, by operation.",
		}, []string{"op"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leapgate_redis_fallbacks_total",
			Help: "Batches answered by the failure mode (REDIS_FAILURE_MODE) because Redis failed or was down.",
		}, []string{"mode"}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leapgate_redis_local_cache_hits_total",
			Help: "Requests refused from the local over-limit cache without asking Redis.",
		}),
		reservations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leapgate_redis_reservations_total",
			Help: "Calls for blocks of quota spent locally (REDIS_RESERVATION), by event: granted (a new block), renewed (settled and topped up), cut (not renewed: the key came near its limit; given back at once), returned (given back, or nothing granted), failed.",
		}, []string{"event"}),
		blockAnswers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leapgate_redis_block_answers_total",
			Help: "Requests answered from a block of quota held by this replica, without a round trip to Redis.",
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "leapgate_redis_pipeline_operations",
			Help:    "Store operations (a request's Do or Undo) sent together in one round trip to Redis: how much concurrent requests share.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}),
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "leapgate_redis_up",
			Help: "1 when the last health check of Redis succeeded, else 0.",
		}),
	}
	m.ops = map[string]opMetrics{}
	for _, event := range []string{"granted", "renewed", "cut", "returned", "failed"} {
		m.reservations.WithLabelValues(event)
	}
	for _, op := range []string{"do", "undo", "ping", "reserve"} {
		m.ops[op] = opMetrics{m.latency.WithLabelValues(op), m.errors.WithLabelValues(op)}
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.latency, m.errors, m.fallbacks, m.cacheHits, m.reservations, m.blockAnswers, m.up, m.batch} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
