package server_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/internal/redistest"
)

const redisRules = `domain: shared
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 25
`

// TestRedisBackendTwoReplicas: two servers with BACKEND_TYPE=redis on one
// Redis enforce one limit over gRPC under concurrent load; health follows
// Redis (failure mode error): NOT_SERVING and errors while it is down, back
// to SERVING and answers when it returns.
func TestRedisBackendTwoReplicas(t *testing.T) {
	r := redistest.Start(t)
	mod := func(s *config.Settings) {
		s.BackendType = config.BackendRedis
		s.Redis.URL = r.Addr()
		s.Redis.Timeout = 2 * time.Second // a busy shared test machine
	}
	a := start(t, map[string]string{"rules.yaml": redisRules}, mod)
	b := start(t, map[string]string{"rules.yaml": redisRules}, mod)
	clients := []rlsv3.RateLimitServiceClient{a.rls(t), b.rls(t)}
	for _, ts := range []*testServer{a, b} {
		cc := ts.conn(t)
		eventually(t, "SERVING with Redis up", func() bool {
			return healthStatus(t, cc, "") == healthpb.HealthCheckResponse_SERVING
		})
	}
	ctx := context.Background()

	var ok, over atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				resp, err := clients[w%2].ShouldRateLimit(ctx, request("shared", []string{"user", "carol"}))
				if err != nil {
					t.Error(err)
					return
				}
				switch resp.GetOverallCode() {
				case rlsv3.RateLimitResponse_OK:
					ok.Add(1)
				case rlsv3.RateLimitResponse_OVER_LIMIT:
					over.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 25 || over.Load() != 55 {
		t.Fatalf("two replicas admitted %d and refused %d of 80, want 25 and 55", ok.Load(), over.Load())
	}

	r.Kill()
	// Both replicas must have seen the outage before Redis returns: a
	// replica whose health watcher has not yet noticed would still report
	// SERVING below and make "SERVING after Redis returns" pass too early.
	for _, ts := range []*testServer{a, b} {
		eventually(t, "NOT_SERVING with Redis down", func() bool {
			code, _ := get(t, ts.httpURL("/healthcheck"))
			return code == http.StatusInternalServerError &&
				healthStatus(t, ts.conn(t), "") == healthpb.HealthCheckResponse_NOT_SERVING
		})
	}
	if _, err := clients[0].ShouldRateLimit(ctx, request("shared", []string{"user", "dave"})); err == nil {
		t.Fatal("ShouldRateLimit answered with Redis down in failure mode error")
	}

	r.Restart()
	eventually(t, "SERVING after Redis returns", func() bool {
		code, _ := get(t, b.httpURL("/healthcheck"))
		return code == http.StatusOK
	})
	resp, err := clients[1].ShouldRateLimit(ctx, request("shared", []string{"user", "dave"}))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after recovery: %v %v", resp, err)
	}
	if got := metricValue(t, b, "leapgate_redis_up"); got != "1" {
		t.Errorf("leapgate_redis_up = %q, want 1", got)
	}
}

// TestRedisFailureModeLocal: with REDIS_FAILURE_MODE=local a replica whose
// Redis is down answers from its own in-memory windows: no call fails, and
// the limit still holds there.
func TestRedisFailureModeLocal(t *testing.T) {
	r := redistest.Start(t)
	ts := start(t, map[string]string{"rules.yaml": redisRules}, func(s *config.Settings) {
		s.BackendType = config.BackendRedis
		s.Redis.URL, s.Redis.Timeout = r.Addr(), 2*time.Second
		s.Redis.FailureMode = config.RedisFailLocal
	})
	client := ts.rls(t)
	if resp, err := client.ShouldRateLimit(context.Background(), request("shared", []string{"user", "erin"})); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("with Redis up: %v %v", resp, err)
	}
	r.Kill()
	var ok, over int
	for i := range 30 {
		resp, err := client.ShouldRateLimit(context.Background(), request("shared", []string{"user", "frank"}))
		if err != nil {
			t.Fatalf("call %d with Redis down: %v", i, err)
		}
		switch resp.GetOverallCode() {
		case rlsv3.RateLimitResponse_OK:
			ok++
		case rlsv3.RateLimitResponse_OVER_LIMIT:
			over++
		}
	}
	if ok != 25 || over != 5 {
		t.Errorf("with Redis down, 30 calls: %d OK and %d OVER_LIMIT, want 25 and 5", ok, over)
	}
}
