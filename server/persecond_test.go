package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/internal/redistest"
)

const perSecondRules = `domain: split
descriptors:
  - key: fast
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: slow
    rate_limit: {unit: minute, requests_per_unit: 3}
`

// redisKeys lists the keys held by the redis-server at addr.
func redisKeys(t *testing.T, addr string) []string {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	keys, err := c.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestRedisPerSecond: with REDIS_PERSECOND the windows of one second live
// in the second Redis and the others in the main one, and a request is
// still all-or-nothing across the two: refused by its per-second limit, it
// records nothing in the main Redis.
func TestRedisPerSecond(t *testing.T) {
	main, perSecond := redistest.Start(t), redistest.Start(t)
	ts := start(t, map[string]string{"rules.yaml": perSecondRules}, func(s *config.Settings) {
		s.BackendType = config.BackendRedis
		s.Redis.URL, s.Redis.Timeout = main.Addr(), 2*time.Second
		s.RedisPerSecond.Enabled, s.RedisPerSecond.URL, s.RedisPerSecond.Timeout = true, perSecond.Addr(), 2*time.Second
	})
	cc := ts.conn(t)
	eventually(t, "SERVING with both Redis up", func() bool {
		return healthStatus(t, cc, "") == healthpb.HealthCheckResponse_SERVING
	})
	client := ts.rls(t)
	both := request("split", []string{"fast", "x"}, []string{"slow", "x"})
	ctx := context.Background()
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := client.ShouldRateLimit(ctx, both)
		if err != nil || resp.GetOverallCode() != want {
			t.Fatalf("call %d: %v %v, want %v", i, resp, err, want)
		}
	}
	mainKeys, fastKeys := redisKeys(t, main.Addr()), redisKeys(t, perSecond.Addr())
	if len(mainKeys) != 1 || !strings.Contains(mainKeys[0], "slow") || len(fastKeys) != 1 || !strings.Contains(fastKeys[0], "fast") {
		t.Errorf("main Redis holds %q, per-second Redis %q; want the minute window in main, the second window in per-second", mainKeys, fastKeys)
	}
	// The third call was refused by the per-second limit: the minute
	// limit was not charged for it, so one hit of three is left.
	resp, err := client.ShouldRateLimit(ctx, request("split", []string{"slow", "x"}))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 0 {
		t.Errorf("minute limit after a refused request: %v %v, want OK with 0 remaining (3 - 2 admitted - this one)", resp, err)
	}
	// The per-second Redis down: failure mode error is NOT_SERVING.
	perSecond.Kill()
	eventually(t, "NOT_SERVING with the per-second Redis down", func() bool {
		return healthStatus(t, cc, "") == healthpb.HealthCheckResponse_NOT_SERVING
	})
	if got := metricValue(t, ts, `leapgate_redis_up{redis="persecond"}`); got != "0" {
		t.Errorf(`leapgate_redis_up{redis="persecond"} = %q, want 0`, got)
	}
}
