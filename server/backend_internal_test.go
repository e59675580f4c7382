package server

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/window"
)

// TestBackendCheckerIsTheLimiters: the offline checks of every backend
// type (what check-config uses) are those its limiter makes, for every
// algorithm and every layout that some backend refuses. The Redis backend
// is built without a reachable Redis: neither check needs one.
func TestBackendCheckerIsTheLimiters(t *testing.T) {
	spec := func(length time.Duration, buckets int) window.Spec {
		s, err := window.NewSpec(length, buckets)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	specs := []window.Spec{{}, spec(time.Second, 1), spec(time.Second, 128), spec(time.Minute, 20), spec(time.Microsecond, 1), spec(500*time.Nanosecond, 1)}
	var reqs []window.Request
	for _, a := range append(window.Algorithms(), window.Concurrency+1) {
		for _, sp := range specs {
			for _, limit := range []uint64{0, 10, window.MaxLogLimit + 1} {
				for _, charge := range []bool{false, true} {
					reqs = append(reqs, window.Request{Spec: sp, Algorithm: a, Limit: limit, ChargeAlways: charge, Hits: 1})
				}
			}
		}
	}
	redis := func(perSecond bool) config.Settings {
		s := config.Defaults()
		s.BackendType, s.Redis.URL = config.BackendRedis, "127.0.0.1:1"
		s.RedisPerSecond.Enabled, s.RedisPerSecond.URL = perSecond, "127.0.0.1:2"
		return s
	}
	refused := map[string]int{}
	for name, s := range map[string]config.Settings{"memory": config.Defaults(), "redis": redis(false), "redis with REDIS_PERSECOND": redis(true)} {
		b, err := newBackend(s, prometheus.NewRegistry(), slog.New(slog.DiscardHandler), nil)
		if err != nil {
			t.Fatal(err)
		}
		limiterChecks, offline := window.CheckerOf(b.limiter), backendChecker(s.BackendType)
		for i := range reqs {
			want, got := limiterChecks.CheckRequest(&reqs[i]), offline.CheckRequest(&reqs[i])
			if (want == nil) != (got == nil) {
				t.Errorf("%s, %+v: the limiter says %v, check-config %v", name, reqs[i], want, got)
			}
			if got != nil {
				refused[name]++
			}
		}
		b.close()
	}
	// Redis refuses more (sub-microsecond buckets); both refuse something.
	if refused["memory"] == 0 || refused["redis"] <= refused["memory"] || refused["redis with REDIS_PERSECOND"] != refused["redis"] {
		t.Fatalf("refusals by backend: %v", refused)
	}
}
