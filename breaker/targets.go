package breaker

import (
	"slices"
	"time"

	"github.com/leapgate/leapgate/descriptors"
)

// Target is one breaker an observation feeds.
type Target struct {
	rb *ruleBreakers
	b  *Breaker
}

// RuleID returns the ID of the target's rule.
func (t Target) RuleID() string { return t.rb.id }

// Breaker returns the target's breaker.
func (t Target) Breaker() *Breaker { return t.b }

// Targets appends to dst the breakers that observations like obs feed (its
// Route, Cluster and Headers are used): those of every breaker rule whose
// path entries all find an entry of obs (see Mapping) with the same key and
// a matching value (exact, wildcard, or any for a value-less key), and
// which the rule set's Match would pick for those entries taken in the
// rule's path order (so an exact sibling shadows a value-less rule, as it
// does for rate-limit requests). The order of the observation's entries does
// not matter, as an observation has each key once. Breakers of distinct
// values are created on first use.
func (r *Registry) Targets(dst []Target, obs *Observation) []Target {
	t := r.table.Load()
	if len(t.list) == 0 {
		return dst
	}
	var ebuf [8]descriptors.Entry
	entries := r.mapping.entries(ebuf[:0], obs)
	var vbuf [8]descriptors.Entry
rules:
	for _, rb := range t.list {
		values := vbuf[:0]
		for _, p := range rb.path {
			i := slices.IndexFunc(entries, func(e descriptors.Entry) bool { return e.Key == p.Key })
			if i < 0 || !matchValue(p.Value, entries[i].Value) {
				continue rules
			}
			values = append(values, entries[i])
		}
		if m := t.set.Match(rb.domain, values); t.byRule[m] != rb {
			continue // a more specific sibling answers these requests
		}
		if b := rb.get(values); b != nil {
			dst = append(dst, Target{rb: rb, b: b})
		}
	}
	return dst
}

// Observe feeds obs to every breaker it matches (see Targets).
func (r *Registry) Observe(obs Observation) { r.ObserveAt(obs, r.clock.Now()) }

// ObserveAt is Observe at the given time.
func (r *Registry) ObserveAt(obs Observation, now time.Duration) {
	var buf [8]Target
	r.ObserveTargetsAt(r.Targets(buf[:0], &obs), obs, now)
}

// ObserveTargets feeds obs to the given targets, as resolved by Targets,
// and counts it by source.
func (r *Registry) ObserveTargets(targets []Target, obs Observation) {
	r.ObserveTargetsAt(targets, obs, r.clock.Now())
}

// ObserveTargetsAt is ObserveTargets at the given time.
func (r *Registry) ObserveTargetsAt(targets []Target, obs Observation, now time.Duration) {
	r.metrics.observed(obs.Source)
	if r.dedupe.duplicate(obs.RequestID, obs.Source) {
		r.metrics.duplicates.Inc()
		return
	}
	o := obs.outcome()
	for _, t := range targets {
		if !o.Aborted && !o.InFlight {
			t.rb.hist.Observe(o.ResponseTime.Seconds())
		}
		if r.overrides.of(t.rb.id, func() string { return t.rb.resourceOf(t.b, nil) }) == ForceClosed {
			continue // pinned: observations change nothing
		}
		t.b.ObserveAt(now, o)
	}
}

// AllowTargets reports whether every target admits a request now and, if
// not, the longest wait among those that refuse; probes are the ids of the
// probes half-open breakers took for the admitted request (see
// envoyhdr.ProbeHeader), which its observation should carry. An open breaker refuses
// before any half-open one is asked, so no probe is taken for a request
// that is refused anyway; a half-open breaker that admits a probe while
// another half-open one refuses keeps the slot taken until the probe times
// out (ProbeTimeout) and reopens it.
func (r *Registry) AllowTargets(targets []Target) (ok bool, retryAfter time.Duration, probes []uint64) {
	if r.overrides.any.Load() {
		return r.AllowTargetsAt(targets, r.clock.Now())
	}
	for _, t := range targets {
		if !t.b.Steady() {
			return r.AllowTargetsAt(targets, r.clock.Now())
		}
	}
	return true, 0, nil
}

// AllowTargetsAt is AllowTargets at the given time.
func (r *Registry) AllowTargetsAt(targets []Target, now time.Duration) (ok bool, retryAfter time.Duration, probes []uint64) {
	if r.overrides.any.Load() {
		// Overrides first: a forced-open breaker refuses; forced-closed
		// and disabled ones are left out of the decision.
		kept := make([]Target, 0, len(targets))
		for _, t := range targets {
			allowed, wait, decided := r.overridden(t.rb, t.b, nil)
			switch {
			case !decided:
				kept = append(kept, t)
			case !allowed:
				ok, retryAfter = false, max(retryAfter, wait)
			}
		}
		if retryAfter > 0 {
			return false, retryAfter, nil
		}
		targets = kept
	}
	for _, t := range targets { // an open breaker refuses without taking probes of the others
		if State(t.b.state.Load()) == Open {
			if until := time.Duration(t.b.until.Load()); now < until {
				retryAfter = max(retryAfter, until-now)
			}
		}
	}
	if retryAfter > 0 {
		return false, retryAfter, nil
	}
	ok = true
	for _, t := range targets {
		if t.b.Steady() {
			continue
		}
		allowed, id, wait := t.b.AllowProbeAt(now)
		if !allowed {
			ok, retryAfter = false, max(retryAfter, wait)
		} else if id != 0 {
			probes = append(probes, id)
		}
	}
	if !ok {
		probes = nil
	}
	return ok, retryAfter, probes
}
