package breaker

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the registry's Prometheus collectors.
type metrics struct {
	state        *prometheus.GaugeVec     // rule, resource
	transitions  *prometheus.CounterVec   // rule, from, to
	responseTime *prometheus.HistogramVec // rule
	observations *prometheus.CounterVec   // source
	dropped      *prometheus.CounterVec   // rule
	reclaimed    *prometheus.CounterVec   // rule
	duplicates   prometheus.Counter
	override     *prometheus.GaugeVec // rule, resource, mode
	bySource     map[string]prometheus.Counter
}

// observed counts one observation of source.
func (m *metrics) observed(source string) {
	if c := m.bySource[source]; c != nil {
		c.Inc()
		return
	}
	m.observations.WithLabelValues(source).Inc()
}

// freshGauge is the state gauge, brought up to date (open breakers past
// their open_duration half-open, timed-out probes reopen) before every
// collection, so a scrape never shows a state that is already over.
type freshGauge struct {
	*prometheus.GaugeVec
	advance func()
}

func (g freshGauge) Collect(ch chan<- prometheus.Metric) {
	g.advance()
	g.GaugeVec.Collect(ch)
}

// newMetrics creates the collectors and registers them on reg, if not nil;
// advance is called before each collection of the state gauge.
func newMetrics(reg *prometheus.Registry, advance func()) (*metrics, error) {
	m := &metrics{
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "leapgate_breaker_state",
			Help: "State of each circuit breaker: 0 closed, 1 open, 2 half-open (resource: empty for a rule with one breaker; the distinct values of a value-less or wildcard rule only with detailed_metric, capped per rule).",
		}, []string{"rule", "resource"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leapgate_breaker_transitions_total",
			Help: "Circuit breaker state changes.",
		}, []string{"rule", "from", "to"}),
		responseTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "leapgate_breaker_response_time_seconds",
			Help:    "Response times reported to each circuit breaker rule (aborted and in-flight observations excluded).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"rule"}),
		observations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leapgate_breaker_observations_total",
			Help: "Response-time observations received, by source (ext_proc, ext_proc_inflight, als, report).",
		}, []string{"source"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leapgate_breaker_dropped_observations_total",
			Help: "Observations of a new distinct value dropped because the rule has max breakers, all of them open or half-open.",
		}, []string{"rule"}),
		override: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "leapgate_breaker_override",
			Help: "1 for each manual override set on the debug listener (mode: force_open, force_closed, disabled); resource is empty for a whole rule.",
		}, []string{"rule", "resource", "mode"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leapgate_breaker_duplicate_observations_total",
			Help: "Observations dropped because the other Envoy feed (ext_proc or the access-log service) already reported the same request (x-request-id).",
		}),
		reclaimed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leapgate_breaker_reclaimed_total",
			Help: "Closed per-value breakers forgotten, the least recently observed first, to make room for a new value at the rule's max breakers.",
		}, []string{"rule"}),
	}
	m.bySource = make(map[string]prometheus.Counter)
	for _, src := range []string{SourceExtProc, SourceExtProcInFlight, SourceALS, SourceReport} {
		m.bySource[src] = m.observations.WithLabelValues(src)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{freshGauge{m.state, advance}, m.transitions, m.responseTime, m.observations, m.dropped, m.reclaimed, m.duplicates, m.override} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("registering breaker metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *metrics) setState(rule, resource string, s State) {
	m.state.WithLabelValues(rule, resource).Set(float64(s))
}

// deleteState deletes one state series, reporting whether it existed.
func (m *metrics) deleteState(rule, resource string) bool {
	return m.state.DeleteLabelValues(rule, resource)
}

func (m *metrics) transition(rule string, from, to State) {
	m.transitions.WithLabelValues(rule, from.String(), to.String()).Inc()
}

// forget deletes the state series of a rule whose breakers were replaced
// and, if the rule is gone, its response-time series.
func (m *metrics) forget(rule string, gone bool) {
	m.state.DeletePartialMatch(prometheus.Labels{"rule": rule})
	if gone {
		m.responseTime.DeletePartialMatch(prometheus.Labels{"rule": rule})
	}
}
