package window

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/leapgate/leapgate/internal/testclock"
)

func TestStoreSweep(t *testing.T) {
	spec := mustSpec(t, time.Second, 10)
	clock := &testclock.Clock{}
	s := NewStore(StoreOptions{Clock: clock})
	ctx := context.Background()
	for i := range 100 {
		clock.Set(time.Duration(i) * 10 * time.Millisecond) // key i hit at i*10ms
		if _, err := s.Do(ctx, []Request{{Key: strconv.Itoa(i), Spec: spec, Limit: 5, Hits: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		now          time.Duration
		wantReclaims int
	}{
		{990 * time.Millisecond, 0},   // everything still inside its window
		{1100 * time.Millisecond, 11}, // keys 0-10 (hit at or before 100ms) left the window
		{1100 * time.Millisecond, 0},  // nothing more to do
		{1550 * time.Millisecond, 45}, // keys 11-55 (hit at or before 550ms) left
		{time.Hour, 44},
	}
	total := 0
	for _, tt := range tests {
		got := s.Sweep(tt.now)
		if got != tt.wantReclaims {
			t.Fatalf("Sweep(%v) reclaimed %d, want %d", tt.now, got, tt.wantReclaims)
		}
		total += got
		if st := s.Stats(); st.Keys != int64(100-total) || st.Reclaims != uint64(total) {
			t.Fatalf("after Sweep(%v): %+v, want %d keys and %d reclaims", tt.now, st, 100-total, total)
		}
	}
}

func TestStoreRunSweeps(t *testing.T) {
	spec := mustSpec(t, time.Second, 10)
	clock := &testclock.Clock{}
	s := NewStore(StoreOptions{Clock: clock})
	s.Do(context.Background(), []Request{{Key: "a", Spec: spec, Limit: 5, Hits: 1}})
	clock.Set(time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx, time.Millisecond) }()
	deadline := time.After(10 * time.Second)
	for s.Stats().Keys != 0 {
		select {
		case <-deadline:
			t.Fatal("Run did not sweep the idle key")
		case <-time.After(time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("Run returned %v, want context.Canceled", err)
	}
}

func TestStoreMaxKeys(t *testing.T) {
	spec := mustSpec(t, time.Second, 10)
	tests := []struct{ maxKeys, keys int }{{1, 50}, {10, 1000}, {300, 1000}, {1000, 1000}}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("max %d", tt.maxKeys), func(t *testing.T) {
			clock := &testclock.Clock{}
			s := NewStore(StoreOptions{Clock: clock, MaxKeys: tt.maxKeys})
			for i := range tt.keys {
				clock.Advance(time.Microsecond)
				s.Do(context.Background(), []Request{{Key: strconv.Itoa(i), Spec: spec, Limit: 5, Hits: 1}})
				if got := s.Stats().Keys; got > int64(tt.maxKeys) {
					t.Fatalf("%d keys held after %d inserts, max %d", got, i+1, tt.maxKeys)
				}
			}
			st := s.Stats()
			if want := uint64(max(0, tt.keys-tt.maxKeys)); st.Evictions != want {
				t.Fatalf("%d evictions, want %d", st.Evictions, want)
			}
		})
	}
}

// Eviction prefers idle keys, then the least recently used of a sample: a
// key used all the time survives a stream of one-off keys.
func TestStoreEvictionKeepsHotKey(t *testing.T) {
	spec := mustSpec(t, time.Second, 10)
	clock := &testclock.Clock{}
	s := NewStore(StoreOptions{Clock: clock, MaxKeys: 64})
	ctx := context.Background()
	hot := Request{Key: "hot", Spec: spec, Limit: 1 << 20, Hits: 1}
	for i := range 20_000 {
		clock.Advance(time.Microsecond)
		s.Do(ctx, []Request{{Key: strconv.Itoa(i), Spec: spec, Limit: 5, Hits: 1}})
		if i%4 == 0 {
			clock.Advance(100 * time.Microsecond)
			s.Do(ctx, []Request{hot})
		}
	}
	if got, want := s.CountAt("hot", clock.Now()), uint64(5000); got != want {
		t.Fatalf("hot key counts %d, want %d (it was evicted)", got, want)
	}
}

// streamMaxKeys is the key bound of the Store in TestStoreBoundedMemory.
const streamMaxKeys = 20_000

// heapBound is the documented heap growth bound of a Store with
// MaxKeys streamMaxKeys and 20 buckets per key: about 300 bytes per key
// (BenchmarkBytesPerKey) plus the maps' table slack after churn.
const heapBound = 16 << 20

// A stream of distinct keys (streamKeys of them: 1,000,000 without -race)
// goes through a Store bounded to streamMaxKeys while a hot key is hammered:
// the heap stays under heapBound and the hot key's limit holds exactly in
// every window.
func TestStoreBoundedMemory(t *testing.T) {
	spec := mustSpec(t, 100*time.Millisecond, DefaultBuckets)
	clock := &testclock.Clock{}
	s := NewStore(StoreOptions{Clock: clock, MaxKeys: streamMaxKeys})
	ctx := context.Background()
	const hotLimit = 50
	hot := []Request{{Key: "hot", Spec: spec, Limit: hotLimit, Hits: 1, Veto: true}}
	req := []Request{{Spec: spec, Limit: 10, Hits: 1, Veto: true}}
	res := make([]Result, 1)
	var hotAdmitted []time.Duration
	key := make([]byte, 0, 32)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var peak uint64
	for i := range streamKeys {
		now := time.Duration(i) * time.Microsecond // 100k keys per window
		key = strconv.AppendInt(append(key[:0], "user_"...), int64(i), 10)
		req[0].Key = string(key)
		if err := s.DoAt(ctx, now, req, res); err != nil {
			t.Fatal(err)
		}
		if !res[0].Allowed {
			t.Fatalf("fresh key %d refused", i)
		}
		if i%10 == 0 {
			if err := s.DoAt(ctx, now, hot, res); err != nil {
				t.Fatal(err)
			}
			if res[0].Allowed {
				hotAdmitted = append(hotAdmitted, now)
			}
		}
		if i%(streamKeys/10) == 0 {
			s.Sweep(now)
			runtime.GC()
			runtime.ReadMemStats(&after)
			peak = max(peak, after.HeapAlloc)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	peak = max(peak, after.HeapAlloc)
	st := s.Stats()
	growth := int64(peak) - int64(before.HeapAlloc)
	t.Logf("%d keys streamed: peak heap growth %d bytes (%d per held key), %+v", streamKeys, growth, growth/max(st.Keys, 1), st)
	if growth > heapBound {
		t.Fatalf("heap grew by %d bytes, bound %d", growth, heapBound)
	}
	if st.Keys > streamMaxKeys {
		t.Fatalf("%d keys held, max %d", st.Keys, streamMaxKeys)
	}
	if st.Evictions == 0 {
		t.Fatalf("no evictions: the bound was never exercised")
	}
	if got := maxInAnyWindow(hotAdmitted, spec.Length()); got > hotLimit {
		t.Fatalf("hot key admitted %d in one window, limit %d (evicted?)", got, hotLimit)
	}
	windows := int(time.Duration(streamKeys) * time.Microsecond / spec.Length())
	if min := windows * hotLimit * 9 / 10; len(hotAdmitted) < min {
		t.Fatalf("hot key admitted only %d over %d windows", len(hotAdmitted), windows)
	}
}

func TestStoreRunBadInterval(t *testing.T) {
	if err := NewStore(StoreOptions{Clock: &testclock.Clock{}}).Run(context.Background(), 0); err == nil {
		t.Fatal("Run with interval 0 returned nil")
	}
}

// After a burst of keys goes idle, Sweep gives the maps' memory back, even
// while a few keys of the burst stay in use.
func TestStoreSweepShrinksMaps(t *testing.T) {
	spec := mustSpec(t, time.Second, DefaultBuckets)
	s := NewStore(StoreOptions{Clock: &testclock.Clock{}})
	res := make([]Result, 1)
	var base, full, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&base)
	const n, keep = 200_000, 50 // one key in 50 stays in use
	for i := range n {
		s.DoAt(context.Background(), 0, []Request{{Key: "burst_" + strconv.Itoa(i), Spec: spec, Limit: 5, Hits: 1}}, res)
	}
	for i := 0; i < n; i += keep {
		s.DoAt(context.Background(), time.Hour-time.Millisecond, []Request{{Key: "burst_" + strconv.Itoa(i), Spec: spec, Limit: 5, Hits: 1}}, res)
	}
	runtime.GC()
	runtime.ReadMemStats(&full)
	if got, want := s.Sweep(time.Hour), n-n/keep; got != want {
		t.Fatalf("swept %d, want %d", got, want)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(s)
	grown := int64(full.HeapAlloc) - int64(base.HeapAlloc)
	left := int64(after.HeapAlloc) - int64(base.HeapAlloc)
	t.Logf("burst of %d keys: +%d bytes; after sweeping all but %d: +%d bytes", n, grown, n/keep, left)
	if left > grown/10 {
		t.Fatalf("after sweeping %d of %d keys the heap is still %d bytes above its start (burst: %d)", n-n/keep, n, left, grown)
	}
}

// accountedBytes recomputes what Store.Stats().Bytes must say.
func accountedBytes(s *Store) int64 {
	var n int64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, c := range sh.m {
			n += entryBytes + c.footprint()
		}
		sh.mu.Unlock()
	}
	return n
}

// A stream of distinct keys through a Store bounded by MaxBytes alone keeps
// the accounted bytes and the heap within the bound, for every algorithm
// (a sliding log of limit 1000 holds 8 KB), while a hot key keeps exactly
// its limit.
func TestStoreByteBudget(t *testing.T) {
	const budget = 4 << 20
	tests := []struct {
		alg   Algorithm
		limit uint64
		keys  int
	}{
		{SlidingWindow, 10, 100_000},
		{SlidingWindow, 1000, 100_000},
		{TimeBuckets, 10, 100_000},
		{TokenBucket, 10, 100_000},
		{FixedWindow, 10, 100_000},
		{SlidingLog, 10, 100_000},
		{SlidingLog, 1000, 10_000},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%v/limit=%d", tt.alg, tt.limit), func(t *testing.T) {
			spec := mustSpec(t, time.Minute, DefaultBuckets)
			s := NewStore(StoreOptions{Clock: &testclock.Clock{}, MaxBytes: budget})
			ctx := context.Background()
			const hotLimit = 50
			hot := []Request{{Key: "hot", Spec: spec, Limit: hotLimit, Hits: 1, Veto: true, Algorithm: tt.alg}}
			req := []Request{{Spec: spec, Limit: tt.limit, Hits: 1, Veto: true, Algorithm: tt.alg}}
			res := make([]Result, 1)
			hotAdmitted := 0

			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			var peakHeap uint64
			var peakBytes int64
			for i := range tt.keys {
				now := time.Duration(i) * time.Microsecond // all in one window
				req[0].Key = "k" + strconv.Itoa(i)
				if err := s.DoAt(ctx, now, req, res); err != nil || !res[0].Allowed {
					t.Fatalf("fresh key %d: %v %v", i, res[0], err)
				}
				if i%100 == 0 {
					if err := s.DoAt(ctx, now, hot, res); err != nil {
						t.Fatal(err)
					}
					if res[0].Allowed {
						hotAdmitted++
					}
				}
				peakBytes = max(peakBytes, s.Stats().Bytes)
				if i%(tt.keys/5) == 0 {
					runtime.GC()
					runtime.ReadMemStats(&after)
					peakHeap = max(peakHeap, after.HeapAlloc)
				}
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			peakHeap = max(peakHeap, after.HeapAlloc)
			st := s.Stats()
			growth := int64(peakHeap) - int64(before.HeapAlloc)
			t.Logf("%d keys: %d held, accounted peak %d B, heap growth %d B, %d evictions", tt.keys, st.Keys, peakBytes, growth, st.Evictions)
			if got := accountedBytes(s); got != st.Bytes {
				t.Fatalf("Stats().Bytes = %d, the counters held account for %d", st.Bytes, got)
			}
			if perKey := entryBytes + newMeterFor(spec, tt.alg, tt.limit).footprint(); peakBytes > budget+perKey {
				t.Fatalf("accounted bytes peaked at %d, budget %d", peakBytes, budget)
			}
			// The maps' tables and the GC's timing add to the counters;
			// what matters is that the heap follows the budget, not the
			// key count.
			if growth > budget*3/2+(1<<20) {
				t.Fatalf("heap grew by %d bytes under a budget of %d", growth, budget)
			}
			if st.Evictions == 0 {
				t.Fatal("no evictions: the budget was never reached")
			}
			if hotAdmitted != hotLimit {
				t.Fatalf("hot key admitted %d in one window, limit %d", hotAdmitted, hotLimit)
			}
			s.Sweep(time.Hour)
			if st := s.Stats(); st.Keys != 0 || st.Bytes != 0 {
				t.Fatalf("after sweeping everything: %+v, want no keys and no bytes", st)
			}
		})
	}
}

// newMeterFor is a counter of alg as the Store creates it for limit.
func newMeterFor(spec Spec, alg Algorithm, limit uint64) meter {
	m := newMeter(spec, alg)
	m.AllowAt(0, 1, limit)
	return m
}

// The accounting follows a sliding log whose limit is raised or lowered,
// and a counter replaced by one of another layout.
func TestStoreBytesFollowChanges(t *testing.T) {
	spec := mustSpec(t, time.Minute, DefaultBuckets)
	other := mustSpec(t, time.Hour, DefaultBuckets)
	s := NewStore(StoreOptions{Clock: &testclock.Clock{}})
	ctx := context.Background()
	res := make([]Result, 1)
	steps := []Request{
		{Key: "a", Spec: spec, Limit: 10, Hits: 1, Algorithm: SlidingLog},
		{Key: "a", Spec: spec, Limit: 5000, Hits: 1, Algorithm: SlidingLog}, // ring grows
		{Key: "a", Spec: spec, Limit: 3, Hits: 0, Algorithm: SlidingLog},    // may shrink
		{Key: "a", Spec: spec, Limit: 3, Hits: 1, Algorithm: SlidingLog, Negative: true},
		{Key: "a", Spec: other, Limit: 3, Hits: 1},                          // replaced
		{Key: "b", Spec: spec, Limit: 100, Hits: 1, Algorithm: TimeBuckets}, // new key
	}
	for i, r := range steps {
		if err := s.DoAt(ctx, time.Duration(i)*time.Second, []Request{r}, res); err != nil {
			t.Fatal(err)
		}
		if got, want := s.Stats().Bytes, accountedBytes(s); got != want {
			t.Fatalf("step %d: Stats().Bytes = %d, counters account for %d", i, got, want)
		}
	}
}

// TestStoreByteBoundExactFit: counters that fill MaxBytes exactly all stay;
// one more evicts one, and the bound holds.
func TestStoreByteBoundExactFit(t *testing.T) {
	spec := mustSpec(t, time.Minute, DefaultBuckets)
	ctx := context.Background()
	add := func(s *Store, key string) {
		t.Helper()
		res := make([]Result, 1)
		if err := s.DoAt(ctx, time.Second, []Request{{Key: key, Spec: spec, Limit: 10, Hits: 1}}, res); err != nil || !res[0].Allowed {
			t.Fatalf("%s: %+v %v", key, res[0], err)
		}
	}
	one := NewStore(StoreOptions{Clock: &testclock.Clock{}})
	add(one, "k0")
	per := one.Stats().Bytes

	s := NewStore(StoreOptions{Clock: &testclock.Clock{}, MaxBytes: 3 * per})
	for i := range 3 {
		add(s, fmt.Sprint("k", i))
	}
	if st := s.Stats(); st.Keys != 3 || st.Evictions != 0 || st.Bytes != 3*per {
		t.Errorf("3 counters in exactly their bytes: %+v, want 3 keys, no eviction", st)
	}
	add(s, "k3")
	if st := s.Stats(); st.Keys != 3 || st.Evictions != 1 || st.Bytes > 3*per {
		t.Errorf("a fourth: %+v, want 3 keys, 1 eviction, at most %d bytes", st, 3*per)
	}
}
