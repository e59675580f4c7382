package rlqs

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
)

// Allocation is one pool (a limit's counter key) as the debug page lists
// it.
type Allocation struct {
	Domain string `json:"domain"`
	Rule   string `json:"rule"`
	// Limit is the limit's requests per second; Committed the most the
	// assignments in force may admit per window, over the limit's requests
	// per window.
	Limit     float64  `json:"limit_per_second"`
	Committed float64  `json:"committed_share"`
	Clients   []Client `json:"clients"`
}

// Client is one bucket of one stream in an Allocation.
type Client struct {
	Stream uint64            `json:"stream"`
	Bucket map[string]string `json:"bucket"`
	// Demand is the measured offered rate, -1 while unknown.
	Demand float64 `json:"demand_per_second"`
	// Assigned is the rate of its current assignment; Burst its max_tokens.
	Assigned float64 `json:"assigned_per_second"`
	Burst    uint32  `json:"burst"`
	Shadow   bool    `json:"shadow,omitempty"`
	// Closed marks the bucket of a closed stream, kept until its
	// assignment expires.
	Closed bool `json:"closed,omitempty"`
}

// Allocations returns every pool with its buckets, sorted by domain and
// rule.
func (s *Server) Allocations() []Allocation {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Allocation, 0, len(s.pools))
	for _, p := range s.pools {
		a := Allocation{Domain: p.domain, Rule: p.ruleID, Limit: p.limit / p.window, Committed: p.committed / p.limit}
		for b := range p.members {
			d := b.demand
			if !b.known {
				d = -1
			}
			a.Clients = append(a.Clients, Client{Stream: b.stream.id, Bucket: b.id.GetBucket(), Demand: d,
				Assigned: b.current.rate(), Burst: b.current.burst, Shadow: b.shadow, Closed: b.stream.closed})
		}
		slices.SortFunc(a.Clients, func(x, y Client) int { return int(x.Stream) - int(y.Stream) })
		out = append(out, a)
	}
	slices.SortFunc(out, func(x, y Allocation) int {
		if c := strings.Compare(x.Domain, y.Domain); c != 0 {
			return c
		}
		return strings.Compare(x.Rule, y.Rule)
	})
	return out
}

// Handler serves Allocations as JSON (the debug listener's /rlqs).
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(s.Allocations())
	})
}
