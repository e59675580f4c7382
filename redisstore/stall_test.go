package redisstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/window"
)

// stallSlack is what a call may take beyond Options.Timeout while Redis
// stalls: the time to notice the deadline and return, on a busy 2-core
// machine (10 ms was once exceeded by 0.8 ms while staticcheck ran). It is
// far below both the stall (1.5 s) and a second timeout.
const stallSlack = 50 * time.Millisecond

// TestStalledRedisBoundedByTimeout blocks a real redis-server (DEBUG SLEEP)
// while concurrent callers keep calling: no Do and no Undo takes longer than
// Options.Timeout plus stallSlack, whatever the connection pool, the
// pipeline or the failure mode does meanwhile.
func TestStalledRedisBoundedByTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("a real-time bound: skipped where other suites share the machine (make mutate)")
	}
	r := redistest.Start(t, "--enable-debug-command", "yes")
	for _, timeout := range []time.Duration{100 * time.Millisecond, 300 * time.Millisecond} {
		t.Run(timeout.String(), func(t *testing.T) {
			opts := settingsFor(r.Addr())
			opts.Timeout = timeout
			s := newTestStore(t, opts, Options{HealthInterval: time.Hour})
			waitHealthy(t, s)
			sp := mustSpec(t, time.Minute, 1)
			ctx := context.Background()
			if _, err := s.Do(ctx, []window.Request{{Key: "warm", Spec: sp, Limit: 100, Hits: 1}}); err != nil {
				t.Fatal(err)
			}

			admin := redis.NewClient(&redis.Options{Addr: r.Addr()})
			defer admin.Close()
			stalled := make(chan struct{})
			go func() {
				close(stalled)
				admin.Do(context.Background(), "DEBUG", "SLEEP", "1.5")
			}()
			<-stalled
			time.Sleep(20 * time.Millisecond) // let DEBUG SLEEP reach Redis first

			var mu sync.Mutex
			var longest time.Duration
			var failed int
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					for i := range 5 {
						reqs := []window.Request{{Key: "stall", Spec: sp, Limit: 100, Hits: 1}}
						start := time.Now()
						var err error
						if (g+i)%4 == 0 {
							err = s.Undo(ctx, reqs, []window.Result{{Recorded: true, Bucket: 1}})
						} else {
							_, err = s.Do(ctx, reqs)
						}
						took := time.Since(start)
						mu.Lock()
						longest = max(longest, took)
						if err != nil {
							failed++
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			t.Logf("Timeout %v: longest call %v, %d of 40 failed", timeout, longest, failed)
			if longest > timeout+stallSlack {
				t.Errorf("a call took %v with Redis stalled, bound %v + %v", longest, timeout, stallSlack)
			}
			if failed == 0 {
				t.Error("no call failed: Redis was not stalled")
			}
			// Let the sleep end before the next case.
			deadline := time.Now().Add(5 * time.Second)
			for admin.Ping(ctx).Err() != nil && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
