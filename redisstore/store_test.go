package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/internal/testclock"
	"github.com/leapgate/leapgate/window"
)

func mustSpec(t testing.TB, length time.Duration, buckets int) window.Spec {
	t.Helper()
	sp, err := window.NewSpec(length, buckets)
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

// withFakeTime makes clock, in whole microseconds, the Redis time of s's
// scripts instead of Redis's TIME.
func withFakeTime(s *Store, clock *testclock.Clock) *Store {
	s.nowMicros = func() int64 { return int64(clock.Now() / time.Microsecond) }
	return s
}

// base is a fake "now" far from zero, like Unix time.
const base = 1_800_000_000 * time.Second

// TestAnswers checks exact answers of hand-made cases (1 s window, 10
// buckets of 100 ms).
func TestAnswers(t *testing.T) {
	r := redistest.Start(t)
	ft := &testclock.Clock{}
	s := withFakeTime(newTestStore(t, settingsFor(r.Addr()), Options{}), ft)
	ctx := context.Background()
	sp := mustSpec(t, time.Second, 10)
	type step struct {
		at          time.Duration // since base
		hits, limit uint64
		allowed     bool
		recorded    bool
		remaining   uint64
		reset       time.Duration
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"check-only on empty counter", []step{
			{at: 0, hits: 0, limit: 3, allowed: true, remaining: 3, reset: 0},
		}},
		{"check-only at limit 0", []step{
			// as window.Store answers a key without a counter
			{at: 0, hits: 0, limit: 0, allowed: false, remaining: 0, reset: 0},
		}},
		{"fill, refuse, age out", []step{
			{at: 50 * time.Millisecond, hits: 2, limit: 3, allowed: true, recorded: true, remaining: 1, reset: 1050 * time.Millisecond},
			{at: 250 * time.Millisecond, hits: 1, limit: 3, allowed: true, recorded: true, remaining: 0, reset: 1050 * time.Millisecond},
			// refused: passes once bucket 0 (2 hits) leaves, at 1.1 s
			{at: 300 * time.Millisecond, hits: 1, limit: 3, allowed: false, remaining: 0, reset: 800 * time.Millisecond},
			{at: 300 * time.Millisecond, hits: 0, limit: 3, allowed: false, remaining: 0, reset: 800 * time.Millisecond},
			// still counted at 1.05 s: the oldest bucket is counted in full
			{at: 1050 * time.Millisecond, hits: 1, limit: 3, allowed: false, remaining: 0, reset: 50 * time.Millisecond},
			{at: 1100 * time.Millisecond, hits: 2, limit: 3, allowed: true, recorded: true, remaining: 0, reset: 1100 * time.Millisecond},
		}},
		{"more hits than the limit", []step{
			{at: 0, hits: 5, limit: 4, allowed: false, remaining: 4, reset: time.Second},
		}},
		{"check-only does not count", []step{
			{at: 0, hits: 0, limit: 1, allowed: true, remaining: 1},
			{at: 0, hits: 0, limit: 1, allowed: true, remaining: 1},
			{at: 0, hits: 1, limit: 1, allowed: true, recorded: true, remaining: 0, reset: 1100 * time.Millisecond},
			{at: 0, hits: 0, limit: 1, allowed: false, remaining: 0, reset: 1100 * time.Millisecond},
		}},
		{"raised limit applies at once", []step{
			{at: 0, hits: 2, limit: 2, allowed: true, recorded: true, remaining: 0, reset: 1100 * time.Millisecond},
			{at: 0, hits: 1, limit: 2, allowed: false, remaining: 0, reset: 1100 * time.Millisecond},
			{at: 0, hits: 1, limit: 5, allowed: true, recorded: true, remaining: 2, reset: 1100 * time.Millisecond},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := strings.ReplaceAll(t.Name(), " ", "_")
			for i, st := range tc.steps {
				ft.Set(base + st.at)
				got, err := s.Do(ctx, []window.Request{{Key: key, Spec: sp, Limit: st.limit, Hits: st.hits, Veto: true, Algorithm: window.TimeBuckets}})
				if err != nil {
					t.Fatal(err)
				}
				g := got[0]
				if g.Allowed != st.allowed || g.Recorded != st.recorded || g.Remaining != st.remaining || g.Reset != st.reset {
					t.Errorf("step %d: got allowed=%t recorded=%t remaining=%d reset=%v, want %t %t %d %v",
						i, g.Allowed, g.Recorded, g.Remaining, g.Reset, st.allowed, st.recorded, st.remaining, st.reset)
				}
			}
		})
	}
}

// TestNoBoundaryBurst: a full limit at the end of one window and another
// at the start of the next must not both pass.
func TestNoBoundaryBurst(t *testing.T) {
	r := redistest.Start(t)
	ft := &testclock.Clock{}
	s := withFakeTime(newTestStore(t, settingsFor(r.Addr()), Options{}), ft)
	sp := mustSpec(t, time.Second, 10)
	ctx := context.Background()
	admitted := 0
	for _, at := range []time.Duration{990 * time.Millisecond, 1010 * time.Millisecond} {
		ft.Set(base + at)
		for range 10 {
			res, err := s.Do(ctx, []window.Request{{Key: "burst", Spec: sp, Limit: 10, Hits: 1, Veto: true}})
			if err != nil {
				t.Fatal(err)
			}
			if res[0].Allowed {
				admitted++
			}
		}
	}
	if admitted != 10 {
		t.Fatalf("admitted %d hits within 20 ms across a window edge, want 10", admitted)
	}
}

// TestVetoAllOrNothing: one refused Veto request records nothing for the
// whole batch; refused non-Veto requests do not stop the others.
func TestVetoAllOrNothing(t *testing.T) {
	r := redistest.Start(t)
	ft := &testclock.Clock{}
	ft.Set(base)
	s := withFakeTime(newTestStore(t, settingsFor(r.Addr()), Options{}), ft)
	sp := mustSpec(t, time.Minute, 6)
	ctx := context.Background()
	// count asks Redis what the key holds: a check under a large limit.
	count := func(key string) int64 {
		res, err := s.Do(ctx, []window.Request{{Key: key, Spec: sp, Limit: 1000}})
		if err != nil {
			t.Fatal(err)
		}
		return 1000 - int64(res[0].Remaining)
	}
	// "full" is at its limit.
	if _, err := s.Do(ctx, []window.Request{{Key: "full", Spec: sp, Limit: 2, Hits: 2, Veto: true}}); err != nil {
		t.Fatal(err)
	}

	batch := []window.Request{
		{Key: "a", Spec: sp, Limit: 10, Hits: 3, Veto: true},
		{Key: "full", Spec: sp, Limit: 2, Hits: 1, Veto: true},
		{Key: "a", Spec: sp, Limit: 10, Hits: 1, Veto: true}, // same key twice
	}
	res, err := s.Do(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].Allowed || res[1].Allowed || !res[2].Allowed {
		t.Fatalf("allowed = %t %t %t, want true false true", res[0].Allowed, res[1].Allowed, res[2].Allowed)
	}
	for i, x := range res {
		if x.Recorded {
			t.Errorf("result %d recorded in a vetoed batch", i)
		}
	}
	if res[0].Remaining != 10 {
		t.Errorf("remaining of a = %d, want 10 (nothing recorded)", res[0].Remaining)
	}
	if n := count("a"); n != 0 {
		t.Fatalf("a counts %d hits after a vetoed batch", n)
	}

	// The same refusal without Veto (shadow mode) lets the others count.
	batch[1].Veto = false
	res, err = s.Do(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].Recorded || res[1].Recorded || !res[2].Recorded {
		t.Fatalf("recorded = %t %t %t, want true false true", res[0].Recorded, res[1].Recorded, res[2].Recorded)
	}
	if n := count("a"); n != 4 {
		t.Fatalf("a counts %d hits, want 4", n)
	}
	if res[2].Remaining != 6 {
		t.Errorf("remaining of a = %d, want 6", res[2].Remaining)
	}

	// Undo takes them back.
	if err := s.Undo(ctx, batch, res); err != nil {
		t.Fatal(err)
	}
	if n := count("a"); n != 0 {
		t.Fatalf("a counts %d hits after Undo, want 0", n)
	}
	// Undoing again does not go below zero.
	if err := s.Undo(ctx, batch, res); err != nil {
		t.Fatal(err)
	}
	if n := count("a"); n != 0 {
		t.Fatalf("a counts %d hits after a second Undo, want 0", n)
	}
}

// TestTTLOnEveryKey: every key written carries a TTL of at most a window
// plus a bucket, and stale buckets are pruned.
func TestTTLOnEveryKey(t *testing.T) {
	r := redistest.Start(t)
	ft := &testclock.Clock{}
	ft.Set(base)
	st := settingsFor(r.Addr())
	st.KeyPrefix = "lg_"
	s := withFakeTime(newTestStore(t, st, Options{}), ft)
	ctx := context.Background()
	specs := []window.Spec{mustSpec(t, time.Second, 10), mustSpec(t, time.Minute, 20), mustSpec(t, time.Hour, 4)}
	for i := range 30 {
		sp := specs[i%len(specs)]
		ft.Advance(7 * time.Millisecond)
		if _, err := s.Do(ctx, []window.Request{
			{Key: fmt.Sprint("k", i%10), Spec: sp, Limit: 100, Hits: 1, Veto: true},
			{Key: fmt.Sprint("check", i), Spec: sp, Limit: 100, Hits: 0, Veto: true},
		}); err != nil {
			t.Fatal(err)
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 10 {
		t.Fatalf("keys %v: want the 10 counted keys (check-only creates none)", keys)
	}
	for _, k := range keys {
		if !strings.HasPrefix(k, "lg_{k") {
			t.Errorf("key %q lacks the prefix and hash tag", k)
		}
		ttl, err := rdb.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 || ttl > time.Hour+15*time.Minute {
			t.Errorf("key %s has TTL %v", k, ttl)
		}
	}

	// Buckets that left the window are pruned on the next call.
	sp := specs[0]
	ft.Set(base + time.Hour)
	for i := range 12 {
		ft.Advance(100 * time.Millisecond)
		if _, err := s.Do(ctx, []window.Request{{Key: "prune", Spec: sp, Limit: 100, Hits: 1}}); err != nil {
			t.Fatal(err)
		}
		if n, _ := rdb.HLen(ctx, "lg_{prune}").Result(); n > int64(sp.Buckets()+1) {
			t.Fatalf("step %d: hash holds %d buckets, at most %d are in the window", i, n, sp.Buckets()+1)
		}
	}
}

// TestNoScriptReload: after SCRIPT FLUSH (or a Redis restart) the script is
// sent again and the call succeeds.
func TestNoScriptReload(t *testing.T) {
	r := redistest.Start(t)
	s := newTestStore(t, settingsFor(r.Addr()), Options{})
	sp := mustSpec(t, time.Second, 10)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	for i := range 3 {
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		res, err := s.Do(ctx, []window.Request{{Key: "ns", Spec: sp, Limit: 10, Hits: 1, Veto: true}})
		if err != nil {
			t.Fatalf("call %d after SCRIPT FLUSH: %v", i, err)
		}
		if !res[0].Recorded || res[0].Remaining != uint64(9-i) {
			t.Fatalf("call %d: %+v", i, res[0])
		}
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := s.Undo(ctx, []window.Request{{Key: "ns", Spec: sp, Hits: 0}}, res); err != nil {
			t.Fatalf("Undo after SCRIPT FLUSH: %v", err)
		}
	}
}

// TestOneRoundTrip: a Do costs one round trip whatever the number of
// descriptors.
func TestOneRoundTrip(t *testing.T) {
	r := redistest.Start(t)
	s := newTestStore(t, settingsFor(r.Addr()), Options{HealthInterval: time.Hour})
	waitHealthy(t, s)
	rt := countRoundTrips(s)
	sp := mustSpec(t, time.Second, 10)
	ctx := context.Background()
	for _, n := range []int{1, 3, 10} {
		reqs := make([]window.Request, n)
		for i := range reqs {
			reqs[i] = window.Request{Key: fmt.Sprint("rt", i), Spec: sp, Limit: 1000, Hits: 1, Veto: true}
		}
		before := rt.n.Load()
		if _, err := s.Do(ctx, reqs); err != nil {
			t.Fatal(err)
		}
		if got := rt.n.Load() - before; got != 1 {
			t.Errorf("%d descriptors: %d round trips, want 1", n, got)
		}
	}
}

// TestGlobalLimitAcrossStores: two Stores (two replicas) sharing one Redis
// admit exactly the limit under concurrent load within one window, Redis's
// clock deciding.
func TestGlobalLimitAcrossStores(t *testing.T) {
	r := redistest.Start(t)
	a := newTestStore(t, settingsFor(r.Addr()), Options{})
	b := newTestStore(t, settingsFor(r.Addr()), Options{})
	waitHealthy(t, a, b)
	// A window far longer than the test: every admitted hit is inside one
	// window, so the limit is an exact bound on the admitted total.
	sp := mustSpec(t, time.Hour, 60)
	const limit = 150
	ctx := context.Background()
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		st := a
		if w%2 == 1 {
			st = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 40 {
				hits := uint64(1 + w%3)
				res, err := st.Do(ctx, []window.Request{
					{Key: "global", Spec: sp, Limit: limit, Hits: hits, Veto: true},
					{Key: fmt.Sprint("other", w), Spec: sp, Limit: 1000, Hits: 1, Veto: true},
				})
				if err != nil {
					t.Error(err)
					return
				}
				if res[0].Recorded {
					admitted.Add(int64(hits))
				} else {
					refused.Add(1)
					if res[1].Recorded {
						t.Error("a vetoed batch recorded its other request")
					}
				}
			}
		}()
	}
	wg.Wait()
	// 16*40 requests of 2 hits on average: far more than the limit; the
	// last few hits may not fit exactly, so the total is within 2 of it.
	if n := admitted.Load(); n > limit || n < limit-2 {
		t.Fatalf("admitted %d hits across two replicas, want %d (or just below)", n, limit)
	}
	if refused.Load() == 0 {
		t.Fatal("nothing was refused")
	}
}

// skewedClock is a local clock far off the others.
type skewedClock struct {
	c    window.Clock
	skew time.Duration
}

func (s skewedClock) Now() time.Duration { return s.c.Now() + s.skew }

// TestClockSkewIrrelevant: replicas whose local clocks disagree by hours
// agree on every answer, because Redis's TIME decides the window.
func TestClockSkewIrrelevant(t *testing.T) {
	r := redistest.Start(t)
	st := settingsFor(r.Addr())
	st.LocalCacheBytes = 1 << 20 // the only user of the local clock
	mono := window.NewMonotonicClock()
	a := newTestStore(t, st, Options{Clock: mono})
	b := newTestStore(t, st, Options{Clock: skewedClock{mono, 3 * time.Hour}})
	c := newTestStore(t, st, Options{Clock: skewedClock{mono, -5 * time.Hour}})
	waitHealthy(t, a, b, c)
	sp := mustSpec(t, time.Minute, 60)
	ctx := context.Background()
	stores := []*Store{a, b, c}
	admitted := 0
	var resets []time.Duration
	for i := range 30 {
		res, err := stores[i%3].Do(ctx, []window.Request{{Key: "skew", Spec: sp, Limit: 20, Hits: 1, Veto: true}})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Allowed {
			admitted++
		} else {
			resets = append(resets, res[0].Reset)
		}
	}
	if admitted != 20 {
		t.Fatalf("admitted %d, want 20", admitted)
	}
	// Every replica's Retry-After names the same moment (minus the time
	// between the calls): none is hours off.
	for _, rs := range resets {
		if rs <= 0 || rs > sp.Length()+sp.BucketLength() {
			t.Fatalf("Reset %v out of range (0, %v]: a skewed clock leaked in", rs, sp.Length()+sp.BucketLength())
		}
	}
}

// TestInvalidSpec: specs the script cannot represent are errors, not
// silent truncation.
func TestInvalidSpec(t *testing.T) {
	r := redistest.Start(t)
	s := newTestStore(t, settingsFor(r.Addr()), Options{})
	ctx := context.Background()
	odd := mustSpec(t, 1000*time.Nanosecond, 8) // 125 ns buckets
	for _, sp := range []window.Spec{{}, odd} {
		if _, err := s.Do(ctx, []window.Request{{Key: "x", Spec: sp, Limit: 1, Hits: 1}}); err == nil {
			t.Errorf("spec %+v: no error", sp)
		}
	}
	// An unknown algorithm is an error, and CheckRequest says so
	// beforehand (the service rejects such rules when loading).
	sp := mustSpec(t, time.Second, 10)
	for _, a := range append(window.Algorithms(), window.Concurrency+1) {
		q := window.Request{Key: "alg", Spec: sp, Limit: 1, Hits: 1, Algorithm: a}
		_, err := s.Do(ctx, []window.Request{q})
		if checked := s.CheckRequest(&q); (checked == nil) != (err == nil) || (checked == nil) != a.Valid() {
			t.Errorf("%v: CheckRequest %v, Do error %v", a, checked, err)
		}
	}
	// A sliding log's limit is bounded, as in memory.
	if _, err := s.Do(ctx, []window.Request{{Key: "log", Spec: sp, Limit: window.MaxLogLimit + 1, Hits: 1, Algorithm: window.SlidingLog}}); !errors.Is(err, window.ErrLogLimit) {
		t.Errorf("sliding log above MaxLogLimit: %v, want ErrLogLimit", err)
	}
	// Empty batches cost nothing.
	if res, err := s.Do(ctx, nil); err != nil || len(res) != 0 {
		t.Fatalf("empty batch: %v %v", res, err)
	}
	// A cancelled context is the caller's error, not Redis's failure.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Do(cctx, []window.Request{{Key: "x", Spec: mustSpec(t, time.Second, 10), Limit: 1, Hits: 1}}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

// TestConcurrentCallsMerge: concurrent Do calls share script calls (fewer
// round trips than calls) and each keeps its own all-or-nothing answer: a
// call vetoed by a refused descriptor records nothing even when its groups
// ran in one script with others that recorded.
func TestConcurrentCallsMerge(t *testing.T) {
	r := redistest.Start(t)
	s := newTestStore(t, settingsFor(r.Addr()), Options{HealthInterval: time.Hour})
	waitHealthy(t, s)
	rt := countRoundTrips(s)
	sp := mustSpec(t, time.Minute, 10)
	ctx := context.Background()
	const callers, each = 50, 20
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			for i := range each {
				reqs := []window.Request{{Key: "shared", Spec: sp, Limit: 1_000_000, Hits: 1, Veto: true}}
				vetoed := (g+i)%2 == 0
				if vetoed {
					reqs = append(reqs, window.Request{Key: "banned", Spec: sp, Limit: 0, Hits: 1, Veto: true})
				}
				res, err := s.Do(ctx, reqs)
				if err != nil {
					t.Error(err)
					return
				}
				if vetoed != !res[0].Recorded {
					t.Errorf("call vetoed=%v answered %+v", vetoed, res)
				}
				if res[0].Recorded {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	res, err := s.Do(ctx, []window.Request{{Key: "shared", Spec: sp, Limit: 1_000_000, Hits: 0}})
	if err != nil {
		t.Fatal(err)
	}
	if used := 1_000_000 - res[0].Remaining; used != uint64(admitted.Load()) || used != callers*each/2 {
		t.Errorf("shared counts %d hits; %d calls recorded, want %d", used, admitted.Load(), callers*each/2)
	}
	if n := rt.n.Load(); n >= callers*each {
		t.Errorf("%d round trips for %d calls: nothing was merged", n, callers*each)
	}
	t.Logf("%d calls in %d round trips", callers*each, rt.n.Load())
}

// TestRedisErrorReplies: a call Redis answers with an error (here a
// counter that another client overwrote with a string) fails, and counts in
// leapgate_redis_errors_total for its operation; a call that succeeds
// counts nothing. The undo script is the unmerged call, the allow script
// the merged one.
func TestRedisErrorReplies(t *testing.T) {
	r := redistest.Start(t)
	s := newTestStore(t, settingsFor(r.Addr()), Options{HealthInterval: time.Hour})
	waitHealthy(t, s)
	admin := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer admin.Close()
	ctx := context.Background()
	sp := mustSpec(t, time.Minute, 6)
	reqs := []window.Request{{Key: "k", Spec: sp, Limit: 10, Hits: 1}}
	errorsOf := func(op string) float64 { return testutil.ToFloat64(s.metrics.op(op).errors) }

	res, err := s.Do(ctx, reqs)
	if err != nil || !res[0].Recorded {
		t.Fatalf("Do: %+v %v", res, err)
	}
	if err := s.Undo(ctx, reqs, res); err != nil {
		t.Fatalf("Undo: %v", err)
	}
	if got := errorsOf("do") + errorsOf("undo"); got != 0 {
		t.Fatalf("%v errors counted for calls that succeeded", got)
	}

	res, err = s.Do(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Set(ctx, s.counterKey(&reqs[0]), "not a counter", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Undo(ctx, reqs, res); err == nil {
		t.Error("Undo of an overwritten counter succeeded, want the script's error")
	}
	if got := errorsOf("undo"); got != 1 {
		t.Errorf("undo errors %v, want 1", got)
	}
	if _, err := s.Do(ctx, reqs); err == nil {
		t.Error("Do on an overwritten counter succeeded, want the script's error")
	}
	if got := errorsOf("do"); got != 1 {
		t.Errorf("do errors %v, want 1", got)
	}
}
