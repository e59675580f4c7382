package breaker

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Snapshot describes one breaker for the /breakers debug endpoint.
type Snapshot struct {
	Rule   string `json:"rule"`
	Domain string `json:"domain"`
	// Resource lists the distinct values of a value-less or wildcard rule's
	// breaker ("key=value,..."); empty for a rule with a single breaker.
	Resource        string  `json:"resource,omitempty"`
	Strategy        string  `json:"strategy"`
	Threshold       float64 `json:"threshold"`
	MaxResponseTime string  `json:"max_response_time,omitempty"`
	MinRequests     uint64  `json:"min_requests"`
	Window          string  `json:"window"`
	Buckets         int     `json:"buckets"`
	OpenDuration    string  `json:"open_duration"`
	HalfOpenProbes  uint32  `json:"half_open_probes"`
	ProbeTimeout    string  `json:"probe_timeout"`
	Stats
	// Ratio is Failed/Total (0 for an empty window).
	Ratio float64 `json:"ratio"`
	// RetryIn is, while open, the time until the breaker half-opens.
	RetryIn string `json:"retry_in,omitempty"`
	// Override is the manual override in force (see Override), if any.
	Override string `json:"override,omitempty"`
}

// Snapshot lists every breaker with its state and window statistics,
// ordered by rule ID and resource, after applying the transitions due by
// now (an open breaker past its open_duration shows as half-open).
func (r *Registry) Snapshot() []Snapshot { return r.SnapshotAt(r.clock.Now()) }

// SnapshotAt is Snapshot at the given time.
func (r *Registry) SnapshotAt(now time.Duration) []Snapshot {
	out := []Snapshot{}
	for _, rb := range r.table.Load().list {
		if rb.single != nil {
			out = append(out, rb.snapshot(now, "", rb.single))
			continue
		}
		rb.mu.Lock()
		for b, resource := range rb.entries {
			out = append(out, rb.snapshot(now, resource, b))
		}
		rb.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b Snapshot) int {
		if c := strings.Compare(a.Rule, b.Rule); c != 0 {
			return c
		}
		return strings.Compare(a.Resource, b.Resource)
	})
	return out
}

func (rb *ruleBreakers) snapshot(now time.Duration, resource string, b *Breaker) Snapshot {
	c := rb.cfg
	s := Snapshot{
		Rule: rb.id, Domain: rb.domain, Resource: resource,
		Strategy: c.Strategy.String(), Threshold: c.Threshold, MinRequests: c.MinRequests,
		Window: c.Spec.Length().String(), Buckets: c.Spec.Buckets(),
		OpenDuration: c.OpenDuration.String(), HalfOpenProbes: c.HalfOpenProbes, ProbeTimeout: c.ProbeTimeout.String(),
		Stats: b.StatsAt(now),
	}
	if c.MaxResponseTime > 0 {
		s.MaxResponseTime = c.MaxResponseTime.String()
	}
	if s.Total > 0 {
		s.Ratio = float64(s.Failed) / float64(s.Total)
	}
	if s.State == Open {
		s.RetryIn = s.RetryAfter.String()
	}
	if o := rb.reg.overrides.of(rb.id, func() string { return resource }); o != Auto {
		s.Override = o.String()
	}
	return s
}

// Handler serves Snapshot as JSON: {"breakers": [...]}.
func (r *Registry) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		writeJSON(w, struct {
			Breakers []Snapshot `json:"breakers"`
		}{Breakers: r.Snapshot()})
	})
}

// writeJSON answers v as indented JSON.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
