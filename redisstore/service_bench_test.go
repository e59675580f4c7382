package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/internal/ruletest"
	"github.com/leapgate/leapgate/service"
)

const benchRules = `domain: bench
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: path
    descriptors:
      - key: method
        rate_limit: {unit: second, requests_per_unit: 1000000000}
`

func benchRequest(descs ...[]string) *rlsv3.RateLimitRequest {
	r := &rlsv3.RateLimitRequest{Domain: "bench"}
	for _, kv := range descs {
		d := &rlcommonv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &rlcommonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		r.Descriptors = append(r.Descriptors, d)
	}
	return r
}

// BenchmarkShouldRateLimitRedis measures the whole rate-limit service
// (service.ShouldRateLimit, without gRPC transport) on the Redis backend,
// from concurrent goroutines: 1 and 3 descriptors, one hot key or 100k
// keys (user values). It reports p99 latency and round trips per call.
//
//	go test -run '^$' -bench BenchmarkShouldRateLimitRedis -benchmem -benchtime 20000x ./redisstore/
func BenchmarkShouldRateLimitRedis(b *testing.B) {
	r := redistest.Start(b)
	st := settingsFor(r.Addr())
	st.PoolSize = 16
	store := newTestStore(b, st, Options{HealthInterval: time.Hour})
	waitHealthy(b, store)
	rt := countRoundTrips(store)
	set := ruletest.Parse(b, descriptors.Options{}, benchRules)
	svc, err := service.New(service.Options{Limiter: store, Registry: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	svc.SetRules(set)

	const nKeys = 100_000
	for _, descriptors := range []int{1, 3} {
		for _, keys := range []int{1, nKeys} {
			reqs := make([]*rlsv3.RateLimitRequest, keys)
			for i := range reqs {
				user := []string{"user", fmt.Sprint("u", i)}
				if keys == 1 {
					user = []string{"k", "hot"}
				}
				if descriptors == 1 {
					reqs[i] = benchRequest(user)
				} else {
					reqs[i] = benchRequest(user, []string{"k", "other"}, []string{"path", "/api", "method", "GET"})
				}
			}
			b.Run(fmt.Sprintf("descriptors=%d/keys=%d", descriptors, keys), func(b *testing.B) {
				runTimed(b, rt, func() func(ctx context.Context, i int) error {
					return func(ctx context.Context, i int) error {
						req := reqs[i%len(reqs)]
						resp, err := svc.ShouldRateLimit(ctx, req)
						if err == nil && resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
							err = fmt.Errorf("answer %v, want OK", resp)
						}
						return err
					}
				})
			})
		}
	}
}
