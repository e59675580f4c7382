package redisstore

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/window"
)

// admission is one admitted call as its caller saw it.
type admission struct{ sent, received time.Time }

// overshoot reports a set of limit+1 admissions whose calls all fall within
// one window w (their first call sent and last answer received less than w
// apart): proof, from the client side, that some window admitted more
// than limit. It returns the first such set's start and true.
func overshoot(admitted []admission, limit int, w time.Duration) (time.Time, bool) {
	for i := 0; i+limit < len(admitted); i++ {
		if admitted[i+limit].received.Sub(admitted[i].sent) < w {
			return admitted[i].sent, true
		}
	}
	return time.Time{}, false
}

// TestLocalModeRecoveryNoOvershoot: in local failure mode, a redis-server
// killed with SIGKILL while a client hammers one key, then started afresh
// (empty), must not let the fresh Redis window admit on top of what the
// local window admitted meanwhile: no window of the limit's length admits
// more than the limit, as the client sees it; and one window after the
// recovery the key admits its whole limit again.
func TestLocalModeRecoveryNoOvershoot(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 3 s of real time")
	}
	r := redistest.Start(t)
	opts := settingsFor(r.Addr())
	opts.FailureMode = FailLocal
	opts.Timeout = 100 * time.Millisecond
	s := newTestStore(t, opts, Options{Fallback: window.NewStore(window.StoreOptions{}), HealthInterval: 20 * time.Millisecond})
	waitHealthy(t, s)
	const limit = 100
	w := time.Second
	sp := mustSpec(t, w, 1)
	ctx := context.Background()

	// The outage begins before the key has hits, so that what is tested is
	// the recovery: the local window admits the limit, then Redis returns
	// knowing nothing of it.
	r.Kill()
	waitUnhealthy(t, s)

	var mu sync.Mutex
	var admitted []admission
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				sent := time.Now()
				res, err := s.Do(ctx, []window.Request{{Key: "recover", Spec: sp, Limit: limit, Hits: 1, Veto: true}})
				received := time.Now()
				if err == nil && res[0].Allowed {
					mu.Lock()
					admitted = append(admitted, admission{sent, received})
					mu.Unlock()
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	r.Restart()
	waitHealthy(t, s)
	recovered := time.Now()
	time.Sleep(2 * w)
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	slices.SortFunc(admitted, func(a, b admission) int { return a.sent.Compare(b.sent) })
	if at, bad := overshoot(admitted, limit, w); bad {
		t.Fatalf("more than %d admitted within %v from %v (%d admitted in all)", limit, w, at.Format("15:04:05.000"), len(admitted))
	}
	// Full capacity is back within one window of the recovery: the Redis
	// counter, created with the limit lowered by the local window's hits,
	// follows the limit again as they age out. (The calls of the window's
	// first and last 10 ms may straddle its edges.)
	var second int
	for _, a := range admitted {
		if a.sent.After(recovered.Add(w+10*time.Millisecond)) && a.received.Before(recovered.Add(2*w-10*time.Millisecond)) {
			second++
		}
	}
	if second < limit*9/10 {
		t.Errorf("the second window after the recovery admitted %d, want the limit (%d, less 10%% for the calls at its edges)", second, limit)
	}
	t.Logf("%d admitted over about %v, %d in the second window after the recovery", len(admitted), 2*w+300*time.Millisecond, second)
}
