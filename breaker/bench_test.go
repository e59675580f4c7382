package breaker

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkBreakerAllowClosed is the cost of one closed breaker's check.
func BenchmarkBreakerAllowClosed(b *testing.B) {
	br := New(slowConfig(b), nil)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		br.AllowAt(time.Duration(i))
	}
}

// BenchmarkRegistryAllowClosed is what Breakers.Allow adds to
// ShouldRateLimit for a matched breaker rule: the single breaker of an
// exact rule, and the per-value breaker of a value-less rule.
func BenchmarkRegistryAllowClosed(b *testing.B) {
	r, _, set := newTestRegistry(b, rulesYAML, Options{Metrics: prometheus.NewRegistry()})
	for _, bc := range []struct {
		name string
		kv   []string
	}{
		{"exact", []string{"destination_cluster", "orders"}},
		{"per_value", []string{"destination_cluster", "inventory"}},
		{"two_levels", []string{"route", "checkout", "destination_cluster", "backend"}},
	} {
		es := entries(bc.kv...)
		rule := set.Match("breaker", es)
		if rule == nil || rule.Breaker == nil {
			b.Fatalf("%v matched no breaker rule", bc.kv)
		}
		r.Observe(Observation{Route: "checkout", Cluster: es[len(es)-1].Value, Status: 200, ResponseTime: ms})
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if ok, _ := r.Allow(rule, es); !ok {
					b.Fatal("refused")
				}
			}
		})
	}
}

// BenchmarkRegistryAllowClosedParallel is the same check from every core.
func BenchmarkRegistryAllowClosedParallel(b *testing.B) {
	r, _, set := newTestRegistry(b, rulesYAML, Options{})
	es := entries("destination_cluster", "orders")
	rule := set.Match("breaker", es)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r.Allow(rule, es)
		}
	})
}

// BenchmarkObserve is one observation routed to its breakers and recorded,
// metrics included.
func BenchmarkObserve(b *testing.B) {
	r, clock, _ := newTestRegistry(b, rulesYAML, Options{Metrics: prometheus.NewRegistry()})
	for _, bc := range []struct {
		name string
		obs  Observation
	}{
		{"one_breaker", Observation{Cluster: "orders", Status: 200, ResponseTime: 20 * ms, Source: SourceALS}},
		{"two_breakers", Observation{Route: "checkout", Cluster: "backend", Status: 200, ResponseTime: 20 * ms, Source: SourceALS}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				clock.Advance(time.Microsecond)
				r.Observe(bc.obs)
			}
		})
	}
}

// BenchmarkObserveParallel is concurrent observations of one breaker.
func BenchmarkObserveParallel(b *testing.B) {
	r, _, _ := newTestRegistry(b, rulesYAML, Options{Metrics: prometheus.NewRegistry()})
	obs := Observation{Cluster: "orders", Status: 200, ResponseTime: 20 * ms, Source: SourceALS}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r.Observe(obs)
		}
	})
}

// BenchmarkBreakerObserveByStrategy is one observation recorded by a
// breaker and its threshold checked, for each strategy (the p99 strategy
// against the ratio one it shares its two counters per bucket with).
func BenchmarkBreakerObserveByStrategy(b *testing.B) {
	for _, bc := range []struct{ name, block string }{
		{"slow_request_ratio", "strategy: slow_request_ratio, threshold: 0.5, max_response_time: 100ms, min_requests: 1000000"},
		{"latency_percentile_p99", "strategy: latency_percentile, threshold: 0.99, max_response_time: 100ms, min_requests: 1000000"},
		{"error_ratio", "strategy: error_ratio, threshold: 0.5, min_requests: 1000000"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			br := New(mustConfig(b, bc.block), nil)
			o := Outcome{ResponseTime: 20 * ms, Status: 200}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				br.ObserveAt(time.Duration(i)*time.Microsecond, o)
			}
		})
	}
}
