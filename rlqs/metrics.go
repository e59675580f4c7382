package rlqs

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// unknownDomain is the domain label of streams whose domain has no rules:
// client-chosen strings never become label values.
const unknownDomain = "_unknown_"

// metrics are the service's Prometheus metrics. The gauges are set on
// every tick.
type metrics struct {
	streams, buckets, demand, assigned, shadow, limit *prometheus.GaugeVec
	reports                                           prometheus.Counter
	unknownDomainReports                              prometheus.Counter
	capped                                            prometheus.Counter
	ledgerErrors                                      prometheus.Counter
	abandoned, changes                                *prometheus.CounterVec
	tick                                              prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"domain"})
	}
	m := &metrics{
		streams:  gauge("leapgate_rlqs_clients", "Open RLQS streams (one per Envoy) per domain, the domain of their first report."),
		buckets:  gauge("leapgate_rlqs_buckets", "Tracked RLQS buckets per domain, those of closed streams until their assignments expire included."),
		demand:   gauge("leapgate_rlqs_demand_rate", "Requests per second the open streams' limited buckets report offering (allowed + denied), per domain."),
		assigned: gauge("leapgate_rlqs_assigned_rate", "Requests per second assigned to the open streams' limited buckets (token bucket rates), per domain."),
		shadow:   gauge("leapgate_rlqs_shadow_assigned_rate", "Requests per second that would be assigned to buckets of shadow_mode rules, answered ALLOW_ALL, per domain."),
		limit:    gauge("leapgate_rlqs_limit_rate", "The limits of the rules with RLQS buckets, in requests per second, summed per domain."),
		reports:  prometheus.NewCounter(prometheus.CounterOpts{Name: "leapgate_rlqs_reports_total", Help: "RLQS usage reports received."}),
		unknownDomainReports: prometheus.NewCounter(prometheus.CounterOpts{Name: "leapgate_rlqs_unknown_domain_reports_total",
			Help: "RLQS reports on streams whose domain has no rules (their buckets get ALLOW_ALL)."}),
		capped: prometheus.NewCounter(prometheus.CounterOpts{Name: "leapgate_rlqs_buckets_capped_total",
			Help: "New RLQS buckets answered without being tracked, past RLQS_MAX_BUCKETS_PER_STREAM or RLQS_MAX_BUCKETS_PER_DOMAIN."}),
		ledgerErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "leapgate_rlqs_ledger_errors_total",
			Help: "RLQS allocation ticks whose division through the shared ledger (Redis) failed; assignments then stay as they are."}),
		abandoned: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "leapgate_rlqs_buckets_abandoned_total",
			Help: "RLQS buckets dropped: idle (abandoned after RLQS_BUCKET_IDLE without requests) or expired (of a closed stream, once its assignment expired)."}, []string{"reason"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "leapgate_rlqs_assignment_changes_total",
			Help: "RLQS assignments changed by allocation ticks: cut or raise."}, []string{"direction"}),
		tick: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "leapgate_rlqs_tick_seconds",
			Help: "Time an RLQS allocation tick takes.", Buckets: prometheus.ExponentialBuckets(1e-5, 4, 10)}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.streams, m.buckets, m.demand, m.assigned, m.shadow, m.limit, m.reports,
		m.unknownDomainReports, m.capped, m.ledgerErrors, m.abandoned, m.changes, m.tick} {
		errs = append(errs, reg.Register(c))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("rlqs: registering metrics: %w", err)
	}
	return m, nil
}

// observe sets the gauges from the server's state (lock held).
func (s *Server) observe(live []*bucket) {
	m := s.metrics
	for _, g := range []*prometheus.GaugeVec{m.streams, m.buckets, m.demand, m.assigned, m.shadow, m.limit} {
		g.Reset()
	}
	label := func(domain string) string {
		if s.rules.HasDomain(domain) {
			return domain
		}
		return unknownDomain
	}
	for st := range s.streams {
		if st.domain != "" {
			m.streams.WithLabelValues(label(st.domain)).Inc()
		}
	}
	for d, n := range s.perDomain {
		m.buckets.WithLabelValues(label(d)).Add(float64(n))
	}
	for _, b := range live {
		d := label(b.stream.domain)
		m.demand.WithLabelValues(d).Add(b.demand)
		if b.shadow {
			m.shadow.WithLabelValues(d).Add(b.current.rate())
		} else {
			m.assigned.WithLabelValues(d).Add(b.current.rate())
		}
	}
	for _, p := range s.pools {
		m.limit.WithLabelValues(label(p.domain)).Add(p.limit / p.window)
	}
}
