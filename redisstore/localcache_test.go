package redisstore

import (
	"context"
	"fmt"
	"strings"
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

// TestLocalCacheCharges: on a key the cache knows to be over its limit, a
// charge (ChargeAlways with hits) still goes to Redis, which records it
// whether it fits or not, while a check of 0 hits, which records nothing
// even with ChargeAlways, is answered from the cache.
func TestLocalCacheCharges(t *testing.T) {
	r := redistest.Start(t)
	clock := &testclock.Clock{}
	st := settingsFor(r.Addr())
	st.LocalCacheBytes = 1 << 16
	s := withFakeTime(newTestStore(t, st, Options{Clock: clock, HealthInterval: time.Hour}), clock)
	waitHealthy(t, s)
	rt := countRoundTrips(s)
	sp := mustSpec(t, time.Second, 10)
	ctx := context.Background()
	do := func(req window.Request) window.Result {
		t.Helper()
		res, err := s.Do(ctx, []window.Request{req})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	hot := window.Request{Key: "hot", Spec: sp, Limit: 2, Hits: 2, Veto: true, ChargeAlways: true}
	do(hot)
	if res := do(hot); res.Allowed || !res.Recorded { // Redis refuses and records: cached
		t.Fatalf("charge over the limit: %+v", res)
	}

	tests := []struct {
		name       string
		hits       uint64
		roundTrips int64
		recorded   bool
	}{
		{"a charge goes to Redis", 1, 1, true},
		{"a check is answered by the cache", 0, 0, false},
	}
	for _, tt := range tests {
		req := hot
		req.Hits = tt.hits
		before, cached := rt.n.Load(), testutil.ToFloat64(s.metrics.cacheHits)
		res := do(req)
		if res.Allowed || res.Recorded != tt.recorded {
			t.Errorf("%s: %+v, want refused and Recorded %v", tt.name, res, tt.recorded)
		}
		if n := rt.n.Load() - before; n != tt.roundTrips {
			t.Errorf("%s: %d round trips, want %d", tt.name, n, tt.roundTrips)
		}
		if hit := testutil.ToFloat64(s.metrics.cacheHits) - cached; hit != float64(1-tt.roundTrips) {
			t.Errorf("%s: %v cache hits, want %d", tt.name, hit, 1-tt.roundTrips)
		}
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

// TestOverLimitCacheEdges: the bound and the shrink at their edges, with
// entries of 300 bytes (a 220-byte key and the overhead).
func TestOverLimitCacheEdges(t *testing.T) {
	key := func(c byte) string { return string(c) + strings.Repeat("x", 300-entryOverhead-1) }
	const now = time.Minute
	count := func(c *overLimitCache) int { n, _ := c.len(); return n }

	c := newOverLimitCache(300)
	c.put("k", now, 0, 10, 1, 0)
	if count(c) != 0 {
		t.Error("a refusal with no time to wait was cached")
	}
	c.put(key('a'), now, time.Second, 10, 1, 0) // exactly the bound
	if count(c) != 1 {
		t.Error("an entry of exactly the bound was not cached")
	}
	c.put(key('a')+"y", now, time.Second, 10, 1, 0) // one byte over
	if _, _, ok := c.get(key('a')+"y", now, 10, 1); ok {
		t.Error("an entry over the bound was cached")
	}

	// Full to the byte: nothing is dropped (ten entries of 100 bytes).
	c = newOverLimitCache(1000)
	for i := range 10 {
		c.put(fmt.Sprintf("%020d", i), now, time.Second, 10, 1, 0)
	}
	if count(c) != 10 {
		t.Errorf("%d entries filling the bound exactly, want 10", count(c))
	}

	// Over the bound: entries expiring at now are dropped first, and then
	// nothing else is needed.
	c = newOverLimitCache(900)
	for _, k := range []byte("abc") {
		c.put(key(k), 0, now, 10, 1, 0) // until exactly now
	}
	c.put(key('d'), now, time.Second, 10, 1, 0)
	if count(c) != 1 {
		t.Errorf("%d entries after a shrink with 3 expired at now, want 1 (the new one)", count(c))
	}

	// No expired entry: arbitrary ones go until at most 3/4 is used.
	c = newOverLimitCache(1200)
	for _, k := range []byte("abcd") {
		c.put(key(k), now, time.Second, 10, 1, 0)
	}
	c.put(key('e'), now, time.Second, 10, 1, 0) // 1500 > 1200: down to 900, then the new one
	if n, b := c.len(); n != 4 || b != 1200 {
		t.Errorf("%d entries, %d bytes after a shrink, want 4 and 1200 (3/4 kept, then the new one)", n, b)
	}
}
