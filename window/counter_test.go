package window

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// exactLog is the ground truth for the Counter's tests: every hit the
// Counter admitted, with its time, and the hits in (now-W, now].
type exactLog struct {
	w    time.Duration
	at   []time.Duration
	hits []uint64
}

func (l *exactLog) add(t time.Duration, hits uint64) {
	l.at = append(l.at, t)
	l.hits = append(l.hits, hits)
}

// count is the hits logged in (now-W, now]; with round > 0 each hit's time
// is first rounded up to a multiple of round (the Counter's ticks).
func (l *exactLog) count(now time.Duration, round time.Duration) uint64 {
	var n uint64
	for i, t := range l.at {
		if round > 0 {
			t = (t + round - 1) / round * round
		}
		if t > now-l.w {
			n += l.hits[i]
		}
	}
	return n
}

// drop removes the newest hits, as a refund takes them back.
func (l *exactLog) drop(hits uint64) {
	for hits > 0 && len(l.at) > 0 {
		i := len(l.at) - 1
		take := min(l.hits[i], hits)
		l.hits[i] -= take
		hits -= take
		if l.hits[i] == 0 {
			l.at, l.hits = l.at[:i], l.hits[:i]
		}
	}
}

func TestTickLength(t *testing.T) {
	tests := []struct {
		w, want time.Duration
	}{
		{time.Second, 16 * time.Microsecond},
		{time.Minute, 938 * time.Microsecond},
		{time.Hour, 56250 * time.Microsecond},
		{64 * time.Millisecond, time.Microsecond},
		{time.Millisecond, time.Microsecond},
		{time.Nanosecond, time.Microsecond},
	}
	for _, tt := range tests {
		got := TickLength(tt.w)
		if got != tt.want {
			t.Errorf("TickLength(%v) = %v, want %v", tt.w, got, tt.want)
		}
		if tt.w >= time.Millisecond && tt.w/got > TicksPerWindow {
			t.Errorf("TickLength(%v): %d ticks per window, more than %d", tt.w, tt.w/got, TicksPerWindow)
		}
	}
}

// TestCounterAnswers walks one key through admissions, refusals, checks and
// resets at exact instants (times on the 16µs tick grid of a 1s window).
func TestCounterAnswers(t *testing.T) {
	const ms = time.Millisecond
	type step struct {
		at        time.Duration
		hits      uint64
		allowed   bool
		remaining uint64
		reset     time.Duration
	}
	tests := []struct {
		name  string
		limit uint64
		steps []step
	}{
		{"exact log for a small limit", 3, []step{
			{100 * ms, 1, true, 2, time.Second},
			{200 * ms, 1, true, 1, time.Second},
			{300 * ms, 0, true, 1, 900 * ms}, // check: until the newest hit (200ms) ages out
			{400 * ms, 1, true, 0, time.Second},
			{500 * ms, 1, false, 0, 600 * ms}, // the 100ms hit leaves at 1.1s
			{1100*ms - 16*time.Microsecond, 1, false, 0, 16 * time.Microsecond},
			{1100 * ms, 1, true, 0, time.Second}, // exactly when the first hit leaves
			{1150 * ms, 2, false, 0, 250 * ms},   // two must leave: the 200ms and 400ms hits
			{1400 * ms, 2, true, 0, time.Second},
		}},
		{"hits above the limit are refused with the window length", 5, []step{
			{0, 6, false, 5, time.Second},
			{2 * ms, 5, true, 0, time.Second},
		}},
		{"limit 0 refuses everything", 0, []step{
			{0, 1, false, 0, time.Second},
			{0, 0, false, 0, time.Second},
		}},
		{"a key idle for a window starts afresh", 2, []step{
			{0, 2, true, 0, time.Second},
			{time.Second, 2, true, 0, time.Second},
			{5 * time.Hour, 2, true, 0, time.Second},
		}},
		// limit 2 × Blocks: blocks of 2 hits, each stamped with its newer
		// hit's time.
		{"blocks of two", 2 * Blocks, []step{
			{0, 1, true, 2*Blocks - 1, time.Second},
			{100 * ms, 1, true, 2*Blocks - 2, time.Second}, // closes block 1, stamped 100ms
			{200 * ms, 2*Blocks - 2, true, 0, time.Second},
			{500 * ms, 1, false, 0, 600 * ms}, // block 1 leaves at 1.1s, whole
			{1050 * ms, 1, false, 0, 50 * ms}, // the 0ms hit left, but its block did not
			{1100 * ms, 2, true, 0, time.Second},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCounter(mustSpec(t, time.Second, 1))
			for i, s := range tt.steps {
				r := c.AllowAt(s.at, s.hits, tt.limit)
				if r.Allowed != s.allowed || r.Remaining != s.remaining || r.Reset != s.reset {
					t.Fatalf("step %d (at %v, %d hits): %+v, want allowed %v remaining %d reset %v",
						i, s.at, s.hits, r, s.allowed, s.remaining, s.reset)
				}
				if r.Recorded != (s.allowed && s.hits > 0) {
					t.Fatalf("step %d: recorded %v", i, r.Recorded)
				}
			}
		})
	}
}

// TestCounterSize pins the memory target: 256 bytes per counter, a Go size
// class, as the package documentation promises.
func TestCounterSize(t *testing.T) {
	var c Counter
	if got := unsafe.Sizeof(c); got != 256 {
		t.Fatalf("Counter is %d bytes, want 256", got)
	}
}

// randomTrace drives c through n random weighted requests (and refunds,
// when refunds is set) and calls check after each step. Times are on the
// tick grid when onGrid (rounding is then a no-op), else arbitrary
// nanoseconds; gaps are bursty (many at one instant, some long pauses).
func randomTrace(t *testing.T, c *Counter, rng *rand.Rand, w time.Duration, limit uint64, n int, onGrid, refunds bool,
	check func(now time.Duration, r Result, hits uint64, refund bool)) {
	t.Helper()
	tick := TickLength(w)
	now := time.Duration(rng.Int64N(int64(3 * w)))
	maxHits := 1 + limit/uint64(1+rng.IntN(20))
	for range n {
		switch rng.IntN(10) {
		case 0: // a pause, sometimes longer than the window
			now += time.Duration(rng.Int64N(int64(2 * w)))
		case 1, 2, 3: // same instant
		default:
			now += time.Duration(rng.Int64N(int64(w) / int64(max(limit, 1)) * 3))
		}
		at := now
		if onGrid {
			at = (at + tick - 1) / tick * tick
		}
		hits := 1 + rng.Uint64N(maxHits)
		if rng.IntN(20) == 0 {
			hits = 0
		}
		if refunds && rng.IntN(40) == 0 {
			c.RefundAt(at, hits)
			check(at, Result{}, hits, true)
			continue
		}
		check(at, c.AllowAt(at, hits, limit), hits, false)
	}
}

// TestCounterNeverUndercounts is the differential test against an exact log
// of what the Counter admitted, on random weighted traces, at limits below,
// at and above Blocks: the estimate is never below the real count (hence no
// window ever holds more than the limit), refunds included; and without
// refunds it is less than one block above the log with times rounded up to
// the tick, so a refusal means the real window had less than one block of
// room.
func TestCounterNeverUndercounts(t *testing.T) {
	w := time.Second
	for _, limit := range []uint64{1, 7, 10, Blocks, 100, 113, 1000, 10_000, 1 << 20} {
		for _, onGrid := range []bool{true, false} {
			for _, refunds := range []bool{false, true} {
				rng := rand.New(rand.NewPCG(limit, 7))
				for trace := range 20 {
					c := NewCounter(mustSpec(t, w, 1))
					log := &exactLog{w: w}
					b := (max(limit, Blocks) + Blocks - 1) / Blocks // the largest block
					randomTrace(t, c, rng, w, limit, 400, onGrid, refunds, func(now time.Duration, r Result, hits uint64, refund bool) {
						if refund {
							log.drop(hits)
							return
						}
						real := log.count(now, 0)
						if r.Recorded {
							log.add(now, hits)
							real += hits
							if real > limit {
								t.Fatalf("limit %d trace %d at %v: %d hits in the window", limit, trace, now, real)
							}
						}
						est := c.CountAt(now)
						if est < real {
							t.Fatalf("limit %d trace %d at %v: estimate %d below the real %d", limit, trace, now, est, real)
						}
						if refunds {
							return
						}
						rounded := log.count(now, TickLength(w))
						if est >= rounded+b {
							t.Fatalf("limit %d trace %d at %v: estimate %d, rounded log %d, block %d", limit, trace, now, est, rounded, b)
						}
						if !r.Allowed && hits <= limit && rounded+hits+b <= limit {
							t.Fatalf("limit %d at %v: refused %d hits with %d in the (rounded) window", limit, now, hits, rounded)
						}
					})
				}
			}
		}
	}
}

// TestCounterIsExactLogForSmallLimits: for a limit of at most ExactLimit the
// Counter is the exact sliding log, to the nanosecond; up to Blocks every
// block is one hit, so it decides exactly as an exact sliding log whose
// times are rounded up to the tick (and as the exact log itself when times
// lie on the tick grid).
func TestCounterIsExactLogForSmallLimits(t *testing.T) {
	w := time.Minute
	for _, limit := range []uint64{1, 5, 10, ExactLimit, ExactLimit + 1, 50, Blocks} {
		round := TickLength(w)
		if limit <= ExactLimit {
			round = 0
		}
		for _, onGrid := range []bool{true, false} {
			rng := rand.New(rand.NewPCG(limit, 11))
			for range 20 {
				c := NewCounter(mustSpec(t, w, 1))
				log := &exactLog{w: w}
				randomTrace(t, c, rng, w, limit, 500, onGrid, true, func(now time.Duration, r Result, hits uint64, refund bool) {
					if refund {
						log.drop(hits)
						return
					}
					want := log.count(now, round)+max(hits, 1) <= limit
					if r.Allowed != want {
						t.Fatalf("limit %d at %v, %d hits: allowed %v, exact log says %v", limit, now, hits, r.Allowed, want)
					}
					if r.Recorded {
						log.add(now, hits)
					}
				})
			}
		}
	}
}

// TestCounterRetryAfterIsHonest: on every refusal of a random trace, the
// same request is still refused one nanosecond before now+Reset and
// admitted at now+Reset.
func TestCounterRetryAfterIsHonest(t *testing.T) {
	w := time.Second
	for _, limit := range []uint64{3, Blocks, 1000, 50_000} {
		rng := rand.New(rand.NewPCG(limit, 3))
		c := NewCounter(mustSpec(t, w, 1))
		now := time.Duration(0)
		refusals := 0
		for range 5000 {
			now += time.Duration(rng.Int64N(int64(w) / int64(limit) * 2))
			hits := 1 + rng.Uint64N(max(limit/20, 1))
			r := c.AllowAt(now, hits, limit)
			if r.Allowed || r.Reset == 0 {
				continue
			}
			refusals++
			if early := c.AllowAt(now+r.Reset-1, hits, limit); early.Allowed {
				t.Fatalf("limit %d: refused at %v with reset %v, but admitted 1ns earlier", limit, now, r.Reset)
			}
			now += r.Reset
			if again := c.AllowAt(now, hits, limit); !again.Allowed {
				t.Fatalf("limit %d: refused at %v with reset %v, and refused again then: %+v", limit, now-r.Reset, r.Reset, again)
			}
		}
		if refusals < 100 {
			t.Fatalf("limit %d: only %d refusals: the trace does not test retries", limit, refusals)
		}
	}
}

// TestCounterTickRoundingNeverOvershoots: hits arriving one nanosecond after
// the previous hits' window ends, or within the same tick, never make a real
// window hold more than the limit.
func TestCounterTickRoundingNeverOvershoots(t *testing.T) {
	w := time.Second
	tick := TickLength(w)
	for _, limit := range []uint64{10, 100, 113, 1000, 10_000} {
		for tenth := range 10 {
			c := NewCounter(mustSpec(t, w, 1))
			log := &exactLog{w: w}
			// The whole limit a nanosecond after a tick edge (rounded up by
			// almost a whole tick), then probes around the instants it
			// leaves the window, then the rest of a second limit.
			start := 100*w + time.Duration(tenth)*w/10 + 1
			for range limit {
				if c.AllowAt(start, 1, limit).Recorded {
					log.add(start, 1)
				}
			}
			for t0 := start + w - 2*tick; t0 < start+w+2*tick; t0 += tick / 4 {
				for range limit {
					if c.AllowAt(t0, 1, limit).Recorded {
						log.add(t0, 1)
					}
				}
				if got := log.count(t0, 0); got > limit {
					t.Fatalf("limit %d: %d hits in the window ending %v", limit, got, t0)
				}
			}
		}
	}
}

// TestCounterClockStepsBack: a time before the newest seen is the newest
// seen; hits admitted after the step still count later, and their Reset is
// measured from the real (earlier) now.
func TestCounterClockStepsBack(t *testing.T) {
	c := NewCounter(mustSpec(t, time.Second, 1))
	at := 10 * time.Second
	if r := c.AllowAt(at, 3, 5); !r.Allowed {
		t.Fatal(r)
	}
	// The clock steps back 5s: two more hits count at 10s.
	r := c.AllowAt(at-5*time.Second, 2, 5)
	if !r.Allowed || r.Remaining != 0 || r.Reset != 6*time.Second {
		t.Fatalf("after the step back: %+v, want allowed, 0 left, reset 6s (at 11s)", r)
	}
	if r := c.AllowAt(at+999*time.Millisecond, 1, 5); r.Allowed {
		t.Fatalf("the hits admitted after the step no longer count: %+v", r)
	}
	if r := c.AllowAt(at+time.Second, 5, 5); !r.Allowed {
		t.Fatalf("all five hits should have left at 11s: %+v", r)
	}
}

// TestCounterIdleBeyondTickRange: 16-bit ticks alias after 65536 ticks (a
// little over a window); a key idle for any time, including exact multiples
// of the tick range, starts afresh and counts the hits that follow.
func TestCounterIdleBeyondTickRange(t *testing.T) {
	w := time.Second
	tick := TickLength(w)
	span := 1 << 16 * tick
	for _, idle := range []time.Duration{w, w + tick, span, span + tick, span + w/2, 2 * span, 1000 * span, 3 * span / 2} {
		c := NewCounter(mustSpec(t, w, 1))
		start := 7 * w
		c.AllowAt(start, 50, 100)
		c.AllowAt(start+w/2, 50, 100)
		now := start + w/2 + idle
		if got := c.CountAt(now); got != 0 {
			t.Fatalf("idle %v: count %d, want 0", idle, got)
		}
		if r := c.AllowAt(now, 100, 100); !r.Allowed {
			t.Fatalf("idle %v: the full limit is refused: %+v", idle, r)
		}
		if r := c.AllowAt(now+w-tick, 1, 100); r.Allowed {
			t.Fatalf("idle %v: the hits after the pause do not count: %+v", idle, r)
		}
	}
}

// TestCounterRefundAndUndo: refunds take the newest hits back (never below
// zero), reopening closed blocks; undo does the same for hits still in the
// window and nothing for hits that left it.
func TestCounterRefundAndUndo(t *testing.T) {
	c := NewCounter(mustSpec(t, time.Second, 1))
	const limit = 980 // blocks of 10
	r := c.AllowAt(0, 500, limit)
	if c.CountAt(0) != 500 {
		t.Fatal(c.CountAt(0))
	}
	c.RefundAt(time.Millisecond, 123)
	if got := c.CountAt(time.Millisecond); got != 377 {
		t.Fatalf("after refunding 123 of 500: %d", got)
	}
	c.UndoAt(r.Bucket, 77)
	if got := c.CountAt(time.Millisecond); got != 300 {
		t.Fatalf("after undoing 77: %d", got)
	}
	c.RefundAt(time.Millisecond, 1000)
	if got := c.CountAt(time.Millisecond); got != 0 {
		t.Fatalf("a refund beyond the count leaves %d", got)
	}
	old := c.AllowAt(2*time.Millisecond, 5, limit)
	c.AllowAt(2*time.Second, 5, limit)
	c.UndoAt(old.Bucket, 5) // recorded over a window ago: already forgotten
	if got := c.CountAt(2 * time.Second); got != 5 {
		t.Fatalf("undo of hits that left the window took %d back", 5-got)
	}
}

// TestCounterLimitChanges: a raised limit applies at once (the open block
// absorbs hits beyond Blocks × b, still counted exactly); a lowered one too;
// the block size follows the limit once the window is empty.
func TestCounterLimitChanges(t *testing.T) {
	c := NewCounter(mustSpec(t, time.Second, 1))
	log := &exactLog{w: time.Second}
	for i := range 300 {
		at := time.Duration(i) * time.Millisecond
		limit := uint64(Blocks)
		if i >= 100 {
			limit = 10_000 // raised: the blocks are re-sized at once
		}
		if i >= 200 {
			limit = 20 // lowered
		}
		if r := c.AllowAt(at, 10, limit); r.Recorded {
			log.add(at, 10)
		}
		if est, real := c.CountAt(at), log.count(at, 0); est < real {
			t.Fatalf("at %v: estimate %d below %d", at, est, real)
		}
	}
	if got := c.CountAt(299 * time.Millisecond); got < 20 {
		t.Fatalf("count %d under the lowered limit's fill", got)
	}
	if r := c.AllowAt(299*time.Millisecond, 1, 20); r.Allowed {
		t.Fatalf("the lowered limit does not apply: %+v", r)
	}
	// Empty again: the block sizes divide the new limit.
	c.AllowAt(5*time.Second, 1, 10_000)
	if c.quota != 10_000 {
		t.Fatalf("block sizes divide %d after the window emptied, want 10000", c.quota)
	}
}

// TestCounterResizeNeverUndercounts is TestCounterNeverUndercounts with a
// limit that changes every few dozen requests, across the exact log, blocks
// of one hit and larger blocks: the estimate is never below the real count
// (no window holds more than the limit in force when a hit is admitted),
// and it stays within one block of the old size and one of the new above
// the log with times rounded up to the tick: at once after a raise, and a
// window after a cut (the hits a cut leaves beyond the smaller ring's room
// are stamped with the newest of them, so they are over-counted until it
// leaves, which is never after a window).
func TestCounterResizeNeverUndercounts(t *testing.T) {
	w := time.Second
	limits := []uint64{3, ExactLimit, ExactLimit + 1, Blocks, 150, 1000, 10_000}
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 11))
		c := NewCounter(mustSpec(t, w, 1))
		log := &exactLog{w: w}
		limit, prev := limits[0], limits[0]
		now, cut := time.Duration(0), time.Duration(0)
		for i := range 3000 {
			if i%(20+int(seed)) == 0 {
				prev, limit = limit, limits[rng.IntN(len(limits))]
				if limit < prev {
					cut = now
				}
			}
			now += time.Duration(rng.Int64N(int64(w) / int64(limit) * 2))
			hits := 1 + rng.Uint64N(1+limit/50)
			real := log.count(now, 0)
			if r := c.AllowAt(now, hits, limit); r.Recorded {
				log.add(now, hits)
				real += hits
				if real > limit {
					t.Fatalf("seed %d at %v: %d hits in the window under limit %d", seed, now, real, limit)
				}
			}
			est := c.CountAt(now)
			if est < real {
				t.Fatalf("seed %d at %v: estimate %d below the real %d (limit %d after %d)", seed, now, est, real, limit, prev)
			}
			block := func(l uint64) uint64 { return (max(l, Blocks) + Blocks - 1) / Blocks }
			if rounded := log.count(now, TickLength(w)); now-cut > w && est >= rounded+block(limit)+block(prev)+hits {
				t.Fatalf("seed %d at %v: estimate %d, rounded log %d (limit %d after %d)", seed, now, est, rounded, limit, prev)
			}
		}
	}
}

// TestCounterConcurrentExactAdmission: goroutines hammering one key at one
// instant get exactly the limit between them (run with -race).
func TestCounterConcurrentExactAdmission(t *testing.T) {
	for _, limit := range []uint64{50, 1000, 4321} {
		c := NewCounter(mustSpec(t, time.Second, 1))
		var admitted atomic.Uint64
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 2000 {
					hits := uint64(1 + (i+g)%3)
					if c.AllowAt(time.Second, hits, limit).Recorded {
						admitted.Add(hits)
					}
				}
			}()
		}
		wg.Wait()
		if got := admitted.Load(); got > limit || got < limit-2 {
			t.Fatalf("limit %d: admitted %d hits (want the limit, less at most the 2 a 3-hit request cannot use)", limit, got)
		}
	}
}

// FuzzCounterNeverUndercounts drives a Counter and an exact log with the
// operations encoded in ops (4 bytes each: time step, hits, limit choice,
// refund flag) and fails when the estimate falls below the real count or a
// window holds more than the limit.
func FuzzCounterNeverUndercounts(f *testing.F) {
	f.Add([]byte{0, 5, 0, 0, 10, 1, 1, 0, 255, 200, 2, 1, 3, 3, 3, 0})
	f.Add([]byte{255, 255, 255, 255, 0, 0, 0, 0, 1, 1, 1, 1})
	f.Fuzz(checkNeverUndercounts)
}

// TestCounterNeverUndercountsOnRandomOps runs FuzzCounterNeverUndercounts'
// check on fixed pseudo-random operations, so that every test run covers
// more than the fuzz seeds.
func TestCounterNeverUndercountsOnRandomOps(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for range 200 {
		ops := make([]byte, 4*200)
		for i := range ops {
			ops[i] = byte(rng.Uint32())
		}
		checkNeverUndercounts(t, ops)
	}
}

// checkNeverUndercounts plays ops (4 bytes each: a time step, hits, a
// limit among four, a refund flag) on a Counter and an exact log, and
// fails if the counter ever counts less than the log.
func checkNeverUndercounts(t *testing.T, ops []byte) {
	w := time.Second
	c := NewCounter(mustSpec(t, w, 1))
	log := &exactLog{w: w}
	limits := [4]uint64{7, Blocks, 1000, 65_537}
	now := time.Duration(0)
	for len(ops) >= 4 {
		step, h, l, flags := ops[0], ops[1], ops[2], ops[3]
		ops = ops[4:]
		now += time.Duration(step) * time.Duration(step) * 50 * time.Microsecond
		limit := limits[l%4]
		hits := uint64(h)
		if flags%8 == 1 {
			c.RefundAt(now, hits)
			log.drop(hits)
			continue
		}
		if c.AllowAt(now, hits, limit).Recorded {
			log.add(now, hits)
		}
		if est, real := c.CountAt(now), log.count(now, 0); est < real {
			t.Fatalf("at %v: estimate %d below the real %d", now, est, real)
		}
	}
}

// TestCounterExactAtWindowEdges: up to ExactLimit, a hit leaves the window
// exactly W after its own time, to the nanosecond, at times off any tick
// grid: one nanosecond before, the window is still full; at it, the next hit
// passes.
func TestCounterExactAtWindowEdges(t *testing.T) {
	w := time.Second
	for _, limit := range []uint64{1, 10, ExactLimit} {
		c := NewCounter(mustSpec(t, w, 1))
		at := make([]time.Duration, limit)
		for i := range at {
			at[i] = 3*w + time.Duration(i)*7*time.Millisecond + 1 // never on a tick
			if r := c.AllowAt(at[i], 1, limit); !r.Allowed {
				t.Fatalf("limit %d: hit %d refused", limit, i)
			}
		}
		for i, a := range at {
			if r := c.AllowAt(a+w-1, 1, limit); r.Allowed || r.Reset != 1 {
				t.Fatalf("limit %d: 1ns before hit %d leaves: %+v, want refused with reset 1ns", limit, i, r)
			}
			if r := c.AllowAt(a+w, 1, limit); !r.Allowed {
				t.Fatalf("limit %d: refused when hit %d left exactly: %+v", limit, i, r)
			}
		}
	}
}

// TestCounterEdgesOnTheTickGrid: a hit on the tick grid, in a closed block
// (limits up to Blocks) or in the open block (above), counts up to 1ns
// before it is a window old and not at it, for CountAt (once a later check
// has moved the newest time on) as for AllowAt; and
// an UndoAt of hits a window old takes back nothing (they left), not newer
// hits in their place.
func TestCounterEdgesOnTheTickGrid(t *testing.T) {
	w := time.Second
	for _, limit := range []uint64{1, 10, 4 * Blocks} {
		c := NewCounter(mustSpec(t, w, 1))
		t0 := 3 * w // a multiple of the tick
		first := c.AllowAt(t0, 1, limit)
		if !first.Recorded {
			t.Fatalf("limit %d: the first hit %+v", limit, first)
		}
		c.AllowAt(t0+w/2, 0, limit) // a check: the newest time moves on
		if got := c.CountAt(t0 + w - 1); got != 1 {
			t.Errorf("limit %d: 1ns before the hit leaves, count %d, want 1", limit, got)
		}
		if got := c.CountAt(t0 + w); got != 0 {
			t.Errorf("limit %d: as the hit leaves, count %d, want 0", limit, got)
		}
		if r := c.AllowAt(t0+w, 0, limit); r.Remaining != limit {
			t.Errorf("limit %d: a check as the hit leaves %+v, want %d remaining", limit, r, limit)
		}
		if r := c.AllowAt(t0+w, 1, limit); !r.Recorded {
			t.Fatalf("limit %d: the second hit %+v", limit, r)
		}
		c.UndoAt(first.Bucket, 1)
		if got := c.CountAt(t0 + w); got != 1 {
			t.Errorf("limit %d: after undoing a hit a window old, count %d, want the newer 1", limit, got)
		}
	}
}

// TestCounterRefundKeepsStamps: a refund that reopens a closed block keeps
// the block's time, so the hits left in it count until that time leaves.
func TestCounterRefundKeepsStamps(t *testing.T) {
	w := time.Second
	c := NewCounter(mustSpec(t, w, 1))
	const limit = 4 * Blocks // blocks of 4 hits
	at := 2*w + 5*time.Millisecond + 1
	c.AllowAt(at, 4, limit) // one closed block, stamped at's tick
	c.RefundAt(at, 1)       // reopened: 3 hits left in the open block
	if got := c.CountAt(at + w - 1); got != 3 {
		t.Fatalf("1ns before the hits leave: count %d, want 3", got)
	}
	if got := c.CountAt(at + w + TickLength(w)); got != 0 {
		t.Fatalf("a tick after they left: count %d, want 0", got)
	}
}

// TestCounterStampsAcrossRegroupings: hits keep the time they were
// recorded at (rounded up to the tick) when blocks are regrouped, whichever
// way: a limit change that re-sizes the blocks, or room that frees in a
// full ring. Each case counts its hits a window after the time they must
// have left at, to the nanosecond.
func TestCounterStampsAcrossRegroupings(t *testing.T) {
	const w = time.Second
	t1 := 3 * w // the times are multiples of the tick
	t2 := t1 + w/4
	for _, tt := range []struct {
		name string
		// run records hits on c; the count at at must be want.
		run  func(c *Counter)
		at   time.Duration
		want uint64
	}{
		// Exact log to exact log (blocks of one hit): the block of t1's
		// hit is regrouped on its own, not with t2's.
		{"re-sized, one old block to one new", func(c *Counter) {
			c.AllowAt(t1, 1, 10)
			c.AllowAt(t2, 1, 10)
			c.AllowAt(t2, 0, 12) // a new limit re-sizes the blocks
		}, t1 + w, 1},
		// Blocks of 2 re-sized to blocks of 3: t1's two hits do not fill
		// one and stay open at t1, not at the time of the open block a
		// refund emptied (t2).
		{"re-sized, what is left open keeps its time", func(c *Counter) {
			c.AllowAt(t1, 2, 2*Blocks)
			c.AllowAt(t2, 1, 2*Blocks)
			c.RefundAt(t2, 1)
			c.AllowAt(t2, 0, 3*Blocks)
		}, t1 + w, 0},
		// A full ring (charges past an exact log's limit): hits wait in
		// the open block, stamped with the newest of them (t2); once the
		// oldest blocks leave (at t1 + w), the blocks made of
		// them keep t2, the last one too, and only the new hit takes
		// the new time.
		{"a full ring, then room", func(c *Counter) {
			c.ChargeAt(t1, ExactLimit+4, 5)
			c.ChargeAt(t2, 1, 5)
			c.ChargeAt(t1+w, 1, 5)
		}, t2 + w, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCounter(mustSpec(t, w, 1))
			tt.run(c)
			if got := c.CountAt(tt.at - 1); got <= tt.want {
				t.Fatalf("1ns before: count %d, want more than %d", got, tt.want)
			}
			if got := c.CountAt(tt.at); got != tt.want {
				t.Errorf("count %d, want %d", got, tt.want)
			}
		})
	}
}
