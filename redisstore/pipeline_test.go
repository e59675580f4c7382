package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/internal/testclock"
	"github.com/leapgate/leapgate/window"
)

// gate is a client hook that holds the first pipeline sent after arm until
// open, so that a test can queue jobs behind it.
type gate struct {
	mu      sync.Mutex
	armed   bool
	holding chan struct{} // closed when a pipeline is held
	release chan struct{}
}

func (g *gate) arm() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed, g.holding, g.release = true, make(chan struct{}), make(chan struct{})
}

func (g *gate) open() { close(g.release) }

func (g *gate) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.mu.Lock()
		held := g.armed
		g.armed = false
		g.mu.Unlock()
		if held {
			close(g.holding)
			<-g.release
		}
		return next(ctx, cmds)
	}
}

// heldStore is a Store with one pipeline worker, on clock for Redis's
// time, whose round trips a gate can hold.
func heldStore(t *testing.T, clock *testclock.Clock) (*Store, *gate) {
	r := redistest.Start(t)
	st := settingsFor(r.Addr())
	st.PoolSize = 1 // one worker
	s := withFakeTime(newTestStore(t, st, Options{Registry: prometheus.NewRegistry(), HealthInterval: time.Hour}), clock)
	waitHealthy(t, s)
	g := &gate{}
	s.client.AddHook(g)
	return s, g
}

// hold sends a Do that the gate holds, and returns once it is held and a
// channel that receives its error once the gate opens.
func hold(t *testing.T, s *Store, g *gate, sp window.Spec) <-chan error {
	t.Helper()
	g.arm()
	done := make(chan error, 1)
	go func() {
		_, err := s.Do(context.Background(), []window.Request{{Key: "held", Spec: sp, Limit: 100, Hits: 1}})
		done <- err
	}()
	<-g.holding
	return done
}

// queued waits until n jobs wait in s's pipeline queue.
func queued(t *testing.T, s *Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(s.pipe.queue) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d jobs queued within 10s, want %d", len(s.pipe.queue), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func batchHistogram(t *testing.T, s *Store) *dto.Histogram {
	t.Helper()
	var m dto.Metric
	if err := s.metrics.batch.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram()
}

// TestPipelineMergesCallsOfOneTimeOnly: calls queued together are merged
// into one script call only when they run at the same time argument; a
// call at a later time is not answered at an earlier one.
func TestPipelineMergesCallsOfOneTimeOnly(t *testing.T) {
	clock := &testclock.Clock{}
	clock.Set(base)
	s, g := heldStore(t, clock)
	sp := mustSpec(t, time.Minute, 6)
	do := func(key string, out *window.Result, wg *sync.WaitGroup) {
		wg.Go(func() {
			res, err := s.Do(context.Background(), []window.Request{{Key: key, Spec: sp, Limit: 1, Hits: 1, Veto: true}})
			if err != nil {
				t.Error(err)
				return
			}
			*out = res[0]
		})
	}
	var full, a, x window.Result
	var wg sync.WaitGroup
	do("x", &full, &wg) // x's limit, at base
	wg.Wait()

	held := hold(t, s, g, sp)
	do("a", &a, &wg) // at base
	queued(t, s, 1)
	clock.Advance(2 * time.Minute)
	do("x", &x, &wg) // two windows later: x has room again
	queued(t, s, 2)
	g.open()
	wg.Wait()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if !full.Allowed || !a.Allowed || !x.Allowed {
		t.Errorf("x at base %+v, a at base %+v, x two windows later %+v: want all allowed", full, a, x)
	}
}

// TestPipelineBatchBounds: however many operations are queued, one round
// trip carries at most maxBatchCalls of them; operations whose callers
// stopped waiting are answered unsent, and a round trip of none is not made.
func TestPipelineBatchBounds(t *testing.T) {
	clock := &testclock.Clock{}
	clock.Set(base)
	s, g := heldStore(t, clock)
	sp := mustSpec(t, time.Minute, 6)

	const n = maxBatchCalls + 44
	held := hold(t, s, g, sp)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if _, err := s.Do(context.Background(), []window.Request{{Key: fmt.Sprint("k", i), Spec: sp, Limit: 1, Hits: 1}}); err != nil {
				t.Error(err)
			}
		})
	}
	queued(t, s, n)
	g.open()
	wg.Wait()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	h := batchHistogram(t, s)
	var within uint64
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() == maxBatchCalls {
			within = b.GetCumulativeCount()
		}
	}
	// The warm-up of waitHealthy sends none; the held Do, then 256, then 44.
	if h.GetSampleCount() != 3 || h.GetSampleSum() != n+1 || within != 3 {
		t.Errorf("%d round trips of %v operations, %d of them of at most %d; want 3 of %d, all within",
			h.GetSampleCount(), h.GetSampleSum(), within, maxBatchCalls, n+1)
	}

	// A caller that gives up while its job is queued: answered unsent.
	held = hold(t, s, g, sp)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := s.Do(ctx, []window.Request{{Key: "late", Spec: sp, Limit: 1, Hits: 1}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a Do whose deadline passed in the queue: %v, want DeadlineExceeded", err)
	}
	before := batchHistogram(t, s).GetSampleCount()
	g.open()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	// The held Do's batch was observed before it was held. The one worker
	// takes the expired job next, a batch of none: neither sent nor
	// observed. Then a Do of the same key, after it: one round trip.
	if res, err := s.Do(context.Background(), []window.Request{{Key: "late", Spec: sp, Limit: 1, Hits: 1}}); err != nil || !res[0].Allowed {
		t.Errorf("the expired job counted: %+v %v", res, err)
	}
	if got := batchHistogram(t, s).GetSampleCount() - before; got != 1 {
		t.Errorf("%d round trips observed for an expired job and a Do, want 1", got)
	}
}
