package window

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leapgate/leapgate/internal/testclock"
)

func TestGCRABurstAndRate(t *testing.T) {
	tests := []struct {
		window time.Duration
		limit  uint64
	}{
		{time.Second, 10},
		{time.Second, 3}, // emission interval not a whole number of ns
		{time.Minute, 1000},
		{time.Second, 1},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d per %v", tt.limit, tt.window), func(t *testing.T) {
			g := NewGCRA(mustSpec(t, tt.window, 1))
			start := time.Hour
			for i := range tt.limit {
				r := g.AllowAt(start, 1, tt.limit)
				if !r.Allowed || r.Remaining != tt.limit-1-i {
					t.Fatalf("burst hit %d: %+v, want allowed, remaining %d", i, r, tt.limit-1-i)
				}
			}
			if r := g.AllowAt(start, 1, tt.limit); r.Allowed {
				t.Fatalf("hit beyond the burst allowed: %+v", r)
			}
			// Hammer for 10 windows: at most limit per window after the burst.
			admitted := uint64(0)
			step := tt.window / 1000
			for now := start; now < start+10*tt.window; now += step {
				if g.AllowAt(now, 1, tt.limit).Allowed {
					admitted++
				}
			}
			if admitted > 10*tt.limit || admitted < 10*tt.limit-1 {
				t.Fatalf("admitted %d over 10 windows after the burst, want %d", admitted, 10*tt.limit)
			}
		})
	}
}

// The retry time is exact, and honours the number of hits asked for.
func TestGCRARetryExact(t *testing.T) {
	for _, hits := range []uint64{1, 3, 10} {
		t.Run(fmt.Sprint("hits ", hits), func(t *testing.T) {
			g := NewGCRA(mustSpec(t, time.Second, 1))
			g.AllowAt(0, 10, 10)
			now := 250 * time.Millisecond
			r := g.AllowAt(now, hits, 10)
			if hits <= 2 {
				if !r.Allowed {
					t.Fatalf("2.5 tokens refilled but %d refused: %+v", hits, r)
				}
				return
			}
			if r.Allowed || r.Reset <= 0 {
				t.Fatalf("refused with a Reset expected: %+v", r)
			}
			if g.AllowAt(now+r.Reset-time.Nanosecond, hits, 10).Allowed {
				t.Fatalf("allowed before Reset %v", r.Reset)
			}
			if !g.AllowAt(now+r.Reset, hits, 10).Allowed {
				t.Fatalf("refused at Reset %v", r.Reset)
			}
		})
	}
}

func TestGCRAEdgeCases(t *testing.T) {
	spec := mustSpec(t, time.Second, 1)
	g := NewGCRA(spec)
	if r := g.AllowAt(0, 11, 10); r.Allowed || r.Reset != time.Second {
		t.Fatalf("more hits than the limit: %+v", r)
	}
	if r := g.AllowAt(0, 1, 0); r.Allowed {
		t.Fatalf("limit 0 allowed: %+v", r)
	}
	// Clock step back: the burst taken at 10s is not given back at 5s.
	g.AllowAt(10*time.Second, 10, 10)
	if r := g.AllowAt(5*time.Second, 1, 10); r.Allowed {
		t.Fatalf("clock step back failed open: %+v", r)
	}
	// Refund of 2 gives exactly 2 tokens back, never more than full.
	g.refund(10*time.Second, 2, 10)
	if r := g.AllowAt(10*time.Second, 2, 10); !r.Allowed {
		t.Fatalf("refunded tokens not available: %+v", r)
	}
	if r := g.AllowAt(10*time.Second, 1, 10); r.Allowed {
		t.Fatalf("refund gave back too much: %+v", r)
	}
	g.refund(10*time.Second, 1000, 10)
	if r := g.AllowAt(10*time.Second, 0, 10); r.Remaining != 10 || r.Reset != 0 {
		t.Fatalf("after a refund of everything: %+v, want full with Reset 0", r)
	}
}

func TestFixedCounter(t *testing.T) {
	f := NewFixedCounter(mustSpec(t, time.Second, 1))
	for i := range 5 {
		if r := f.AllowAt(999*time.Millisecond, 1, 5); !r.Allowed || r.Reset != time.Millisecond {
			t.Fatalf("hit %d: %+v", i, r)
		}
	}
	for range 100 { // refused hits are not counted
		if f.AllowAt(999*time.Millisecond, 1, 5).Allowed {
			t.Fatal("6th hit allowed")
		}
	}
	// envoyproxy/ratelimit's behaviour: the next window starts empty, so 2x
	// the limit passes within 2 ms around the edge.
	for i := range 5 {
		if r := f.AllowAt(time.Second, 1, 5); !r.Allowed || r.Reset != time.Second {
			t.Fatalf("next window hit %d: %+v", i, r)
		}
	}
	// Clock step back: stays in the newer window, still full.
	if r := f.AllowAt(500*time.Millisecond, 1, 5); r.Allowed {
		t.Fatalf("clock step back failed open: %+v", r)
	}
	f.refund(time.Second, 2, 5)
	if r := f.AllowAt(time.Second, 2, 5); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("after refund of 2: %+v", r)
	}
	f.undo(1, 2, 5)
	if r := f.AllowAt(time.Second, 0, 5); r.Remaining != 2 {
		t.Fatalf("after undo of 2: %+v", r)
	}
	f.undo(0, 2, 5) // an older window: nothing to undo
	if r := f.AllowAt(time.Second, 0, 5); r.Remaining != 2 {
		t.Fatalf("undo of an old window changed the count: %+v", r)
	}
}

// Every algorithm admits exactly limit at one instant under concurrency.
func TestAlgorithmsAtomicAdmission(t *testing.T) {
	spec := mustSpec(t, time.Second, 10)
	for _, alg := range []Algorithm{SlidingWindow, TokenBucket, FixedWindow, SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			m := newMeter(spec, alg)
			var admitted atomic.Uint64
			var wg sync.WaitGroup
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 500 {
						if m.AllowAt(time.Hour, 1, 777).Allowed {
							admitted.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if got := admitted.Load(); got != 777 {
				t.Fatalf("admitted %d, want exactly 777", got)
			}
		})
	}
}

func TestStoreAlgorithmsAndRefunds(t *testing.T) {
	spec := mustSpec(t, time.Second, 10)
	ctx := context.Background()
	clock := &testclock.Clock{}
	s := NewStore(StoreOptions{Clock: clock})
	do := func(reqs ...Request) []Result {
		t.Helper()
		res, err := s.Do(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// A token bucket and a sliding window on different keys.
	for range 3 {
		do(Request{Key: "tb", Spec: spec, Limit: 3, Hits: 1, Algorithm: TokenBucket})
	}
	if r := do(Request{Key: "tb", Spec: spec, Limit: 3, Hits: 1, Algorithm: TokenBucket}); r[0].Allowed {
		t.Fatalf("token bucket over its burst: %+v", r[0])
	}
	// The same key with another algorithm gets a new counter.
	if r := do(Request{Key: "tb", Spec: spec, Limit: 3, Hits: 3, Algorithm: FixedWindow}); !r[0].Allowed {
		t.Fatalf("algorithm change did not replace the counter: %+v", r[0])
	}
	if st := s.Stats(); st.Replaced != 1 {
		t.Fatalf("%+v, want one replacement", st)
	}
	// Refunds: newest first, floored at zero, applied only without a veto.
	do(Request{Key: "sw", Spec: spec, Limit: 10, Hits: 6})
	res := do(
		Request{Key: "sw", Spec: spec, Limit: 10, Hits: 4, Negative: true},
		Request{Key: "other", Spec: spec, Limit: 0, Hits: 1, Veto: true},
	)
	if res[0].Recorded || s.CountAt("sw", clock.Now()) != 6 {
		t.Fatalf("refund applied in a vetoed batch: %+v, count %d", res[0], s.CountAt("sw", clock.Now()))
	}
	res = do(Request{Key: "sw", Spec: spec, Limit: 10, Hits: 4, Negative: true})
	if !res[0].Allowed || res[0].Remaining != 8 || s.CountAt("sw", clock.Now()) != 2 {
		t.Fatalf("refund of 4: %+v, count %d, want remaining 8", res[0], s.CountAt("sw", clock.Now()))
	}
	do(Request{Key: "sw", Spec: spec, Limit: 10, Hits: 40, Negative: true})
	if got := s.CountAt("sw", clock.Now()); got != 0 {
		t.Fatalf("refund below zero: count %d", got)
	}
	if st := s.Stats(); st.Keys != 2 {
		t.Fatalf("refunds or checks created keys: %+v", st)
	}
	if _, err := s.Do(ctx, []Request{{Key: "x", Spec: spec, Limit: 1, Hits: 1, Algorithm: 9}}); err == nil {
		t.Fatal("unknown algorithm accepted")
	}
}

// A fixed window idle for 2^31 windows or more (a multiple of 2^32
// included) starts empty; the 32-bit tag never aliases.
func TestFixedCounterIdleBeyondTagRange(t *testing.T) {
	spec := mustSpec(t, time.Nanosecond, 1)
	for _, idle := range []int64{1 << 31, 1<<31 + 5, 3 << 30, 1<<32 + 7, 3 << 31} {
		f := NewFixedCounter(spec)
		f.AllowAt(100, 5, 5)
		later := time.Duration(100 + idle)
		if r := f.AllowAt(later, 5, 5); !r.Allowed || r.Reset != time.Nanosecond {
			t.Fatalf("after %d idle windows: %+v, want a fresh window", idle, r)
		}
	}
}

// A lowered limit applies at once and never reports a wrapped Remaining.
func TestGCRALoweredLimit(t *testing.T) {
	g := NewGCRA(mustSpec(t, time.Second, 1))
	g.AllowAt(0, 100, 100)
	r := g.AllowAt(0, 1, 10)
	if r.Allowed || r.Remaining != 0 {
		t.Fatalf("after 100 hits, limit lowered to 10: %+v, want refused with Remaining 0", r)
	}
	if r := g.AllowAt(0, 0, 10); r.Allowed || r.Remaining != 0 {
		t.Fatalf("check after a lowered limit: %+v", r)
	}
}

// TestParseAlgorithm: every algorithm's name parses back to it; other names
// do not.
func TestParseAlgorithm(t *testing.T) {
	for a := SlidingWindow; a <= TimeBuckets; a++ {
		if got, ok := ParseAlgorithm(a.String()); !ok || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %t", a.String(), got, ok)
		}
	}
	for _, name := range []string{"", "leaky_bucket", "Sliding_Window", "Algorithm(5)"} {
		if _, ok := ParseAlgorithm(name); ok {
			t.Errorf("ParseAlgorithm(%q) accepted", name)
		}
	}
}

// TestCheckLimit: only a sliding log above MaxLogLimit is refused.
func TestCheckLimit(t *testing.T) {
	for _, tc := range []struct {
		alg   Algorithm
		limit uint64
		ok    bool
	}{
		{SlidingLog, MaxLogLimit, true},
		{SlidingLog, MaxLogLimit + 1, false},
		{SlidingWindow, MaxLimit + 1, true},
		{TimeBuckets, MaxLogLimit + 1, true},
	} {
		if err := CheckLimit(tc.alg, tc.limit); (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrLogLimit)) {
			t.Errorf("CheckLimit(%v, %d) = %v", tc.alg, tc.limit, err)
		}
	}
}

// TestGCRAExactAnswers: a token bucket of 2 per second, to the
// nanosecond: an emission interval of 500 ms, a check that finds the last
// token allowed, the time until full after a take, and when it is idle.
func TestGCRAExactAnswers(t *testing.T) {
	const ms = time.Millisecond
	g := NewGCRA(mustSpec(t, time.Second, 1))
	t0 := 10 * time.Second
	if r := g.AllowAt(t0, 1, 2); !r.Allowed || r.Remaining != 1 || r.Reset != 500*ms {
		t.Errorf("the first take %+v, want allowed, 1 left, full again in 500ms", r)
	}
	if r := g.AllowAt(t0, 0, 2); !r.Allowed || r.Remaining != 1 {
		t.Errorf("a check with one token left %+v, want allowed, 1 left", r)
	}
	if g.idleAt(t0 + 500*ms - 1) {
		t.Error("idle 1ns before the bucket is full again")
	}
	if !g.idleAt(t0 + 500*ms) {
		t.Error("not idle once the bucket is full again")
	}
	g.AllowAt(t0+500*ms, 2, 2)
	if r := g.AllowAt(t0+500*ms, 1, 2); r.Allowed || r.Reset != 500*ms {
		t.Errorf("an empty bucket %+v, want refused for exactly 500ms", r)
	}
}

// TestFixedCounterEdges: a fixed window's answers at its edges, for
// AllowAt and ChargeAt (hits consumed whether they fit or not).
func TestFixedCounterEdges(t *testing.T) {
	const limit = 5
	w := time.Second
	t0 := 10*w + 200*time.Millisecond // 800 ms before the window ends
	tests := []struct {
		name      string
		before    uint64 // hits recorded first
		hits      uint64
		charge    bool
		want      Result // Bucket left out
		countNext uint64 // the window's count afterwards (a check under a limit of 100)
	}{
		{"the hits that fill it", 2, 3, false, Result{Allowed: true, Recorded: true, Remaining: 0, Reset: 800 * time.Millisecond}, 5},
		{"one too many: refused until the window ends", 2, 4, false, Result{Remaining: 3, Reset: 800 * time.Millisecond}, 2},
		{"the whole limit after one: refused until the window ends", 1, limit, false, Result{Remaining: 4, Reset: 800 * time.Millisecond}, 1},
		{"more than the limit: refused for a whole window", 0, limit + 1, false, Result{Remaining: 5, Reset: w}, 0},
		{"a charge that fits", 2, 3, true, Result{Allowed: true, Recorded: true, Remaining: 0, Reset: 800 * time.Millisecond}, 5},
		{"a charge that does not: recorded all the same", 3, 4, true, Result{Recorded: true, Remaining: 0, Reset: 800 * time.Millisecond}, 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := NewFixedCounter(mustSpec(t, w, 1))
			if tt.before > 0 && !f.AllowAt(t0, tt.before, limit).Recorded {
				t.Fatal("the first hits were refused")
			}
			var got Result
			if tt.charge {
				got = f.ChargeAt(t0, tt.hits, limit)
			} else {
				got = f.AllowAt(t0, tt.hits, limit)
			}
			got.Bucket = 0
			if got != tt.want {
				t.Errorf("%+v, want %+v", got, tt.want)
			}
			if r := f.AllowAt(t0, 0, 100); r.Remaining != 100-tt.countNext {
				t.Errorf("count afterwards %d, want %d", 100-r.Remaining, tt.countNext)
			}
		})
	}
	// In debt (7 of 5), a charge still records and a take is refused.
	f := NewFixedCounter(mustSpec(t, w, 1))
	f.AllowAt(t0, 3, limit)
	f.ChargeAt(t0, 4, limit)
	if r := f.ChargeAt(t0, 1, limit); !r.Recorded || r.Allowed {
		t.Errorf("a charge in debt %+v, want recorded and refused", r)
	}
	if r := f.AllowAt(t0, 1, limit); r.Recorded || r.Allowed {
		t.Errorf("a take in debt %+v, want refused", r)
	}
	if r := f.AllowAt(t0, 0, 100); r.Remaining != 100-8 {
		t.Errorf("count in debt %d, want 8", 100-r.Remaining)
	}
}

// TestSizeClass: the accounted size of an allocation, at the edges of the
// size classes it approximates.
func TestSizeClass(t *testing.T) {
	for _, tt := range []struct{ n, want int64 }{
		{0, 0}, {1, 16}, {16, 16}, {17, 32}, {256, 256}, {257, 384}, {2048, 2048}, {2049, 3072},
	} {
		if got := sizeClass(tt.n); got != tt.want {
			t.Errorf("sizeClass(%d) = %d, want %d", tt.n, got, tt.want)
		}
	}
}

// TestFixedCounterNewWindowWriterFirst: the writer that moves a fixed
// window on resets its count, unless a writer of the new window got there
// first (it saw the new window number already): that writer's hits stay.
// Driven step by step, as the race cannot be timed.
func TestFixedCounterNewWindowWriterFirst(t *testing.T) {
	f := NewFixedCounter(mustSpec(t, time.Second, 1))
	f.AllowAt(5*time.Second, 4, 10) // window 5 holds 4
	f.word.Store(pack(6, 2))        // a writer of window 6 recorded 2
	f.advance(6 * time.Second)      // the window moves on to 6
	if r := f.AllowAt(6*time.Second, 0, 10); r.Remaining != 8 {
		t.Errorf("window 6 after the race: %+v, want the other writer's 2 counted (8 remaining)", r)
	}
}
