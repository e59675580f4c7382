package breaker

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leapgate/leapgate/descriptors"
)

// Override is an operator's manual control of a breaker, set on the debug
// listener (OverrideHandler). It is kept by rule ID and resource, so it
// survives rule reloads, and shows in Snapshot and in the
// leapgate_breaker_override gauge.
type Override uint8

const (
	// Auto: no override, the breaker decides.
	Auto Override = iota
	// ForceOpen refuses every request the breaker guards.
	ForceOpen
	// ForceClosed admits every request and ignores observations: the
	// breaker stays as it was.
	ForceClosed
	// Disabled admits every request (no probes are taken) while
	// observations still drive the state and metrics: a dry run.
	Disabled
)

var overrideNames = [...]string{Auto: "auto", ForceOpen: "force_open", ForceClosed: "force_closed", Disabled: "disabled"}

func (o Override) String() string {
	if int(o) < len(overrideNames) {
		return overrideNames[o]
	}
	return fmt.Sprintf("Override(%d)", o)
}

// ParseOverride reads the name String gives.
func ParseOverride(s string) (Override, bool) {
	i := slices.Index(overrideNames[:], s)
	return Override(max(i, 0)), i >= 0
}

// overrideKey names what an override applies to: a whole rule (resource
// "") or one breaker of a per-value rule (its Snapshot resource).
type overrideKey struct{ rule, resource string }

// overrides is the registry's set of overrides, copied on write.
type overrides struct {
	mu    sync.Mutex // serialises writers
	set   atomic.Pointer[map[overrideKey]Override]
	any   atomic.Bool
	gauge *prometheus.GaugeVec // rule, resource, mode
}

func newOverrides(gauge *prometheus.GaugeVec) *overrides {
	o := &overrides{gauge: gauge}
	o.set.Store(&map[overrideKey]Override{})
	return o
}

// of returns the override of breaker resource of rule: the breaker's own,
// else the rule's, else Auto. resource is called only when overrides exist.
func (o *overrides) of(rule string, resource func() string) Override {
	if !o.any.Load() {
		return Auto
	}
	m := *o.set.Load()
	if len(m) == 0 {
		return Auto
	}
	if res := resource(); res != "" {
		if v, ok := m[overrideKey{rule, res}]; ok {
			return v
		}
	}
	return m[overrideKey{rule, ""}]
}

// SetOverride sets (or, with Auto, removes) the override of rule, or of
// one of its per-value breakers when resource is not empty (as Snapshot
// names it, e.g. "destination_cluster=orders"). The rule need not be loaded:
// the override applies once it is.
func (r *Registry) SetOverride(rule, resource string, mode Override) {
	o := r.overrides
	o.mu.Lock()
	defer o.mu.Unlock()
	old := *o.set.Load()
	next := make(map[overrideKey]Override, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	k := overrideKey{rule, resource}
	if prev, ok := next[k]; ok {
		o.gauge.DeleteLabelValues(rule, resource, prev.String())
	}
	if mode == Auto {
		delete(next, k)
	} else {
		next[k] = mode
		o.gauge.WithLabelValues(rule, resource, mode.String()).Set(1)
	}
	o.set.Store(&next)
	o.any.Store(len(next) > 0)
	r.log.Info("circuit breaker override", "rule", rule, "resource", resource, "mode", mode.String())
}

// OverrideEntry is one override as OverrideHandler lists it.
type OverrideEntry struct {
	Rule     string `json:"rule"`
	Resource string `json:"resource,omitempty"`
	Mode     string `json:"mode"`
}

// Overrides lists the overrides set, by rule and resource.
func (r *Registry) Overrides() []OverrideEntry {
	out := []OverrideEntry{}
	for k, v := range *r.overrides.set.Load() {
		out = append(out, OverrideEntry{Rule: k.rule, Resource: k.resource, Mode: v.String()})
	}
	slices.SortFunc(out, func(a, b OverrideEntry) int {
		return strings.Compare(a.Rule+"\x00"+a.Resource, b.Rule+"\x00"+b.Resource)
	})
	return out
}

// OverrideHandler serves the overrides: GET lists them as JSON
// {"overrides": [...]}; POST with form or query values rule, resource
// (optional) and mode (force_open, force_closed, disabled or auto) sets
// one and answers the list. It belongs on the loopback debug listener.
func (r *Registry) OverrideHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch req.Method {
		case http.MethodGet, http.MethodHead:
		case http.MethodPost:
			rule, mode := req.FormValue("rule"), req.FormValue("mode")
			m, ok := ParseOverride(mode)
			if rule == "" || !ok {
				http.Error(w, "want rule=<rule id>, mode=force_open|force_closed|disabled|auto and optionally resource=<key=value,...>", http.StatusBadRequest)
				return
			}
			r.SetOverride(rule, req.FormValue("resource"), m)
		default:
			w.Header().Set("Allow", "GET, HEAD, POST")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		writeJSON(w, struct {
			Overrides []OverrideEntry `json:"overrides"`
		}{Overrides: r.Overrides()})
	})
}

// overridden applies the override of rb's breaker b (nil: none created for
// values yet) for a request: decided reports whether it answered.
func (r *Registry) overridden(rb *ruleBreakers, b *Breaker, values []descriptors.Entry) (ok bool, retryAfter time.Duration, decided bool) {
	switch r.overrides.of(rb.id, func() string { return rb.resourceOf(b, values) }) {
	case ForceOpen:
		return false, rb.cfg.OpenDuration, true
	case ForceClosed, Disabled:
		return true, 0, true
	}
	return false, 0, false
}

// resourceOf names b (or, without one, the breaker values would have).
func (rb *ruleBreakers) resourceOf(b *Breaker, values []descriptors.Entry) string {
	if rb.single != nil {
		return ""
	}
	if b != nil {
		rb.mu.Lock()
		defer rb.mu.Unlock()
		if res, ok := rb.entries[b]; ok {
			return res
		}
	}
	return rb.resource(values)
}
