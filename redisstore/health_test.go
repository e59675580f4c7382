package redisstore

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/leapgate/leapgate/internal/redistest"
)

// TestHealthLogsAndLoadsOnChangesOnly: the health check logs a change of
// reachability once, not at every probe, loads the scripts once when Redis
// becomes reachable, and logs no failure when loading succeeds.
func TestHealthLogsAndLoadsOnChangesOnly(t *testing.T) {
	r := redistest.Start(t)
	var logs syncBuffer
	s := newTestStore(t, settingsFor(r.Addr()), Options{
		Logger:         slog.New(slog.NewJSONHandler(&logs, nil)),
		Registry:       prometheus.NewRegistry(),
		HealthInterval: 2 * time.Millisecond,
	})
	probes := func(n uint64) {
		t.Helper()
		count := func() uint64 {
			var m dto.Metric
			_ = s.metrics.op("ping").latency.(prometheus.Metric).Write(&m)
			return m.GetHistogram().GetSampleCount()
		}
		start := count()
		deadline := time.Now().Add(10 * time.Second)
		for count() < start+n {
			if time.Now().After(deadline) {
				t.Fatalf("fewer than %d health probes within 10s", n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitHealthy(t, s)
	probes(10)
	r.Kill()
	waitUnhealthy(t, s)
	probes(10)
	r.Restart()
	waitHealthy(t, s)
	probes(10)

	for msg, want := range map[string]int{
		`"msg":"redis reachable"`:                 1 + 1,
		`"msg":"redis unreachable: answering`:     1,
		`"mode":"error"`:                          1, // by name, as REDIS_FAILURE_MODE
		`"msg":"loading the redis scripts failed`: 0,
	} {
		if got := strings.Count(logs.String(), msg); got != want {
			t.Errorf("%d lines %s, want %d:\n%s", got, msg, want, logs.String())
		}
	}
	// The restarted Redis had the two scripts loaded once.
	admin := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer admin.Close()
	stats, err := admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stats, "cmdstat_script|load:calls=2,") {
		t.Errorf("SCRIPT LOAD calls on the restarted Redis, want 2:\n%s", stats)
	}
}

// TestCloseDuringProbe: closing a Store while a health probe waits on a
// stalled Redis ends the probe without taking Redis for down: no
// "unreachable" line, no failed ping counted.
func TestCloseDuringProbe(t *testing.T) {
	r := redistest.Start(t)
	var logs syncBuffer
	st := settingsFor(r.Addr())
	st.Timeout = 10 * time.Second // the probe waits until Close
	s := newTestStore(t, st, Options{
		Logger:         slog.New(slog.NewJSONHandler(&logs, nil)),
		Registry:       prometheus.NewRegistry(),
		HealthInterval: 5 * time.Millisecond,
	})
	waitHealthy(t, s)
	r.Pause()
	defer r.Resume()
	time.Sleep(100 * time.Millisecond) // a probe is sent and waits
	start := time.Now()
	s.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v: it waited for the probe's timeout", d)
	}
	if strings.Contains(logs.String(), "unreachable") {
		t.Errorf("Redis taken for down on Close:\n%s", logs.String())
	}
	if got := testutil.ToFloat64(s.metrics.op("ping").errors); got != 0 {
		t.Errorf("%v failed pings counted on Close, want 0", got)
	}
}
