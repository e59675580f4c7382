package breaker

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/window"
)

// Options configures a Registry. The zero Options is usable.
type Options struct {
	// Clock is the time source (default: a new window.MonotonicClock).
	Clock window.Clock
	// Logger receives one line per state change (default: discarded).
	Logger *slog.Logger
	// Metrics, if not nil, is where the registry's collectors are registered.
	Metrics *prometheus.Registry
	// Mapping turns observations into descriptor entries (defaults:
	// destination_cluster and route, no headers).
	Mapping Mapping
	// MaxBreakersPerRule caps the breakers of one rule with value-less or
	// wildcard entries (one per distinct value; default 1000). At the cap,
	// a new value takes the slot of the closed breaker observed least
	// recently (counted in leapgate_breaker_reclaimed_total), so values
	// seen once cannot squat the slots; when every breaker is open or
	// half-open, that of an abandoned one (Breaker.abandoned: no
	// observation for its longest open period and a probe timeout, which a
	// breaker whose upstream still gets traffic would have had), else the
	// new value's observation is dropped and counted.
	MaxBreakersPerRule int
	// MaxStateSeriesPerRule caps the per-value breakers of one rule
	// exported as state gauge series (default 100). Only rules with
	// detailed_metric export them, since their resource label carries
	// request values (each shown as descriptors.Rule.MetricKey shows
	// values); the others appear in Snapshot (the /breakers page) only.
	MaxStateSeriesPerRule int
}

// Registry holds the breakers of a rule set and routes observations to
// them. It implements the Breakers contract of package service.
type Registry struct {
	clock    window.Clock
	log      *slog.Logger
	mapping  Mapping
	metrics  *metrics
	maxPer   int
	maxGauge int

	swap      sync.Mutex // serialises SetRules
	table     atomic.Pointer[table]
	dedupe    *dedupe    // pairs the two Envoy feeds' reports of one request
	overrides *overrides // operators' manual control, by rule ID
}

type table struct {
	set    *descriptors.Set
	byRule map[*descriptors.Rule]*ruleBreakers
	byID   map[string]*ruleBreakers
	list   []*ruleBreakers // in rule order
}

// ruleBreakers are the breakers of one breaker rule: a single one when its
// path is all exact values, else one per distinct value of its value-less
// and wildcard entries.
type ruleBreakers struct {
	reg     *Registry
	rule    *descriptors.Rule // the rule as first loaded: its AppendKey keys the breakers
	id      string
	domain  string
	path    []descriptors.Entry
	varying bool // a breaker per distinct value of value-less and unshared wildcard entries
	cfg     Config
	hist    prometheus.Observer
	single  *Breaker

	// byKey maps breaker keys (Rule.AppendKey) to breakers. It is copied on
	// write under mu (new distinct values are rare and capped), so the
	// lookup on the request path takes no lock.
	byKey   atomic.Pointer[map[string]*Breaker]
	mu      sync.Mutex
	gauges  int                 // breakers with a state series; mu held
	entries map[*Breaker]string // resource of each breaker; mu held
}

// NewRegistry returns a registry with no rules.
func NewRegistry(opts Options) (*Registry, error) {
	r := &Registry{
		clock:    opts.Clock,
		log:      opts.Logger,
		mapping:  opts.Mapping.withDefaults(),
		maxPer:   opts.MaxBreakersPerRule,
		maxGauge: opts.MaxStateSeriesPerRule,
		dedupe:   newDedupe(),
	}
	if r.clock == nil {
		r.clock = window.NewMonotonicClock()
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.maxPer <= 0 {
		r.maxPer = 1000
	}
	if r.maxGauge <= 0 {
		r.maxGauge = 100
	}
	var err error
	if r.metrics, err = newMetrics(opts.Metrics, func() { r.AdvanceAt(r.clock.Now()) }); err != nil {
		return nil, err
	}
	r.overrides = newOverrides(r.metrics.override)
	r.table.Store(&table{})
	return r, nil
}

// AdvanceAt applies to every breaker the transitions due by now (see
// Breaker.AdvanceAt).
func (r *Registry) AdvanceAt(now time.Duration) {
	for _, rb := range r.table.Load().list {
		if rb.single != nil {
			rb.single.AdvanceAt(now)
			continue
		}
		for _, b := range *rb.byKey.Load() {
			b.AdvanceAt(now)
		}
	}
}

// Clock returns the registry's time source.
func (r *Registry) Clock() window.Clock { return r.clock }

// Mapping returns the registry's observation-to-entries mapping.
func (r *Registry) Mapping() Mapping { return r.mapping }

// CheckRules reports what SetRules would skip in set: a breaker rule whose
// ID another breaker rule already has (possible only in a Set not built by
// the descriptors loader, which refuses duplicate IDs). nil means SetRules
// takes every breaker of set.
func (r *Registry) CheckRules(set *descriptors.Set) error {
	var errs []error
	seen := map[string]bool{}
	for _, rule := range set.Rules() {
		if rule.Breaker == nil {
			continue
		}
		if seen[rule.ID] {
			errs = append(errs, fmt.Errorf("%s:%d: duplicate rule id %s", rule.File, rule.Line, rule.ID))
		}
		seen[rule.ID] = true
	}
	return errors.Join(errs...)
}

// SetRules replaces the breaker rules with those of set that carry a
// Breaker (call it with every newly loaded set). A rule whose ID, path,
// share_threshold and breaker configuration are unchanged keeps its
// breakers and their state; the breakers of other rules start closed. The
// blocks come validated from the rule loader; what CheckRules reports (a
// duplicate rule ID) is skipped and returned as the error, the other rules
// take effect.
func (r *Registry) SetRules(set *descriptors.Set) error {
	r.swap.Lock()
	defer r.swap.Unlock()
	old := r.table.Load()
	next := &table{set: set, byRule: make(map[*descriptors.Rule]*ruleBreakers), byID: make(map[string]*ruleBreakers)}
	var errs []error
	for _, rule := range set.Rules() {
		if rule.Breaker == nil {
			continue
		}
		cfg := Config{Breaker: *rule.Breaker}
		rb := old.byID[rule.ID]
		if rb == nil || !rb.cfg.Equal(cfg) || !slices.Equal(rb.path, rule.Path) || rb.rule.ShareThreshold != rule.ShareThreshold {
			rb = r.newRuleBreakers(rule, cfg)
		}
		if _, dup := next.byID[rule.ID]; dup {
			errs = append(errs, fmt.Errorf("%s:%d: duplicate rule id %s", rule.File, rule.Line, rule.ID))
			continue
		}
		next.byRule[rule] = rb
		next.byID[rule.ID] = rb
		next.list = append(next.list, rb)
	}
	for _, rb := range old.list {
		if nb := next.byID[rb.id]; nb != rb {
			r.metrics.forget(rb.id, nb == nil)
		}
	}
	for _, rb := range next.list {
		if old.byID[rb.id] != rb && rb.single != nil {
			r.metrics.setState(rb.id, "", Closed)
		}
	}
	r.table.Store(next)
	return errors.Join(errs...)
}

func (r *Registry) newRuleBreakers(rule *descriptors.Rule, cfg Config) *ruleBreakers {
	rb := &ruleBreakers{
		reg:    r,
		rule:   rule,
		id:     rule.ID,
		domain: rule.Domain,
		path:   slices.Clone(rule.Path),
		cfg:    cfg,
		hist:   r.metrics.responseTime.WithLabelValues(rule.ID),
	}
	rb.varying = rule.Varies()
	if !rb.varying {
		rb.single = New(cfg, rb.onChange("", true))
	} else {
		rb.byKey.Store(&map[string]*Breaker{})
		rb.entries = make(map[*Breaker]string)
	}
	return rb
}

// onChange returns the transition hook of one breaker of rb: one log line,
// the transition counter and, if labelled, the state gauge.
func (rb *ruleBreakers) onChange(resource string, labelled bool) func(Transition) {
	return func(t Transition) {
		rb.reg.log.Info("circuit breaker state change",
			"rule", rb.id, "resource", resource, "from", t.From.String(), "to", t.To.String(),
			"reason", t.Reason, "failed", t.Failed, "total", t.Total)
		rb.reg.metrics.transition(rb.id, t.From, t.To)
		if labelled {
			rb.reg.metrics.setState(rb.id, resource, t.To)
		}
	}
}

// lookup returns the breaker for values (aligned with rb.path), or nil.
func (rb *ruleBreakers) lookup(values []descriptors.Entry) *Breaker {
	if rb.single != nil {
		return rb.single
	}
	var buf [256]byte
	k := rb.rule.AppendKey(buf[:0], values)[len(rb.rule.ID):] // the ID is the same for the whole map
	return (*rb.byKey.Load())[string(k)]
}

// get returns the breaker for values, creating it if the rule's cap allows;
// nil when it does not.
func (rb *ruleBreakers) get(values []descriptors.Entry) *Breaker {
	if b := rb.lookup(values); b != nil {
		return b
	}
	var buf [256]byte
	k := rb.rule.AppendKey(buf[:0], values)[len(rb.rule.ID):] // the ID is the same for the whole map
	rb.mu.Lock()
	defer rb.mu.Unlock()
	old := *rb.byKey.Load()
	if b := old[string(k)]; b != nil {
		return b
	}
	victim := ""
	if len(old) >= rb.reg.maxPer {
		var ok bool
		if victim, ok = rb.idlest(old); !ok {
			rb.reg.metrics.dropped.WithLabelValues(rb.id).Inc()
			return nil
		}
		rb.reclaim(old[victim])
	}
	resource := rb.resource(values)
	labelled := rb.rule.DetailedMetric && rb.gauges < rb.reg.maxGauge
	if labelled {
		rb.gauges++
		rb.reg.metrics.setState(rb.id, resource, Closed)
	}
	b := New(rb.cfg, rb.onChange(resource, labelled))
	b.seen.Store(int64(rb.reg.clock.Now()))
	next := make(map[string]*Breaker, len(old)+1)
	for key, ob := range old {
		if key != victim || victim == "" {
			next[key] = ob
		}
	}
	next[string(k)] = b
	rb.byKey.Store(&next)
	rb.entries[b] = resource
	return b
}

// resource names the breaker of values for logs, metrics and Snapshot: the
// varying entries as key=value, values shown as in metric keys (valid
// UTF-8, a long one by its digest).
func (rb *ruleBreakers) resource(values []descriptors.Entry) string {
	var resource strings.Builder
	for i := range rb.path {
		if i < len(values) && rb.rule.VariesAt(i) {
			if resource.Len() > 0 {
				resource.WriteByte(',')
			}
			resource.WriteString(descriptors.MetricValue(values[i].Key) + "=" + descriptors.MetricValue(values[i].Value))
		}
	}
	return resource.String()
}

// idlest returns the key of the breaker of m to reclaim: the closed one
// observed least recently, or, when every breaker is open or half-open,
// the abandoned one observed least recently; false if there is neither.
// rb.mu is held.
func (rb *ruleBreakers) idlest(m map[string]*Breaker) (string, bool) {
	now := rb.reg.clock.Now()
	key, found, closed := "", false, false
	var oldest int64
	for k, b := range m {
		isClosed := b.State() == Closed
		if !isClosed && (closed || !b.abandoned(now)) {
			continue
		}
		if seen := b.seen.Load(); !found || (isClosed && !closed) || seen < oldest {
			key, oldest, found, closed = k, seen, true, isClosed
		}
	}
	return key, found
}

// reclaim forgets b, whose slot a new value takes: its state series, if it
// had one, and its resource name. rb.mu is held.
func (rb *ruleBreakers) reclaim(b *Breaker) {
	if rb.rule.DetailedMetric {
		if rb.reg.metrics.deleteState(rb.id, rb.entries[b]) {
			rb.gauges--
		}
	}
	delete(rb.entries, b)
	rb.reg.metrics.reclaimed.WithLabelValues(rb.id).Inc()
}

// Allow reports whether the breaker of rule for the request's entries
// (which matched rule, one per path entry) admits a request now and, if
// not, how long until it may. A rule without a breaker, or a distinct value
// never observed, always passes. In the closed state this costs a map
// lookup and an atomic load; the clock is read only when the breaker is
// not closed.
func (r *Registry) Allow(rule *descriptors.Rule, entries []descriptors.Entry) (ok bool, retryAfter time.Duration) {
	ok, _, retryAfter = r.AllowProbe(rule, entries)
	return ok, retryAfter
}

// AllowProbe is Allow that also returns, for a request a half-open breaker
// admits as its probe, the probe's id (0 otherwise): the rate-limit service
// sends it in envoyhdr.ProbeHeader, so that the request's reported outcome is
// matched to the probe exactly (see the package documentation).
func (r *Registry) AllowProbe(rule *descriptors.Rule, entries []descriptors.Entry) (ok bool, probe uint64, retryAfter time.Duration) {
	rb, b := r.breakerOf(rule, entries)
	if rb != nil && r.overrides.any.Load() {
		if ok, wait, decided := r.overridden(rb, b, entries); decided {
			return ok, 0, wait
		}
	}
	if b == nil || b.Steady() {
		return true, 0, 0
	}
	return b.AllowProbeAt(r.clock.Now())
}

// AllowAt is Allow at the given time.
func (r *Registry) AllowAt(rule *descriptors.Rule, entries []descriptors.Entry, now time.Duration) (ok bool, retryAfter time.Duration) {
	rb, b := r.breakerOf(rule, entries)
	if rb != nil {
		if ok, wait, decided := r.overridden(rb, b, entries); decided {
			return ok, wait
		}
	}
	if b == nil {
		return true, 0
	}
	return b.AllowAt(now)
}

// breakerOf returns the breakers of rule and its breaker for entries (nil
// when none was created for them), or nil, nil.
func (r *Registry) breakerOf(rule *descriptors.Rule, entries []descriptors.Entry) (*ruleBreakers, *Breaker) {
	t := r.table.Load()
	rb := t.byRule[rule]
	if rb == nil {
		// A rule of a set not yet passed to SetRules, or of the previous
		// one (a request in flight across a reload): same ID, same breakers.
		if rb = t.byID[rule.ID]; rb == nil {
			return nil, nil
		}
	}
	return rb, rb.lookup(entries)
}
