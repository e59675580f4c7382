package server

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/redisstore"
)

// backendHealthInterval is how often health re-reads the backend's health.
const backendHealthInterval = 250 * time.Millisecond

// newRedisBackend keeps every window in Redis (package redisstore). With
// REDIS_FAILURE_MODE=local it also builds the in-memory backend, which
// answers while Redis is down. It does not wait for Redis.
//
// Health follows Redis only in failure mode error: in the other modes the
// replica still answers by design while Redis is down (the outage shows in
// the leapgate_redis_up metric and the log), and reporting NOT_SERVING
// would make Envoy and Kubernetes drop every replica at once.
func newRedisBackend(s config.Settings, reg prometheus.Registerer, logger *slog.Logger) (backend, error) {
	opts := redisstore.Options{Logger: logger, Registry: reg}
	var local backend
	if strings.EqualFold(s.Redis.FailureMode, config.RedisFailLocal) {
		local = newMemoryBackend(s, reg)
		opts.Fallback = local.limiter
	}
	ctx, cancel := context.WithCancel(context.Background())
	store, err := redisstore.New(ctx, s.Redis, opts)
	if err != nil {
		cancel()
		return backend{}, err
	}
	errorMode := strings.EqualFold(s.Redis.FailureMode, config.RedisFailError)
	return backend{
		limiter: store,
		run: func(ctx context.Context) {
			if local.run != nil {
				local.run(ctx) // sweeps the fallback's idle counters
			}
		},
		close: func() {
			store.Close()
			cancel()
		},
		healthy: func() bool { return store.Healthy() || !errorMode },
	}, nil
}
