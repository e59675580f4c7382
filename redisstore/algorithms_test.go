package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/internal/testclock"
	"github.com/leapgate/leapgate/window"
)

// diffKey is one counter of a differential run: its layout, algorithm and
// limit are fixed.
type diffKey struct {
	alg    window.Algorithm
	length time.Duration
	bucket int
	limit  uint64
}

// diffMode is how a differential run's requests are made.
type diffMode int

const (
	plain     diffMode = iota
	charged            // every request is ChargeAlways, with hits up to twice the limit
	held               // requests name one of a few holders, or none (Concurrency)
	relimited          // the limit changes every few batches: a quarter to three times the key's (a reload)
	heldMany           // requests name one of 200 holders, or none (Concurrency at large limits)
)

// TestMatchesInMemoryStore drives the Redis store and the in-memory
// window.Store with the same random batches at the same times (the script
// takes the test's time instead of Redis's TIME) and requires identical
// answers: every algorithm, mixed batches, repeated keys, check-only
// requests, refunds, vetoes, always-charged hits (debts), and Undo of
// recorded hits.
func TestMatchesInMemoryStore(t *testing.T) {
	r := redistest.Start(t)
	ft := &testclock.Clock{}
	s := withFakeTime(newTestStore(t, settingsFor(r.Addr()), Options{}), ft)
	ctx := context.Background()
	sw, tb, fw, lg, cc, bk := window.SlidingWindow, window.TokenBucket, window.FixedWindow, window.SlidingLog, window.Concurrency, window.TimeBuckets
	// every is one key of every algorithm of window's table, so that an
	// algorithm added there is compared here without editing this test.
	var every []diffKey
	for _, a := range window.Algorithms() {
		buckets := 1
		if a.Info().Bucketed {
			buckets = 10
		}
		every = append(every, diffKey{a, 10 * time.Second, buckets, 4})
	}
	for _, tc := range []struct {
		name string
		keys []diffKey
		step time.Duration // time moves by up to this between batches
		mode diffMode
	}{
		{"every_algorithm", every, time.Second, held},
		{"time_buckets", []diffKey{
			{bk, time.Second, 10, 10}, {bk, 10 * time.Second, 20, 5}, {bk, time.Second, 1, 3}, {bk, time.Second, 4, 0},
		}, 120 * time.Millisecond, plain},
		{"sliding", []diffKey{
			{sw, time.Second, 10, 10}, {sw, time.Second, 1, 5}, {sw, 3 * time.Second, 3, 7}, {sw, time.Second, 20, 0},
		}, 120 * time.Millisecond, plain},
		{"sliding_minute", []diffKey{{sw, time.Minute, 20, 100}, {sw, time.Minute, 6, 4}}, 4 * time.Second, plain},
		// Limits above window.Blocks: blocks of several hits, of two sizes.
		{"sliding_blocks", []diffKey{{sw, time.Second, 1, 300}, {sw, 2 * time.Second, 1, 2*window.Blocks + 1}}, 4 * time.Millisecond, plain},
		{"token_bucket", []diffKey{
			{tb, 10 * time.Second, 1, 10}, {tb, 10 * time.Second, 10, 3}, {tb, 60 * time.Second, 20, 7}, {tb, 10 * time.Second, 1, 0},
		}, 2 * time.Second, plain},
		{"token_bucket_fine", []diffKey{{tb, 10 * time.Second, 1, 1000}, {tb, 10 * time.Second, 1, 6}}, 30 * time.Millisecond, plain},
		{"fixed_window", []diffKey{
			{fw, 10 * time.Second, 1, 5}, {fw, 20 * time.Second, 4, 2}, {fw, 10 * time.Second, 10, 0},
		}, 2 * time.Second, plain},
		{"sliding_log", []diffKey{
			{lg, 10 * time.Second, 1, 5}, {lg, 20 * time.Second, 4, 9}, {lg, 10 * time.Second, 1, 0},
		}, 2 * time.Second, plain},
		{"sliding_charge", []diffKey{
			{sw, time.Second, 1, 10}, {sw, time.Second, 1, 300}, {sw, 2 * time.Second, 1, 2*window.Blocks + 1},
		}, 60 * time.Millisecond, charged},
		// Limits raised and cut while the keys count hits: blocks re-sized,
		// across the exact log (up to window.ExactLimit) and larger blocks.
		{"sliding_relimited", []diffKey{{sw, time.Second, 1, 300}, {sw, time.Second, 1, 20}, {sw, 2 * time.Second, 1, 2*window.Blocks + 1}},
			10 * time.Millisecond, relimited},
		// Large logs, weighted hits, refunds and undo across many entries,
		// limits raised and cut (the sorted set's ranks and counts).
		{"sliding_log_large", []diffKey{{lg, time.Second, 1, 300}, {lg, 2 * time.Second, 1, 50}}, 4 * time.Millisecond, relimited},
		// Hundreds of leases, of 200 holders and of nobody: the sorted
		// set's walks from the oldest lease and its counts.
		{"concurrency_large", []diffKey{{cc, 2 * time.Second, 1, 150}, {cc, time.Second, 1, 40}}, 20 * time.Millisecond, heldMany},
		{"fixed_charge", []diffKey{{fw, 10 * time.Second, 1, 5}, {fw, 20 * time.Second, 4, 200}}, 2 * time.Second, charged},
		{"concurrency", []diffKey{{cc, 3 * time.Second, 1, 3}, {cc, 2 * time.Second, 1, 1}, {cc, 10 * time.Second, 1, 0}},
			time.Second, held},
		{"mixed", []diffKey{
			{sw, 10 * time.Second, 10, 6}, {tb, 10 * time.Second, 1, 4}, {fw, 10 * time.Second, 1, 5}, {tb, 30 * time.Second, 3, 9},
			{lg, 10 * time.Second, 1, 4}, {cc, 10 * time.Second, 1, 2},
		}, time.Second, held},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := window.NewStore(window.StoreOptions{Clock: ft})
			reqFor := func(k int) window.Request {
				d := tc.keys[k]
				return window.Request{
					Key:       fmt.Sprintf("%s_%d", t.Name(), k),
					Spec:      mustSpec(t, d.length, d.bucket),
					Limit:     d.limit,
					Algorithm: d.alg,
				}
			}
			rng := rand.New(rand.NewPCG(uint64(len(tc.name)), uint64(tc.step)))
			now := base
			var recorded, refused, vetoed, refunds int
			scale := [2]uint64{1, 1} // the limit in force: the key's × scale[0] / scale[1]
			for step := range 300 {
				now += time.Duration(rng.Int64N(int64(tc.step/time.Microsecond)+1)) * time.Microsecond
				ft.Set(now)
				if tc.mode == relimited && step%25 == 0 {
					scale = [][2]uint64{{1, 1}, {1, 4}, {1, 2}, {2, 1}, {3, 1}}[rng.IntN(5)]
				}
				batch := make([]window.Request, 1+rng.IntN(4))
				for i := range batch {
					k := rng.IntN(len(tc.keys))
					q := reqFor(k)
					q.Hits = uint64(rng.IntN(4)) // 0 is check-only
					switch tc.mode {
					case charged:
						q.ChargeAlways = true
						q.Hits = rng.Uint64N(2*tc.keys[k].limit + 1)
					case held:
						q.Holder = []string{"", "", "a", "b", "c", "d"}[rng.IntN(6)]
					case heldMany:
						if h := rng.IntN(250); h < 200 {
							q.Holder = fmt.Sprint("h", h)
						}
						q.Hits = uint64(rng.IntN(6))
					case relimited:
						q.Limit = max(q.Limit*scale[0]/scale[1], 1)
						q.Hits = uint64(rng.IntN(int(q.Limit/8) + 2))
					}
					q.Veto = rng.IntN(3) > 0
					q.Negative = rng.IntN(5) == 0
					batch[i] = q
				}
				got, err := s.Do(ctx, batch)
				if err != nil {
					t.Fatal(err)
				}
				want := make([]window.Result, len(batch))
				if err := mem.DoAt(ctx, now, batch, want); err != nil {
					t.Fatal(err)
				}
				veto := false
				for i := range batch {
					g, w := got[i], want[i]
					switch {
					case batch[i].Negative:
						refunds++
					case w.Recorded:
						recorded++
					case !w.Allowed:
						refused++
						veto = veto || batch[i].Veto
					}
					if g.Allowed != w.Allowed || g.Recorded != w.Recorded || g.Remaining != w.Remaining || g.Reset != w.Reset ||
						(w.Recorded && g.Bucket != w.Bucket) {
						t.Fatalf("step %d at %v, request %d of %s:\nredis     %+v\nin-memory %+v", step, now-base, i, describe(batch), g, w)
					}
				}
				if veto {
					vetoed++
				}
				if rng.IntN(8) == 0 {
					// take the batch back, on both, at the same time
					if err := s.Undo(ctx, batch, got); err != nil {
						t.Fatal(err)
					}
					if err := mem.Undo(ctx, batch, want); err != nil {
						t.Fatal(err)
					}
				}
			}
			t.Logf("requests recorded %d, refused %d, refunds %d; vetoed batches %d", recorded, refused, refunds, vetoed)
			if recorded == 0 || refused == 0 || refunds == 0 || vetoed == 0 {
				t.Fatal("the random batches missed a case: tune the steps")
			}
		})
	}
}

func describe(batch []window.Request) string {
	out := ""
	for _, q := range batch {
		out += fmt.Sprintf("\n  {%s %v limit=%d hits=%d veto=%t negative=%t}", q.Algorithm, q.Spec.Length(), q.Limit, q.Hits, q.Veto, q.Negative)
	}
	return out
}

// TestMixedBatchOneRoundTrip: a batch mixing every algorithm, check-only
// requests and a refund costs one round trip, and so does its Undo.
func TestMixedBatchOneRoundTrip(t *testing.T) {
	r := redistest.Start(t)
	s := newTestStore(t, settingsFor(r.Addr()), Options{HealthInterval: time.Hour})
	waitHealthy(t, s)
	rt := countRoundTrips(s)
	sp := mustSpec(t, time.Minute, 10)
	ctx := context.Background()
	batch := []window.Request{
		{Key: "rt_sw", Spec: sp, Limit: 10, Hits: 2, Veto: true},
		{Key: "rt_tb", Spec: sp, Limit: 10, Hits: 3, Veto: true, Algorithm: window.TokenBucket},
		{Key: "rt_fw", Spec: sp, Limit: 10, Hits: 4, Veto: true, Algorithm: window.FixedWindow},
		{Key: "rt_fw", Spec: sp, Limit: 10, Hits: 0, Algorithm: window.FixedWindow},
		{Key: "rt_sw", Spec: sp, Limit: 10, Hits: 1, Negative: true},
		{Key: "rt_log", Spec: sp, Limit: 10, Hits: 5, Veto: true, Algorithm: window.SlidingLog},
	}
	before := rt.n.Load()
	res, err := s.Do(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if n := rt.n.Load() - before; n != 1 {
		t.Fatalf("mixed batch: %d round trips, want 1", n)
	}
	for i, want := range []uint64{8, 7, 6, 6, 9, 5} {
		if res[i].Remaining != want || !res[i].Allowed {
			t.Errorf("result %d: %+v, want allowed with %d remaining", i, res[i], want)
		}
	}
	before = rt.n.Load()
	if err := s.Undo(ctx, batch, res); err != nil {
		t.Fatal(err)
	}
	if n := rt.n.Load() - before; n != 1 {
		t.Fatalf("mixed Undo: %d round trips, want 1", n)
	}
	// Undo took back the four admissions (the refund is not undone: it
	// was not recorded); sliding: 2 - 1 (refund) - 2 (undo, floored) = 0.
	check := []window.Request{batch[0], batch[1], batch[2], batch[5]}
	for i := range check {
		check[i].Hits, check[i].Veto = 0, false
	}
	res, err = s.Do(ctx, check)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range res {
		if c.Remaining != 10 {
			t.Errorf("%s after Undo: %+v, want 10 remaining", check[i].Algorithm, c)
		}
	}
}

// TestVetoAcrossAlgorithms: a refused Veto request of any algorithm makes
// the whole batch, whatever its algorithms, record nothing and apply no
// refund; without the veto the others count.
func TestVetoAcrossAlgorithms(t *testing.T) {
	r := redistest.Start(t)
	ft := &testclock.Clock{}
	ft.Set(base)
	s := withFakeTime(newTestStore(t, settingsFor(r.Addr()), Options{}), ft)
	sp := mustSpec(t, time.Minute, 6)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	dump := func() map[string]map[string]string {
		keys, err := rdb.Keys(ctx, "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]map[string]string{}
		for _, k := range keys {
			if typ, _ := rdb.Type(ctx, k).Result(); typ == "string" { // the sliding window's value
				v, err := rdb.Get(ctx, k).Result()
				if err != nil {
					t.Fatal(err)
				}
				m[k] = map[string]string{"value": v}
				continue
			}
			if typ, _ := rdb.Type(ctx, k).Result(); typ == "zset" { // the sliding log's
				zs, err := rdb.ZRangeWithScores(ctx, k, 0, -1).Result()
				if err != nil {
					t.Fatal(err)
				}
				m[k] = map[string]string{}
				for _, z := range zs {
					m[k][fmt.Sprint(z.Member)] = fmt.Sprint(z.Score)
				}
				continue
			}
			m[k], err = rdb.HGetAll(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
		}
		return m
	}
	algs := []window.Algorithm{window.SlidingWindow, window.TokenBucket, window.FixedWindow, window.SlidingLog, window.TimeBuckets}
	for _, vetoer := range algs {
		t.Run(vetoer.String(), func(t *testing.T) {
			key := func(a window.Algorithm) string { return vetoer.String() + "_" + a.String() }
			// Every counter holds 2 of 5; the vetoer's is full.
			for _, a := range algs {
				hits := uint64(2)
				if a == vetoer {
					hits = 5
				}
				res, err := s.Do(ctx, []window.Request{{Key: key(a), Spec: sp, Limit: 5, Hits: hits, Veto: true, Algorithm: a}})
				if err != nil || !res[0].Recorded {
					t.Fatalf("filling %s: %+v %v", a, res, err)
				}
			}
			var batch []window.Request
			for _, a := range algs {
				if a != vetoer {
					batch = append(batch,
						window.Request{Key: key(a), Spec: sp, Limit: 5, Hits: 1, Veto: true, Algorithm: a},
						window.Request{Key: key(a), Spec: sp, Limit: 5, Hits: 2, Negative: true, Algorithm: a})
				}
			}
			batch = append(batch, window.Request{Key: key(vetoer), Spec: sp, Limit: 5, Hits: 1, Veto: true, Algorithm: vetoer})
			before := dump()
			res, err := s.Do(ctx, batch)
			if err != nil {
				t.Fatal(err)
			}
			for i, x := range res {
				if x.Recorded {
					t.Errorf("request %d recorded in a vetoed batch: %+v", i, x)
				}
			}
			if res[len(res)-1].Allowed {
				t.Fatal("the full counter allowed a hit")
			}
			if res[0].Remaining != 3 || !res[0].Allowed {
				t.Errorf("vetoed admission answered %+v, want allowed, 3 remaining (nothing kept)", res[0])
			}
			if after := dump(); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("a vetoed batch changed Redis:\nbefore %v\nafter  %v", before, after)
			}

			// Without the veto (shadow mode) the others count, and the
			// refunds apply after the admissions: 2 + 1 - 2 = 1 counted.
			batch[len(batch)-1].Veto = false
			if _, err := s.Do(ctx, batch); err != nil {
				t.Fatal(err)
			}
			for _, a := range algs {
				if a == vetoer {
					continue
				}
				res, err := s.Do(ctx, []window.Request{{Key: key(a), Spec: sp, Limit: 5, Algorithm: a}})
				if err != nil {
					t.Fatal(err)
				}
				if res[0].Remaining != 4 {
					t.Errorf("%s after admit 1, refund 2: %+v, want 4 remaining", a, res[0])
				}
			}
		})
	}
	// Every key carries a TTL: at most a window and a bucket (sliding), a
	// window (token bucket), the window's end plus one window (fixed).
	for k := range dump() {
		if ttl, err := rdb.PTTL(ctx, k).Result(); err != nil || ttl <= 0 || ttl > 2*sp.Length() {
			t.Errorf("TTL of %s: %v %v", k, ttl, err)
		}
	}
}

// TestClockStepsBack: when Redis's clock steps back (a failover to a node
// whose clock is behind) no algorithm forgets or ignores hits: each stands
// still at the newest time it has written.
func TestClockStepsBack(t *testing.T) {
	r := redistest.Start(t)
	ft := &testclock.Clock{}
	s := withFakeTime(newTestStore(t, settingsFor(r.Addr()), Options{}), ft)
	sp := mustSpec(t, 10*time.Second, 10)
	ctx := context.Background()
	for _, a := range []window.Algorithm{window.SlidingWindow, window.TokenBucket, window.FixedWindow, window.SlidingLog} {
		t.Run(a.String(), func(t *testing.T) {
			do := func(hits uint64) window.Result {
				t.Helper()
				res, err := s.Do(ctx, []window.Request{{Key: "back_" + a.String(), Spec: sp, Limit: 4, Hits: hits, Veto: true, Algorithm: a}})
				if err != nil {
					t.Fatal(err)
				}
				return res[0]
			}
			// 4 hits at 29.5 s (the last second of fixed window 2), then the
			// clock goes back 5 s (to window 2's middle, and 5 buckets back).
			ft.Set(base + 29500*time.Millisecond)
			if r := do(4); !r.Recorded {
				t.Fatalf("filling: %+v", r)
			}
			ft.Set(base + 24500*time.Millisecond)
			r := do(1)
			if r.Allowed {
				t.Fatalf("a hit passed after the clock stepped back: %+v", r)
			}
			if r.Reset <= 5*time.Second {
				t.Errorf("Reset %v: the time lost to the step back (5 s) must be waited out too", r.Reset)
			}
		})
	}
}

// TestRefundClearsLocalCache: a refund makes the replica ask Redis again
// for a key its over-limit cache had refused.
func TestRefundClearsLocalCache(t *testing.T) {
	r := redistest.Start(t)
	ft := &testclock.Clock{}
	ft.Set(base)
	st := settingsFor(r.Addr())
	st.LocalCacheBytes = 1 << 16
	s := withFakeTime(newTestStore(t, st, Options{Clock: ft}), ft)
	sp := mustSpec(t, time.Minute, 6)
	ctx := context.Background()
	for _, a := range []window.Algorithm{window.SlidingWindow, window.TokenBucket, window.FixedWindow, window.SlidingLog} {
		q := window.Request{Key: "cached_" + a.String(), Spec: sp, Limit: 3, Hits: 3, Veto: true, Algorithm: a}
		if res, err := s.Do(ctx, []window.Request{q}); err != nil || !res[0].Recorded {
			t.Fatalf("%s: %+v %v", a, res, err)
		}
		q.Hits = 1
		if res, err := s.Do(ctx, []window.Request{q}); err != nil || res[0].Allowed {
			t.Fatalf("%s over the limit: %+v %v", a, res, err)
		}
		refund := q
		refund.Negative, refund.Hits = true, 2
		res, err := s.Do(ctx, []window.Request{refund})
		if err != nil || !res[0].Allowed || res[0].Remaining != 2 {
			t.Fatalf("%s refund: %+v %v, want allowed with 2 remaining", a, res, err)
		}
		if res, err := s.Do(ctx, []window.Request{q}); err != nil || !res[0].Recorded || res[0].Remaining != 1 {
			t.Fatalf("%s after the refund: %+v %v, want recorded with 1 remaining", a, res, err)
		}
	}
}

// TestMicrosecondBuckets: with 1 µs buckets a bucket epoch has 16 digits;
// it must be written in full (Lua's tostring would give a 14-digit
// exponent form), so that the hits are found again.
func TestMicrosecondBuckets(t *testing.T) {
	r := redistest.Start(t)
	ft := &testclock.Clock{}
	at := base + 123456*time.Microsecond
	ft.Set(at)
	s := withFakeTime(newTestStore(t, settingsFor(r.Addr()), Options{}), ft)
	ctx := context.Background()
	sp := mustSpec(t, time.Second, 1_000_000)
	q := window.Request{Key: "micro", Spec: sp, Limit: 5, Hits: 2, Veto: true, Algorithm: window.TimeBuckets}
	if res, err := s.Do(ctx, []window.Request{q}); err != nil || !res[0].Recorded {
		t.Fatalf("%+v %v", res, err)
	}
	q.Hits = 0
	if res, err := s.Do(ctx, []window.Request{q}); err != nil || res[0].Remaining != 3 {
		t.Fatalf("check after 2 hits: %+v %v, want 3 remaining", res, err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	fields, err := rdb.HKeys(ctx, s.counterKey(&q)).Result()
	if want := fmt.Sprint(int64(at / time.Microsecond)); err != nil || len(fields) != 1 || fields[0] != want {
		t.Fatalf("fields %q %v, want [%s]", fields, err, want)
	}
}

// TestSlidingLogEdge: a sliding log's hit leaves the window exactly W after
// it was admitted (the window is (now-W, now]).
func TestSlidingLogEdge(t *testing.T) {
	r := redistest.Start(t)
	ft := &testclock.Clock{}
	s := withFakeTime(newTestStore(t, settingsFor(r.Addr()), Options{}), ft)
	ctx := context.Background()
	sp := mustSpec(t, 10*time.Second, 1)
	q := []window.Request{{Key: "edge", Spec: sp, Limit: 1, Hits: 1, Veto: true, Algorithm: window.SlidingLog}}
	for _, st := range []struct {
		at       time.Duration
		recorded bool
		reset    time.Duration
	}{
		{0, true, 10 * time.Second},
		{10*time.Second - time.Microsecond, false, time.Microsecond},
		{10 * time.Second, true, 10 * time.Second},
	} {
		ft.Set(base + st.at)
		res, err := s.Do(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Recorded != st.recorded || res[0].Reset != st.reset {
			t.Fatalf("at %v: %+v, want recorded %t, reset %v", st.at, res[0], st.recorded, st.reset)
		}
	}
}

// TestSlidingWindowValueSize: the default sliding window is one string of at
// most 20 + 2*window.Blocks bytes (at most 256), however many hits and
// whatever the limit; the test logs Redis's MEMORY USAGE for the key.
func TestSlidingWindowValueSize(t *testing.T) {
	if testing.Short() {
		t.Skip("80,000 script calls, about 10 s")
	}
	r := redistest.Start(t)
	ft := &testclock.Clock{}
	s := withFakeTime(newTestStore(t, settingsFor(r.Addr()), Options{}), ft)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	sp := mustSpec(t, time.Minute, 1)
	for _, limit := range []uint64{10, window.Blocks, 10_000, 1 << 31} {
		key := fmt.Sprint("size_", limit)
		// One hit every 10 µs for up to a second: every block closes.
		for i := range 20_000 {
			ft.Set(base + time.Duration(i)*10*time.Microsecond)
			if _, err := s.Do(ctx, []window.Request{{Key: key, Spec: sp, Limit: limit, Hits: max(limit/20_000, 1)}}); err != nil {
				t.Fatal(err)
			}
		}
		rk := s.counterKey(&window.Request{Key: key})
		n, err := rdb.StrLen(ctx, rk).Result()
		if err != nil {
			t.Fatal(err)
		}
		most := int64(20 + 2*window.Blocks)
		if n > most || most > 256 || (limit == window.Blocks && n != most) {
			t.Fatalf("limit %d: value of %d bytes, want at most %d (and at most 256)", limit, n, most)
		}
		usage, _ := rdb.MemoryUsage(ctx, rk).Result()
		t.Logf("limit %d: value %d bytes, MEMORY USAGE %d bytes (key name %d bytes)", limit, n, usage, len(rk))
	}
}
