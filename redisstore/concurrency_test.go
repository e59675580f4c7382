package redisstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/window"
)

// TestConcurrencyAcrossStores: two replicas share a limit of 5 requests in
// flight on one key. Callers on both acquire a slot with their own holder,
// count themselves in flight while they hold it, and give it back: the
// count never exceeds 5, the limit is reached, and once everyone gave back,
// all 5 slots are free again.
func TestConcurrencyAcrossStores(t *testing.T) {
	r := redistest.Start(t)
	a := newTestStore(t, settingsFor(r.Addr()), Options{})
	b := newTestStore(t, settingsFor(r.Addr()), Options{})
	waitHealthy(t, a, b)
	sp := mustSpec(t, time.Hour, 1) // leases far longer than the test
	const limit = 5
	ctx := context.Background()
	var inFlight, peak, admitted atomic.Int64
	var wg sync.WaitGroup
	for w := range 12 {
		st := a
		if w%2 == 1 {
			st = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				req := window.Request{Key: "uploads", Spec: sp, Limit: limit, Hits: 1, Veto: true,
					Algorithm: window.Concurrency, Holder: fmt.Sprint(w, "/", i)}
				res, err := st.Do(ctx, []window.Request{req})
				if err != nil {
					t.Error(err)
					return
				}
				if !res[0].Allowed {
					continue
				}
				admitted.Add(1)
				n := inFlight.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(time.Millisecond) // hold the slot for a moment
				inFlight.Add(-1)
				req.Negative = true
				if _, err := st.Do(ctx, []window.Request{req}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > limit || p < 2 {
		t.Fatalf("peak in flight %d across two replicas, want 2..%d", p, limit)
	}
	res, err := a.Do(ctx, []window.Request{{Key: "uploads", Spec: sp, Limit: limit, Algorithm: window.Concurrency}})
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].Allowed || res[0].Remaining != limit {
		t.Fatalf("after every release (%d admitted): %+v, want all %d slots free", admitted.Load(), res[0], limit)
	}
}
