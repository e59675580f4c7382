package window

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leapgate/leapgate/internal/testclock"
)

// refLog is the SlidingLog algorithm's specification written plainly: a
// slice of the admitted hits' times, scanned in full on every call.
type refLog struct {
	w    int64
	seen int64
	ts   []int64 // one entry per admitted hit, in admission order
}

func (r *refLog) clamp(now time.Duration) int64 {
	r.seen = max(r.seen, int64(max(now, 0)))
	return r.seen
}

// inWindow returns the times of the hits in (t-w, t], oldest first.
func (r *refLog) inWindow(t int64) []int64 {
	var in []int64
	for _, x := range r.ts {
		if x > t-r.w {
			in = append(in, x)
		}
	}
	slices.Sort(in)
	return in
}

func (r *refLog) allow(now time.Duration, n, limit uint64) Result {
	t := r.clamp(now)
	in := r.inWindow(t)
	count := uint64(len(in))
	res := Result{Remaining: limit - min(count, limit), Bucket: t}
	need := max(n, 1)
	if count+need > limit {
		if need > limit {
			res.Reset = time.Duration(r.w)
		} else {
			res.Reset = max(0, time.Duration(in[count+need-limit-1]+r.w)-now)
		}
		return res
	}
	res.Allowed = true
	if n > 0 {
		for range n {
			r.ts = append(r.ts, t)
		}
		in = r.inWindow(t)
		res.Recorded = true
		res.Remaining = limit - count - n
	}
	if len(in) > 0 {
		res.Reset = max(0, time.Duration(in[len(in)-1]+r.w)-now)
	}
	return res
}

// refund removes the newest n hits of the window.
func (r *refLog) refund(now time.Duration, n uint64) {
	t := r.clamp(now)
	r.ts = slices.DeleteFunc(r.ts, func(x int64) bool { return x <= t-r.w })
	r.ts = r.ts[:len(r.ts)-int(min(n, uint64(len(r.ts))))]
}

// undo removes up to n hits recorded at time at.
func (r *refLog) undo(at int64, n uint64) {
	for i := len(r.ts) - 1; i >= 0 && n > 0; i-- {
		if r.ts[i] == at {
			r.ts = slices.Delete(r.ts, i, i+1)
			n--
		}
	}
}

// The LogCounter answers exactly as the reference on random sequences of
// admissions, checks, clock steps back, refunds, undos and limit changes;
// every admission keeps every real window at or under the limit, and every
// refusal is a real one (the true window has no room).
func TestLogCounterMatchesReference(t *testing.T) {
	tests := []struct {
		name      string
		window    time.Duration
		limit     uint64
		maxHits   uint64
		step      time.Duration // mean time between calls
		backSteps bool
		changes   bool // the limit changes now and then
	}{
		{"limit 1", time.Second, 1, 1, 300 * time.Millisecond, false, false},
		{"limit 5 per minute", time.Minute, 5, 1, 9 * time.Second, false, false},
		{"limit 10, bursts of 1-3", time.Second, 10, 3, 60 * time.Millisecond, false, false},
		{"limit 100, overloaded", time.Second, 100, 2, 5 * time.Millisecond, false, false},
		{"limit 10, clock steps back", time.Second, 10, 3, 80 * time.Millisecond, true, false},
		{"limit changes", time.Second, 20, 4, 30 * time.Millisecond, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for seed := range uint64(20) {
				rng := rand.New(rand.NewPCG(seed, 11))
				spec := mustSpec(t, tt.window, 1)
				l, ref := NewLogCounter(spec), &refLog{w: int64(tt.window)}
				now, limit := time.Duration(rng.Int64N(int64(tt.window))), tt.limit
				var recorded []int64
				for i := range 2000 {
					now += time.Duration(rng.ExpFloat64() * float64(tt.step))
					if tt.backSteps && rng.IntN(20) == 0 {
						now -= time.Duration(rng.Int64N(int64(tt.window) / 2))
					}
					if tt.changes && rng.IntN(100) == 0 {
						limit = uint64(rng.IntN(2 * int(tt.limit)))
					}
					n := rng.Uint64N(tt.maxHits + 1)
					switch rng.IntN(20) {
					case 0:
						l.RefundAt(now, n)
						ref.refund(now, n)
						continue
					case 1:
						if len(recorded) > 0 {
							at := recorded[rng.IntN(len(recorded))]
							l.UndoAt(at, n)
							ref.undo(at, n)
						}
						continue
					}
					tm := ref.clamp(now) // the time both act at
					room := int(limit) - len(ref.inWindow(tm))
					got, want := l.AllowAt(now, n, limit), ref.allow(now, n, limit)
					if got != want {
						t.Fatalf("seed %d call %d: AllowAt(%v, %d, limit %d) = %+v, reference %+v", seed, i, now, n, limit, got, want)
					}
					if !got.Allowed && room >= int(max(n, 1)) {
						t.Fatalf("seed %d call %d: false reject: %d hits refused with room for %d", seed, i, n, room)
					}
					if got.Recorded {
						recorded = append(recorded, got.Bucket)
						if in := len(ref.inWindow(tm)); in > int(limit) {
							t.Fatalf("seed %d call %d: %d hits in the window, limit %d", seed, i, in, limit)
						}
					}
					if c := l.CountAt(now); c != uint64(len(ref.inWindow(ref.clamp(now)))) {
						t.Fatalf("seed %d call %d: CountAt %d, reference %d", seed, i, c, len(ref.inWindow(ref.clamp(now))))
					}
				}
			}
		})
	}
}

// Without refunds, undos or limit changes, the admitted hits never exceed
// the limit in any real window (0 overshoot) and the admissions equal the
// exact log's on the same arrivals (0 false rejects), on Poisson traffic
// at several loads.
func TestLogCounterExactOnPoisson(t *testing.T) {
	for _, load := range []float64{0.7, 1, 1.2, 3} {
		t.Run(fmt.Sprint("load ", load), func(t *testing.T) {
			const limit = 50
			w := time.Second
			l := NewLogCounter(mustSpec(t, w, 1))
			rng := rand.New(rand.NewPCG(3, uint64(load*10)))
			var admitted, exact []time.Duration
			mean := float64(w) / (load * limit)
			for now := time.Duration(0); now < 100*w; now += time.Duration(rng.ExpFloat64() * mean) {
				lo := 0
				for lo < len(exact) && exact[lo] <= now-w {
					lo++
				}
				exactAllows := len(exact)-lo < limit
				if exactAllows {
					exact = append(exact, now)
				}
				if got := l.AllowAt(now, 1, limit).Allowed; got != exactAllows {
					t.Fatalf("at %v: allowed %v, exact log %v", now, got, exactAllows)
				}
				if exactAllows {
					admitted = append(admitted, now)
				}
			}
			if got := maxInAnyWindow(admitted, w); got > limit {
				t.Fatalf("%d hits in one window, limit %d", got, limit)
			}
		})
	}
}

// Many goroutines on one key at one instant admit exactly the limit; with
// time moving on concurrently no real window ever holds more than the limit.
func TestLogCounterConcurrent(t *testing.T) {
	t.Run("one instant", func(t *testing.T) {
		for _, limit := range []uint64{1, 10, 100, 1000} {
			l := NewLogCounter(mustSpec(t, time.Second, 1))
			var mu sync.Mutex
			admitted := uint64(0)
			var wg sync.WaitGroup
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					n := uint64(0)
					for range 300 {
						if l.AllowAt(time.Hour, 1, limit).Allowed {
							n++
						}
					}
					mu.Lock()
					admitted += n
					mu.Unlock()
				}()
			}
			wg.Wait()
			if admitted != limit {
				t.Fatalf("limit %d: admitted %d at one instant", limit, admitted)
			}
		}
	})
	t.Run("moving time", func(t *testing.T) {
		const limit = 20
		w := 10 * time.Millisecond
		l := NewLogCounter(mustSpec(t, w, 1))
		var mu sync.Mutex
		var times []time.Duration
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(g), 5))
				now := time.Duration(0)
				for range 5000 {
					now += time.Duration(rng.Int64N(int64(w / 50)))
					n := rng.Uint64N(3) + 1
					if r := l.AllowAt(now, n, limit); r.Recorded {
						mu.Lock()
						for range n {
							times = append(times, time.Duration(r.Bucket))
						}
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		slices.Sort(times)
		if got := maxInAnyWindow(times, w); got > limit {
			t.Fatalf("%d hits in one window, limit %d", got, limit)
		}
	})
}

// A refusal's Reset is the exact retry time: at it the same request passes,
// 1ns before it does not. An admission's Reset is when the window is empty.
func TestLogCounterResetExact(t *testing.T) {
	w := time.Second
	type hit struct {
		at time.Duration
		n  uint64
	}
	tests := []struct {
		name  string
		limit uint64
		fill  []hit
		now   time.Duration
		hits  uint64
	}{
		{"full, one more", 5, []hit{{0, 1}, {100 * time.Millisecond, 2}, {300 * time.Millisecond, 2}}, 500 * time.Millisecond, 1},
		{"full, three more", 5, []hit{{0, 1}, {100 * time.Millisecond, 2}, {300 * time.Millisecond, 2}}, 500 * time.Millisecond, 3},
		{"full, the whole limit", 5, []hit{{0, 1}, {100 * time.Millisecond, 2}, {300 * time.Millisecond, 2}}, 900 * time.Millisecond, 5},
		{"room for 2, asks 4", 10, []hit{{10 * time.Millisecond, 4}, {20 * time.Millisecond, 4}}, 700 * time.Millisecond, 4},
		{"check only", 3, []hit{{250 * time.Millisecond, 3}}, 600 * time.Millisecond, 0},
		{"odd nanoseconds", 2, []hit{{1, 1}, {999_999_999, 1}}, 999_999_999, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewLogCounter(mustSpec(t, w, 1))
			for _, h := range tt.fill {
				if !l.AllowAt(h.at, h.n, tt.limit).Recorded {
					t.Fatalf("fill %+v refused", h)
				}
			}
			r := l.AllowAt(tt.now, tt.hits, tt.limit)
			if r.Allowed || r.Reset <= 0 {
				t.Fatalf("%+v, want refused with a Reset", r)
			}
			if got := l.AllowAt(tt.now+r.Reset-1, tt.hits, tt.limit); got.Allowed {
				t.Fatalf("allowed 1ns before Reset %v: %+v", r.Reset, got)
			}
			got := l.AllowAt(tt.now+r.Reset, tt.hits, tt.limit)
			if !got.Allowed {
				t.Fatalf("refused at Reset %v: %+v", r.Reset, got)
			}
			// The admission's Reset: the window is empty then, not 1ns before.
			at := tt.now + r.Reset
			if c := l.CountAt(at + got.Reset - 1); got.Reset > 0 && c == 0 {
				t.Fatalf("window empty 1ns before the allowed Reset %v", got.Reset)
			}
			if c := l.CountAt(at + got.Reset); c != 0 {
				t.Fatalf("%d hits still counted at the allowed Reset %v", c, got.Reset)
			}
		})
	}
	l := NewLogCounter(mustSpec(t, w, 1))
	if r := l.AllowAt(0, 6, 5); r.Allowed || r.Reset != w {
		t.Fatalf("more hits than the limit: %+v, want Reset of one window", r)
	}
	if r := l.AllowAt(0, 0, 0); r.Allowed || r.Reset != w {
		t.Fatalf("check at limit 0: %+v", r)
	}
	if r := l.AllowAt(0, 0, 5); !r.Allowed || r.Reset != 0 || r.Remaining != 5 {
		t.Fatalf("check on an empty log: %+v", r)
	}
}

func TestLogCounterClockStepBack(t *testing.T) {
	l := NewLogCounter(mustSpec(t, time.Second, 1))
	l.AllowAt(10*time.Second, 5, 5)
	// Back to 5s: the hits of 10s still count, nothing is admitted.
	if r := l.AllowAt(5*time.Second, 1, 5); r.Allowed || r.Remaining != 0 {
		t.Fatalf("clock step back failed open: %+v", r)
	}
	if c := l.CountAt(5 * time.Second); c != 5 {
		t.Fatalf("clock step back dropped counts: %d", c)
	}
	// Far back (before the window of 10s began): still nothing dropped.
	if r := l.AllowAt(0, 0, 5); r.Allowed {
		t.Fatalf("check at time 0 after 10s: %+v", r)
	}
	// Time resumes: the hits leave at 11s exactly.
	if r := l.AllowAt(11*time.Second-1, 1, 5); r.Allowed {
		t.Fatalf("admitted before the hits left: %+v", r)
	}
	if r := l.AllowAt(11*time.Second, 5, 5); !r.Allowed {
		t.Fatalf("refused after the hits left: %+v", r)
	}
	if l.LastUsed() != 11*time.Second {
		t.Fatalf("LastUsed %v", l.LastUsed())
	}
	// Reads far ahead (a Sweep) neither count as use nor drop hits for a
	// later call at an earlier time.
	if c := l.CountAt(time.Hour); c != 0 || !l.idleAt(time.Hour) {
		t.Fatalf("an hour later: count %d", c)
	}
	if l.LastUsed() != 11*time.Second {
		t.Fatalf("LastUsed %v after reads, want 11s", l.LastUsed())
	}
	if r := l.AllowAt(11*time.Second, 1, 5); r.Allowed || r.Remaining != 0 {
		t.Fatalf("hits dropped by a read ahead: %+v", r)
	}
}

func TestLogCounterRefundAndUndo(t *testing.T) {
	w := time.Second
	tests := []struct {
		name      string
		op        func(l *LogCounter)
		wantCount uint64
		wantReset time.Duration // of a check at 500ms
	}{
		{"refund 2: the newest go", func(l *LogCounter) { l.RefundAt(500*time.Millisecond, 2) }, 3, 600 * time.Millisecond},
		{"refund 3: into the older", func(l *LogCounter) { l.RefundAt(500*time.Millisecond, 3) }, 2, 600 * time.Millisecond},
		{"refund beyond zero", func(l *LogCounter) { l.RefundAt(500*time.Millisecond, 100) }, 0, 0},
		{"undo the older hits only", func(l *LogCounter) { l.UndoAt(int64(100*time.Millisecond), 3) }, 2, 1200 * time.Millisecond},
		{"undo 2 of 3", func(l *LogCounter) { l.UndoAt(int64(100*time.Millisecond), 2) }, 3, 1200 * time.Millisecond},
		{"undo the newest", func(l *LogCounter) { l.UndoAt(int64(700*time.Millisecond), 5) }, 3, 600 * time.Millisecond},
		{"undo at a time never recorded", func(l *LogCounter) { l.UndoAt(int64(400*time.Millisecond), 5) }, 5, 1200 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewLogCounter(mustSpec(t, w, 1))
			l.AllowAt(100*time.Millisecond, 3, 10)
			l.AllowAt(700*time.Millisecond, 2, 10)
			tt.op(l)
			// Checks happen at 500ms, which the clock has passed (700ms): they act at 700ms.
			if c := l.CountAt(700 * time.Millisecond); c != tt.wantCount {
				t.Fatalf("count %d, want %d", c, tt.wantCount)
			}
			r := l.AllowAt(500*time.Millisecond, 0, 10)
			if r.Remaining != 10-tt.wantCount || r.Reset != tt.wantReset {
				t.Fatalf("%+v, want remaining %d, reset %v", r, 10-tt.wantCount, tt.wantReset)
			}
		})
	}
	// An undone hit that already left the window takes nothing newer.
	l := NewLogCounter(mustSpec(t, w, 1))
	first := l.AllowAt(0, 2, 10)
	l.AllowAt(1500*time.Millisecond, 2, 10)
	l.UndoAt(first.Bucket, 2)
	if c := l.CountAt(1500 * time.Millisecond); c != 2 {
		t.Fatalf("undo of expired hits took newer ones: count %d", c)
	}
}

// A raised limit applies at once; a lowered one too, and the ring keeps
// every counted hit until they fit in it (then shrinks): a limit lowered and
// raised again still sees them.
func TestLogCounterLimitChange(t *testing.T) {
	w := time.Second
	l := NewLogCounter(mustSpec(t, w, 1))
	ringLen := func() int { l.mu.Lock(); defer l.mu.Unlock(); return len(l.ring) }
	for i := range 10 {
		l.AllowAt(time.Duration(i)*10*time.Millisecond, 1, 10) // 0..90ms
	}
	if got := ringLen(); got != 10 {
		t.Fatalf("ring of %d for limit 10", got)
	}
	// Raised to 20: 10 more fit at once, the first 10 kept.
	if r := l.AllowAt(100*time.Millisecond, 10, 20); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("raised limit: %+v", r)
	}
	if got := ringLen(); got != 20 {
		t.Fatalf("ring of %d for limit 20", got)
	}
	// Lowered to 5 with 20 counted: refused, Remaining 0, the retry time is
	// when 16 hits have left (the one at 100ms: 1.1s).
	r := l.AllowAt(200*time.Millisecond, 1, 5)
	if r.Allowed || r.Remaining != 0 || r.Reset != 900*time.Millisecond {
		t.Fatalf("lowered limit: %+v, want refused, Reset 900ms", r)
	}
	if got := ringLen(); got != 20 {
		t.Fatalf("ring shrank to %d while 20 hits counted", got)
	}
	// Raised back to 20 before anything left: still full.
	if r := l.AllowAt(300*time.Millisecond, 1, 20); r.Allowed {
		t.Fatalf("limit lowered and raised again forgot hits: %+v", r)
	}
	// At 1.05s the hits of 0..50ms have left: 14 counted; limit 5 still refuses.
	if r := l.AllowAt(1050*time.Millisecond, 0, 5); r.Allowed || r.Remaining != 0 {
		t.Fatalf("at 1.05s: %+v", r)
	}
	// At 1.095s the 10 hits of 100ms remain: they fit limit 10, so the ring
	// shrinks to 10, keeping them in order (the retry time is when they leave).
	if r := l.AllowAt(1095*time.Millisecond, 1, 10); r.Allowed || r.Reset != 5*time.Millisecond {
		t.Fatalf("at 1.095s: %+v, want refused for 5ms", r)
	}
	if got := ringLen(); got != 10 {
		t.Fatalf("ring of %d after the hits fit limit 10", got)
	}
	// At 1.1s they leave too and the ring shrinks to 5.
	if r := l.AllowAt(1100*time.Millisecond, 3, 5); !r.Allowed || r.Remaining != 2 {
		t.Fatalf("at 1.1s: %+v", r)
	}
	if got := ringLen(); got != 5 {
		t.Fatalf("ring of %d after the hits fit limit 5", got)
	}
	if r := l.AllowAt(1100*time.Millisecond, 3, 5); r.Allowed || r.Reset != w {
		t.Fatalf("after shrinking: %+v, want refused until 2.1s", r)
	}
	// Lowered to 0: everything refused; the ring goes once the window is empty.
	if r := l.AllowAt(3*time.Second, 0, 0); r.Allowed {
		t.Fatalf("limit 0: %+v", r)
	}
	if got := ringLen(); got != 0 {
		t.Fatalf("ring of %d for limit 0 on an empty window", got)
	}
}

// Once its ring is sized, AllowAt does not allocate.
func TestLogCounterNoAlloc(t *testing.T) {
	l := NewLogCounter(mustSpec(t, time.Second, 1))
	now := time.Duration(0)
	l.AllowAt(now, 1, 100)
	allocs := testing.AllocsPerRun(1000, func() {
		now += 3 * time.Millisecond
		l.AllowAt(now, 1, 100)
		l.AllowAt(now, 0, 100)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per AllowAt", allocs)
	}
}

func TestStoreSlidingLog(t *testing.T) {
	spec := mustSpec(t, time.Second, 1)
	ctx := context.Background()
	clock := &testclock.Clock{}
	s := NewStore(StoreOptions{Clock: clock, MaxKeys: 3})
	do := func(reqs ...Request) []Result {
		t.Helper()
		res, err := s.Do(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	req := func(key string, hits uint64) Request {
		return Request{Key: key, Spec: spec, Limit: 5, Hits: hits, Veto: true, Algorithm: SlidingLog}
	}
	do(req("a", 3))
	clock.Set(900 * time.Millisecond)
	if r := do(req("a", 2)); !r[0].Allowed || r[0].Remaining != 0 {
		t.Fatalf("%+v", r[0])
	}
	// Exact: at 1s the 3 hits of 0 have left; 3 fit, a 4th does not.
	clock.Set(time.Second)
	if r := do(req("a", 4)); r[0].Allowed || r[0].Reset != 900*time.Millisecond {
		t.Fatalf("4 hits with 3 free: %+v, want refused until the hits of 900ms leave", r[0])
	}
	if r := do(req("a", 3)); !r[0].Allowed {
		t.Fatalf("3 hits with 3 free: %+v", r[0])
	}
	// A vetoed batch takes its log hits back.
	res := do(req("b", 2), Request{Key: "c", Spec: spec, Limit: 0, Hits: 1, Veto: true})
	if res[0].Recorded || s.CountAt("b", clock.Now()) != 0 {
		t.Fatalf("vetoed batch kept hits: %+v, count %d", res[0], s.CountAt("b", clock.Now()))
	}
	// Refunds take back the newest hits.
	neg := req("a", 2)
	neg.Negative = true
	if r := do(neg); r[0].Remaining != 2 || s.CountAt("a", clock.Now()) != 3 {
		t.Fatalf("refund: %+v, count %d", r[0], s.CountAt("a", clock.Now()))
	}
	// Idle reclaim and the key bound work for log keys.
	do(req("b", 1))
	do(req("d", 1))
	do(req("e", 1)) // a fourth key: one evicted
	if st := s.Stats(); st.Keys != 3 || st.Evictions != 1 {
		t.Fatalf("%+v, want 3 keys and one eviction", st)
	}
	if n := s.Sweep(time.Hour); n != 3 {
		t.Fatalf("swept %d idle log keys, want 3", n)
	}
	// Limits above MaxLogLimit are refused with a clear error.
	big := req("big", 1)
	big.Limit = MaxLogLimit + 1
	if _, err := s.Do(ctx, []Request{big}); !errors.Is(err, ErrLogLimit) {
		t.Fatalf("limit above MaxLogLimit: %v", err)
	}
}

// FuzzLogCounterMatchesReference drives a LogCounter and the reference with
// the operations encoded in ops (4 bytes each) and fails at the first
// difference.
func FuzzLogCounterMatchesReference(f *testing.F) {
	f.Add([]byte{0, 10, 0, 3, 0, 200, 0, 1, 3, 255, 0, 2, 4, 0, 0, 2, 5, 0, 0, 5, 0, 0, 40, 7})
	f.Fuzz(func(t *testing.T, ops []byte) {
		w := 10 * time.Millisecond
		l, ref := NewLogCounter(mustSpec(t, w, 1)), &refLog{w: int64(w)}
		now := time.Duration(0)
		var recorded []int64
		for len(ops) >= 4 {
			op, arg, n := ops[0]%8, time.Duration(ops[1])|time.Duration(ops[2])<<8, uint64(ops[3]%8)
			ops = ops[4:]
			limit := uint64(arg%12) + n/2
			switch op {
			case 0, 1, 2:
				now += arg * 3 * time.Microsecond
			case 3:
				now -= arg * 5 * time.Microsecond
			case 4:
				if len(recorded) > 0 {
					at := recorded[int(arg)%len(recorded)]
					l.UndoAt(at, n)
					ref.undo(at, n)
				}
				continue
			case 5:
				l.RefundAt(now, n)
				ref.refund(now, n)
				continue
			}
			got, want := l.AllowAt(now, n, limit), ref.allow(now, n, limit)
			if got != want {
				t.Fatalf("now=%v AllowAt(%d, limit %d) = %+v, reference %+v", now, n, limit, got, want)
			}
			if got.Recorded {
				recorded = append(recorded, got.Bucket)
			}
		}
	})
}

// TestLogCounterIdle: a sliding log is idle (the Store may drop it) when
// empty, or once its newest hit is a window old, to the nanosecond.
func TestLogCounterIdle(t *testing.T) {
	w := time.Second
	l := NewLogCounter(mustSpec(t, w, 1))
	t0 := 5 * w
	if !l.idleAt(t0) {
		t.Error("an empty log is not idle")
	}
	l.AllowAt(t0, 1, 10)
	l.AllowAt(t0+w/2, 1, 10)
	for _, tt := range []struct {
		at   time.Duration
		idle bool
	}{
		{t0 + w, false},           // the first hit left, the second has not
		{t0 + w/2 + w - 1, false}, // 1ns before the newest leaves
		{t0 + w/2 + w, true},
	} {
		if got := l.idleAt(tt.at); got != tt.idle {
			t.Errorf("idle at %v: %v, want %v", tt.at, got, tt.idle)
		}
	}
}
