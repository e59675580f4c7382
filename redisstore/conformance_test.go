package redisstore

import (
	"testing"
	"time"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/window"
	"github.com/leapgate/leapgate/window/limitertest"
)

// openOn returns a limitertest.Open of Stores on the Redis of settings,
// each with a key prefix of its own (the subtests share the server) and
// the suite's clock as Redis's time.
func openOn(settings Options) limitertest.Open {
	return func(t *testing.T, clock *limitertest.Clock) window.Limiter {
		st := settings
		st.KeyPrefix = t.Name() + ":"
		s := newTestStore(t, st, Options{HealthInterval: time.Hour})
		s.nowMicros = func() int64 { return int64(clock.Now() / time.Microsecond) }
		return s
	}
}

// The Store keeps the window.Limiter contract on one Redis, on a Cluster,
// and split over two Redis servers by REDIS_PERSECOND's window.Split.
func TestConformance(t *testing.T) {
	single := redistest.Start(t)
	t.Run("single", func(t *testing.T) { limitertest.Run(t, openOn(settingsFor(single.Addr()))) })
	t.Run("split", func(t *testing.T) {
		second := redistest.Start(t)
		short, long := openOn(settingsFor(second.Addr())), openOn(settingsFor(single.Addr()))
		limitertest.Run(t, func(t *testing.T, clock *limitertest.Clock) window.Limiter {
			return window.Split{Short: short(t, clock), Long: long(t, clock), MaxShort: time.Hour}
		})
	})
	t.Run("cluster", func(t *testing.T) {
		st := settingsFor("")
		st.Topology, st.Addrs = Cluster, startCluster(t)
		limitertest.Run(t, openOn(st))
	})
}
