package service

import (
	"context"
	"sync/atomic"
	"testing"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/leapgate/leapgate/breaker"
	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/ruletest"
	"github.com/leapgate/leapgate/window"
)

const breakerBenchRules = `
domain: bench
descriptors:
  - key: route
    value: checkout
    descriptors:
      - key: destination_cluster
        value: backend
        rate_limit: {unit: second, requests_per_unit: 4000000000}
        circuit_breaker: {strategy: slow_request_ratio, threshold: 0.5, max_response_time: 100ms}
  - key: destination_cluster
    circuit_breaker: {strategy: error_ratio, threshold: 0.5}
`

// BenchmarkShouldRateLimitBreakerCost measures what consulting a closed
// breaker adds to ShouldRateLimit (in-process, monotonic clock): the same
// requests with Options.Breakers nil and with a breaker.Registry.
//   - limit_and_breaker: descriptor (route, destination_cluster) with a rate
//     limit and a circuit_breaker;
//   - breaker_only: a value-less destination_cluster rule carrying only a
//     circuit_breaker (one breaker per cluster), the stage-1 descriptor.
func BenchmarkShouldRateLimitBreakerCost(b *testing.B) {
	set := ruletest.Parse(b, descriptors.Options{}, breakerBenchRules)
	mkReq := func(kv ...string) *rlsv3.RateLimitRequest {
		d := &rlcommonv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &rlcommonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		return &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommonv3.RateLimitDescriptor{d}}
	}
	for _, rc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
	}{
		{"limit_and_breaker", mkReq("route", "checkout", "destination_cluster", "backend")},
		{"breaker_only", mkReq("destination_cluster", "orders")},
	} {
		for _, withBreakers := range []bool{false, true} {
			name := rc.name + "/without_breakers"
			if withBreakers {
				name = rc.name + "/with_breakers"
			}
			b.Run(name, func(b *testing.B) {
				clock := window.NewMonotonicClock()
				opts := Options{Limiter: window.NewStore(window.StoreOptions{Clock: clock}), Registry: prometheus.NewRegistry()}
				if withBreakers {
					reg, err := breaker.NewRegistry(breaker.Options{Clock: clock, Metrics: prometheus.NewRegistry()})
					if err != nil {
						b.Fatal(err)
					}
					if err := reg.SetRules(set); err != nil {
						b.Fatal(err)
					}
					reg.Observe(breaker.Observation{Cluster: "orders", Status: 200}) // creates the per-value breaker
					opts.Breakers = reg
				}
				svc, err := New(opts)
				if err != nil {
					b.Fatal(err)
				}
				svc.SetRules(set)
				ctx := context.Background()
				var refused atomic.Int64
				b.ReportAllocs()
				for b.Loop() {
					resp, err := svc.ShouldRateLimit(ctx, rc.req)
					if err != nil {
						b.Fatal(err)
					}
					if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
						refused.Add(1)
					}
				}
				if refused.Load() > 0 {
					b.Fatalf("%d refused", refused.Load())
				}
			})
		}
	}
}
