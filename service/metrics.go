package service

import (
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leapgate/leapgate/descriptors"
)

// Label values used when a label would otherwise exceed its cardinality cap
// or carry no rule.
const (
	// OverflowLabel replaces a detailed metric key once the cap of distinct
	// values has been reached.
	OverflowLabel = "_overflow_"
)

// Default caps of distinct label values.
const (
	// MaxUnknownDomains is the most distinct domains that
	// ratelimit_service_domain_not_found is labelled with; requests for
	// further unknown domains are counted under OverflowLabel.
	MaxUnknownDomains = 100
	// DefaultMaxDetailedKeys is the most distinct detailed metric keys one
	// rule reports before further ones are counted under OverflowLabel.
	DefaultMaxDetailedKeys = 1000
)

// Values of the err_type label of ratelimit_service_should_rate_limit_error.
const (
	errTypeNoConfig = "no_config"
	errTypeLimiter  = "limiter"
)

// Values of the reason label of leapgate_requests_refused_total: input the
// service did not take as sent.
const (
	// refusedTooManyDescriptors: the request had more than MaxDescriptors
	// descriptors and was answered OVER_LIMIT.
	refusedTooManyDescriptors = "too_many_descriptors"
	// refusedBadOverride: a descriptor's limit override could not be laid
	// out and was ignored (the descriptor was answered by its rule).
	refusedBadOverride = "invalid_limit_override"
	// refusedBrokenRule: the descriptor matched a rule the service cannot
	// serve (see Service.CheckRules) and was answered OVER_LIMIT.
	refusedBrokenRule = "rule_not_servable"
)

// metrics holds the service's Prometheus collectors. Per-rule label children
// are resolved once per rule (ruleCounters) so that counting a request does
// not hash labels or allocate.
type metrics struct {
	totalHits   *prometheus.CounterVec
	overLimit   *prometheus.CounterVec
	nearLimit   *prometheus.CounterVec
	withinLimit *prometheus.CounterVec
	shadowMode  *prometheus.CounterVec
	circuitOpen *prometheus.CounterVec

	globalShadow   prometheus.Counter
	domainNotFound *cappedCounter
	errors         *prometheus.CounterVec
	refused        *prometheus.CounterVec

	// rlsRequests and rlsDuration are envoyproxy/ratelimit's metrics of
	// ShouldRateLimit calls, by its names (its statsd exporter mapping),
	// labelled grpc_method="ShouldRateLimit"; the handler of GRPC counts
	// them.
	rlsRequests prometheus.Counter
	rlsDuration prometheus.Observer

	maxDetailed int

	mu        sync.Mutex
	detailed  map[string]*detailedCounters // by domain + "\x00" + rule ID; survives reloads
	overrides map[string]*detailedCounters // by domain
}

// ruleCounters are the label children of one (domain, key) pair.
type ruleCounters struct {
	total, over, near, within, shadow, circuit prometheus.Counter
}

func newMetrics(reg *prometheus.Registry, maxDetailed int) (*metrics, error) {
	ruleVec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "ratelimit_service",
			Subsystem: "rate_limit",
			Name:      name,
			Help:      help,
		}, []string{"domain", "key"})
	}
	m := &metrics{
		totalHits:   ruleVec("total_hits", "Hits (in units of hits_addend) of descriptors that matched a rule."),
		overLimit:   ruleVec("over_limit", "Hits answered OVER_LIMIT by a rate limit (including shadow-mode rules)."),
		nearLimit:   ruleVec("near_limit", "Admitted hits above NearLimitRatio of the limit."),
		withinLimit: ruleVec("within_limit", "Hits answered within the limit."),
		shadowMode:  ruleVec("shadow_mode", "Over-limit hits answered OK because the rule is in shadow mode."),
		// Leapgate's own (upstream has no breakers): named by Prometheus
		// conventions, with the labels of the rule counters.
		circuitOpen: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leapgate_rate_limit_circuit_open_total",
			Help: "Hits refused because the rule's circuit breaker is open.",
		}, []string{"domain", "key"}),
		globalShadow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_service_global_shadow_mode",
			Help: "Requests answered OK only because global shadow mode (SHADOW_MODE) is on.",
		}),
		// Labelled by domain as envoyproxy/ratelimit's per-domain stat; the
		// domain is the caller's choice, so its values are capped.
		domainNotFound: newCappedCounter(prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_service_domain_not_found",
			Help: "Requests for a domain that no rule file defines (answered OK), by domain: at most MaxUnknownDomains values, then " + OverflowLabel + ".",
		}, []string{"domain"}), MaxUnknownDomains),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_service_should_rate_limit_error",
			Help: "ShouldRateLimit calls answered with an error, by cause.",
		}, []string{"err_type"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leapgate_requests_refused_total",
			Help: "Rate-limit input not taken as sent, by reason: too_many_descriptors (request answered OVER_LIMIT), invalid_limit_override (descriptor answered by its rule), rule_not_servable (descriptor answered OVER_LIMIT).",
		}, []string{"reason"}),
		maxDetailed: maxDetailed,
		detailed:    make(map[string]*detailedCounters),
		overrides:   make(map[string]*detailedCounters),
	}
	rlsRequests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_service_total_requests",
		Help: "ShouldRateLimit calls (envoyproxy/ratelimit's name; leapgate_grpc_server_handling_seconds has every method and status).",
	}, []string{"grpc_method"})
	rlsDuration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ratelimit_service_response_time_seconds",
		Help:    "Time to answer a ShouldRateLimit call (envoyproxy/ratelimit's name).",
		Buckets: prometheus.ExponentialBuckets(50e-6, 4, 9),
	}, []string{"grpc_method"})
	m.rlsRequests = rlsRequests.WithLabelValues("ShouldRateLimit")
	m.rlsDuration = rlsDuration.WithLabelValues("ShouldRateLimit")
	for _, c := range []prometheus.Collector{
		m.totalHits, m.overLimit, m.nearLimit, m.withinLimit, m.shadowMode, m.circuitOpen,
		m.globalShadow, m.domainNotFound.vec, m.errors, m.refused, rlsRequests, rlsDuration,
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Pre-create the error children so that every cause is exported as 0.
	for _, t := range []string{errTypeNoConfig, errTypeLimiter} {
		m.errors.WithLabelValues(t)
	}
	for _, r := range []string{refusedTooManyDescriptors, refusedBadOverride, refusedBrokenRule} {
		m.refused.WithLabelValues(r)
	}
	return m, nil
}

// counters returns the label children of (domain, key).
func (m *metrics) counters(domain, key string) *ruleCounters {
	return &ruleCounters{
		total:   m.totalHits.WithLabelValues(domain, key),
		over:    m.overLimit.WithLabelValues(domain, key),
		near:    m.nearLimit.WithLabelValues(domain, key),
		within:  m.withinLimit.WithLabelValues(domain, key),
		shadow:  m.shadowMode.WithLabelValues(domain, key),
		circuit: m.circuitOpen.WithLabelValues(domain, key),
	}
}

// deleteSeries removes the series of (domain, key) from every per-rule vector.
func (m *metrics) deleteSeries(domain, key string) {
	for _, v := range []*prometheus.CounterVec{m.totalHits, m.overLimit, m.nearLimit, m.withinLimit, m.shadowMode, m.circuitOpen} {
		v.DeleteLabelValues(domain, key)
	}
}

// overrideCounters returns the counters of descriptors of domain limited by
// their own limit override, keyed by overrideMetricKey and capped like
// detailed metric keys; the same object is returned across reloads.
func (m *metrics) overrideCounters(domain string) *detailedCounters {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.overrides[domain]
	if !ok {
		d = &detailedCounters{m: m, domain: domain, max: m.maxDetailed}
		m.overrides[domain] = d
	}
	return d
}

// overrideMetricKey is the stats key of a descriptor limited by its own
// override. With values (the rule it matches has detailed_metric) it is
// envoyproxy/ratelimit's, "domain.key_value.key_value..." of the request's
// own entries ("key" alone for an empty value), each value as
// descriptors.MetricValue shows it. Without, every non-empty value is "*"
// ("domain.key_*.key_*"): the values, which the caller chooses, stay out of
// the public labels, as for every other rule.
func overrideMetricKey(domain string, entries []descriptors.Entry, values bool) string {
	var b strings.Builder
	b.WriteString(domain)
	b.WriteByte('.')
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(descriptors.MetricValue(e.Key))
		switch {
		case e.Value == "":
		case values:
			b.WriteByte('_')
			b.WriteString(descriptors.MetricValue(e.Value))
		default:
			b.WriteString("_*")
		}
	}
	return b.String()
}

// detailedFor returns the capped per-value counters of a rule with
// detailed_metric or value_to_metric; the same object is returned across
// reloads so the cap holds for the life of the process.
func (m *metrics) detailedFor(domain, ruleID string) *detailedCounters {
	m.mu.Lock()
	defer m.mu.Unlock()
	id := domain + "\x00" + ruleID
	d, ok := m.detailed[id]
	if !ok {
		d = &detailedCounters{m: m, domain: domain, max: m.maxDetailed}
		m.detailed[id] = d
	}
	return d
}

func (m *metrics) error(errType string) { m.errors.WithLabelValues(errType).Inc() }

// detailedCounters maps the detailed metric keys of one rule to counters,
// with at most max distinct keys; later keys share OverflowLabel.
type detailedCounters struct {
	m      *metrics
	domain string
	max    int

	keys     sync.Map // string -> *ruleCounters
	mu       sync.Mutex
	n        int
	overflow *ruleCounters
}

func (d *detailedCounters) get(key string) *ruleCounters {
	if c, ok := d.keys.Load(key); ok {
		return c.(*ruleCounters)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if c, ok := d.keys.Load(key); ok {
		return c.(*ruleCounters)
	}
	if d.n >= d.max {
		if d.overflow == nil {
			d.overflow = d.m.counters(d.domain, OverflowLabel)
		}
		return d.overflow
	}
	key = strings.Clone(key) // a label must not pin a request's memory
	c := d.m.counters(d.domain, key)
	d.keys.Store(key, c)
	d.n++
	return c
}

// cappedCounter is a counter with one label that takes at most max distinct
// values (caller-chosen ones), further values counted under OverflowLabel.
// A value is kept as a valid UTF-8 label of at most maxLoggedBytes bytes.
type cappedCounter struct {
	vec *prometheus.CounterVec
	max int

	children sync.Map // label value -> prometheus.Counter
	mu       sync.Mutex
	n        int
}

func newCappedCounter(vec *prometheus.CounterVec, max int) *cappedCounter {
	return &cappedCounter{vec: vec, max: max}
}

// inc counts one under value, or under OverflowLabel once max values are
// taken.
func (c *cappedCounter) inc(value string) {
	if ch, ok := c.children.Load(value); ok {
		ch.(prometheus.Counter).Inc()
		return
	}
	c.mu.Lock()
	ch, ok := c.children.Load(value)
	if !ok {
		if c.n < c.max {
			value = strings.Clone(value) // a label must not pin a request's memory
			ch = c.vec.WithLabelValues(loggable(value))
			c.children.Store(value, ch)
			c.n++
		} else {
			ch = c.vec.WithLabelValues(OverflowLabel)
		}
	}
	c.mu.Unlock()
	ch.(prometheus.Counter).Inc()
}
