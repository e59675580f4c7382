package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/internal/testclock"
	"github.com/leapgate/leapgate/window"
)

// TestLocalCache: a key refused by Redis is refused locally, without a
// round trip, until its Reset has passed on the local clock; then Redis is
// asked again.
func TestLocalCache(t *testing.T) {
	r := redistest.Start(t)
	redisTime := &testclock.Clock{}
	redisTime.Set(base)
	localClock := &testclock.Clock{}
	localClock.Set(time.Hour) // deliberately unrelated to Redis's time
	st := settingsFor(r.Addr())
	st.LocalCacheBytes = 1 << 16
	s := withFakeTime(newTestStore(t, st, Options{Clock: localClock, HealthInterval: time.Hour}), redisTime)
	waitHealthy(t, s)
	rt := countRoundTrips(s)
	sp := mustSpec(t, time.Second, 10)
	ctx := context.Background()
	do := func(key string, limit, hits uint64, veto bool) window.Result {
		t.Helper()
		res, err := s.Do(ctx, []window.Request{{Key: key, Spec: sp, Limit: limit, Hits: hits, Veto: veto}})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	do("hot", 2, 2, true)
	refused := do("hot", 2, 1, true) // Redis refuses: cached for Reset
	if refused.Allowed || refused.Reset != time.Second {
		t.Fatalf("refusal %+v", refused)
	}

	before := rt.n.Load()
	for i := range 5 {
		localClock.Advance(150 * time.Millisecond)
		res := do("hot", 2, 1, true)
		if res.Allowed {
			t.Fatalf("cached refusal %d allowed", i)
		}
		if want := time.Second - time.Duration(i+1)*150*time.Millisecond; res.Reset != want {
			t.Fatalf("cached Reset %v, want %v", res.Reset, want)
		}
	}
	if n := rt.n.Load() - before; n != 0 {
		t.Fatalf("%d round trips for cached refusals, want 0", n)
	}
	if hits := testutil.ToFloat64(s.metrics.cacheHits); hits != 5 {
		t.Fatalf("cache hits metric %v, want 5", hits)
	}

	// A cheaper check (check-only needs 1 hit too, so it is cached) or a
	// higher limit is not known to fail: Redis is asked.
	before = rt.n.Load()
	if res := do("hot", 3, 1, true); !res.Allowed {
		t.Fatalf("raised limit refused: %+v", res)
	}
	if n := rt.n.Load() - before; n != 1 {
		t.Fatalf("raised limit: %d round trips, want 1", n)
	}

	// A cached Veto refusal makes the rest of its batch a dry run: the
	// others are answered by Redis but record nothing.
	before = rt.n.Load()
	res, err := s.Do(ctx, []window.Request{
		{Key: "hot", Spec: sp, Limit: 2, Hits: 1, Veto: true},
		{Key: "cold", Spec: sp, Limit: 10, Hits: 1, Veto: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Allowed || !res[1].Allowed || res[1].Recorded || res[1].Remaining != 10 {
		t.Fatalf("batch with a cached veto: %+v", res)
	}
	if n := rt.n.Load() - before; n != 1 {
		t.Fatalf("batch with a cached veto: %d round trips, want 1", n)
	}

	// Once Reset has passed on the local clock, Redis decides again.
	localClock.Advance(time.Second)
	redisTime.Advance(1100 * time.Millisecond)
	before = rt.n.Load()
	if res := do("hot", 2, 1, true); !res.Allowed {
		t.Fatalf("after Reset: %+v", res)
	}
	if n := rt.n.Load() - before; n != 1 {
		t.Fatalf("after Reset: %d round trips, want 1", n)
	}
}

// TestOverLimitCacheBounded: the cache never exceeds its byte bound and
// matches only requests it knows would fail.
func TestOverLimitCacheBounded(t *testing.T) {
	const maxBytes = 10_000
	c := newOverLimitCache(maxBytes)
	for i := range 10_000 {
		c.put(fmt.Sprintf("key-%06d", i), 0, time.Minute, 10, 1, 0)
		if _, b := c.len(); b > maxBytes {
			t.Fatalf("after %d puts: %d bytes > %d", i, b, maxBytes)
		}
	}
	n, _ := c.len()
	if n == 0 || n > maxBytes/entryOverhead {
		t.Fatalf("%d entries", n)
	}

	c = newOverLimitCache(maxBytes)
	c.put("k", time.Second, 2*time.Second, 10, 3, 2)
	for _, tc := range []struct {
		now         time.Duration
		limit, need uint64
		ok          bool
	}{
		{time.Second, 10, 3, true},
		{2 * time.Second, 10, 5, true},  // more hits: fails too
		{2 * time.Second, 9, 3, true},   // lower limit: fails too
		{2 * time.Second, 10, 2, false}, // fewer hits may pass
		{2 * time.Second, 11, 3, false}, // a raised limit may pass
		{3 * time.Second, 10, 3, false}, // expired
		{time.Second, 10, 3, false},     // and removed
	} {
		rem, reset, ok := c.get("k", tc.now, tc.limit, tc.need)
		if ok != tc.ok {
			t.Fatalf("%+v: ok=%t", tc, ok)
		}
		if ok && (rem != 2 || reset != 3*time.Second-tc.now) {
			t.Fatalf("%+v: remaining %d reset %v", tc, rem, reset)
		}
	}
	c.put(string(make([]byte, maxBytes)), 0, time.Second, 1, 1, 0) // larger than the cache
	if n, _ := c.len(); n != 0 {
		t.Fatalf("an oversized key was cached")
	}
}
