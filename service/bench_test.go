package service

import (
	"context"
	"strconv"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/leapgate/leapgate/window"
)

// benchRules never refuse during a benchmark: the limits are far above any
// b.N, so every iteration takes the admit-and-record path.
const benchRules = `
domain: bench
descriptors:
  - key: k
    value: hot
    rate_limit: {unit: second, requests_per_unit: 4000000000}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 4000000000}
  - key: path
    value: /api
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 4000000000}
`

// BenchmarkShouldRateLimit measures ShouldRateLimit in-process on the
// in-memory window.Store with the real monotonic clock:
//   - one-descriptor: one exact rule, one hot key (the common case);
//   - three-descriptors: an exact rule, a value-less rule and a nested
//     value-less rule in one request;
//   - 100k-keys: a value-less rule over 100,000 distinct values, cycled;
//   - one-descriptor-parallel: the hot key from GOMAXPROCS goroutines.
func BenchmarkShouldRateLimit(b *testing.B) {
	const nKeys = 100_000
	keyReqs := make([]*rlsv3.RateLimitRequest, nKeys)
	for i := range keyReqs {
		keyReqs[i] = req("bench", desc("user", "u"+strconv.Itoa(i)))
	}
	cases := []struct {
		name string
		reqs []*rlsv3.RateLimitRequest
	}{
		{"one-descriptor", []*rlsv3.RateLimitRequest{req("bench", desc("k", "hot"))}},
		{"three-descriptors", []*rlsv3.RateLimitRequest{req("bench",
			desc("k", "hot"), desc("user", "alice"), desc("path", "/api", "method", "GET"))}},
		{"100k-keys", keyReqs},
	}
	b.Run("one-descriptor-parallel", func(b *testing.B) {
		svc, err := New(Options{Limiter: window.NewStore(window.StoreOptions{}), Registry: prometheus.NewRegistry()})
		if err != nil {
			b.Fatal(err)
		}
		svc.SetRules(mustParse(b, benchRules))
		r := req("bench", desc("k", "hot"))
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if resp, err := svc.ShouldRateLimit(context.Background(), r); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
					b.Errorf("%v %v", resp, err)
					return
				}
			}
		})
	})
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			svc, err := New(Options{
				Limiter:  window.NewStore(window.StoreOptions{}),
				Registry: prometheus.NewRegistry(),
			})
			if err != nil {
				b.Fatal(err)
			}
			svc.SetRules(mustParse(b, benchRules))
			ctx := context.Background()
			// Warm up: create every counter so the loop measures steady state.
			for _, r := range c.reqs {
				if _, err := svc.ShouldRateLimit(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				resp, err := svc.ShouldRateLimit(ctx, c.reqs[i])
				if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
					b.Fatalf("%v %v", resp, err)
				}
				if i++; i == len(c.reqs) {
					i = 0
				}
			}
		})
	}
}
