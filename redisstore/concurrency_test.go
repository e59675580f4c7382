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

// TestConcurrencyBypassesLocalCache: with the over-limit cache on, a
// replica refused at the cap still sees a slot given back through another
// replica at once (the cache never answers for a concurrency limit), and
// charges (ChargeAlways) always reach Redis.
func TestConcurrencyBypassesLocalCache(t *testing.T) {
	r := redistest.Start(t)
	st := settingsFor(r.Addr())
	st.LocalCacheBytes = 1 << 16
	a, b := newTestStore(t, st, Options{}), newTestStore(t, st, Options{})
	waitHealthy(t, a, b)
	ctx := context.Background()
	sp := mustSpec(t, time.Hour, 1)
	slot := func(holder string) window.Request {
		return window.Request{Key: "cached_uploads", Spec: sp, Limit: 1, Hits: 1, Veto: true, Algorithm: window.Concurrency, Holder: holder}
	}
	do := func(s *Store, q window.Request) window.Result {
		t.Helper()
		res, err := s.Do(ctx, []window.Request{q})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	if !do(a, slot("r1")).Allowed {
		t.Fatal("r1 refused on an empty limit")
	}
	if do(a, slot("r2")).Allowed {
		t.Fatal("r2 admitted at the cap")
	}
	end := slot("r1")
	end.Negative = true
	do(b, end)
	if !do(a, slot("r2")).Allowed {
		t.Fatal("r2 refused on replica a after r1 gave its slot back through replica b")
	}

	tokens := window.Request{Key: "cached_tokens", Spec: sp, Limit: 10, Hits: 20, Veto: true, ChargeAlways: true}
	for range 3 {
		if res := do(a, tokens); !res.Recorded {
			t.Fatalf("charge not recorded: %+v", res)
		}
	}
	tokens.Hits = 0
	tokens.Limit = 55 // 60 charged: still over
	if res := do(b, tokens); res.Allowed {
		t.Fatalf("the charges did not all reach Redis: %+v", res)
	}
}
