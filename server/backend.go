package server

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/redisstore"
	"github.com/leapgate/leapgate/rlqs/quota"
	"github.com/leapgate/leapgate/window"
)

// backend is the limiter chosen by BACKEND_TYPE with its background work.
type backend struct {
	limiter window.Limiter
	// ledger shares RLQS's division of the limits among the replicas on
	// the same backend (nil in memory: each replica divides alone).
	ledger quota.Ledger
	// run does the backend's background work until ctx is done.
	run func(ctx context.Context)
	// close releases the backend's resources.
	close func()
	// healthy, when set, reports whether the backend can answer; health
	// follows it (nil: always).
	healthy func() bool
}

// newBackend builds the limiter chosen by BACKEND_TYPE. A new backend type
// is one more case here.
// tp, when not nil, traces the calls to a remote backend.
func newBackend(s config.Settings, reg prometheus.Registerer, logger *slog.Logger, tp trace.TracerProvider) (backend, error) {
	switch s.BackendType {
	case config.BackendMemory:
		return newMemoryBackend(s, reg), nil
	case config.BackendRedis:
		return newRedisBackend(s, reg, logger, tp)
	}
	return backend{}, fmt.Errorf("BACKEND_TYPE %q is not supported", s.BackendType)
}

// backendChecker returns the request checks of the backend that
// BACKEND_TYPE t selects, without building or reaching it (CheckConfig runs
// offline): the checks its limiter makes (TestBackendCheckerIsTheLimiters).
// A new backend type is one more case here too.
func backendChecker(t config.BackendType) window.RequestChecker {
	if t == config.BackendRedis {
		return window.RequestCheckerFunc(redisstore.CheckRequest)
	}
	return window.RequestCheckerFunc(window.CheckRequest)
}

// newMemoryBackend keeps every window in this process, bounded by MAX_KEYS
// and MAX_MEMORY_BYTES and swept of idle counters every SWEEP_INTERVAL.
func newMemoryBackend(s config.Settings, reg prometheus.Registerer) backend {
	store := window.NewStore(window.StoreOptions{MaxKeys: s.MaxKeys, MaxBytes: int64(s.MaxMemoryBytes)})
	stat := func(f func(window.StoreStats) float64) func() float64 {
		return func() float64 { return f(store.Stats()) }
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "leapgate_memory_keys",
			Help: "Counters held by the in-memory backend.",
		}, stat(func(st window.StoreStats) float64 { return float64(st.Keys) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "leapgate_memory_bytes",
			Help: "Bytes the in-memory backend's counters take, as bounded by MAX_MEMORY_BYTES.",
		}, stat(func(st window.StoreStats) float64 { return float64(st.Bytes) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "leapgate_memory_evictions_total",
			Help: "Counters evicted (least recently used) because MAX_KEYS or MAX_MEMORY_BYTES was reached; their hits are forgotten.",
		}, stat(func(st window.StoreStats) float64 { return float64(st.Evictions) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "leapgate_memory_reclaims_total",
			Help: "Idle counters (nothing inside their window) reclaimed by the sweep.",
		}, stat(func(st window.StoreStats) float64 { return float64(st.Reclaims) })),
	)
	return backend{
		limiter: store,
		run:     func(ctx context.Context) { store.Run(ctx, s.SweepInterval) },
		close:   func() {},
	}
}
