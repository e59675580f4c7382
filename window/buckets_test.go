package window

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func mustSpec(t testing.TB, length time.Duration, buckets int) Spec {
	t.Helper()
	s, err := NewSpec(length, buckets)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNewSpec(t *testing.T) {
	tests := []struct {
		length  time.Duration
		buckets int
		wantErr bool
	}{
		{time.Second, 20, false},
		{time.Second, 1, false},
		{time.Minute, 60, false},
		{time.Second, 3, true}, // 333.33 ms: never truncated
		{time.Second, 7, true},
		{time.Second, 0, true},
		{time.Second, -1, true},
		{0, 10, true},
		{-time.Second, 10, true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%v/%d", tt.length, tt.buckets), func(t *testing.T) {
			s, err := NewSpec(tt.length, tt.buckets)
			if (err != nil) != tt.wantErr {
				t.Fatalf("NewSpec(%v, %d) error = %v, want error %v", tt.length, tt.buckets, err, tt.wantErr)
			}
			if err == nil && s.BucketLength()*time.Duration(s.Buckets()) != s.Length() {
				t.Fatalf("buckets of %v do not cover the window %v", s.BucketLength(), s.Length())
			}
		})
	}
}

func TestBucketCounterAllowAndRemaining(t *testing.T) {
	c := NewBucketCounter(mustSpec(t, time.Second, 10))
	for i := range uint64(5) {
		r := c.AllowAt(50*time.Millisecond, 1, 5)
		if !r.Allowed || !r.Recorded || r.Remaining != 4-i {
			t.Fatalf("hit %d: %+v, want allowed with remaining %d", i, r, 4-i)
		}
		if want := 1100*time.Millisecond - 50*time.Millisecond; r.Reset != want {
			t.Fatalf("hit %d: reset %v, want %v", i, r.Reset, want)
		}
	}
	if r := c.AllowAt(50*time.Millisecond, 1, 5); r.Allowed || r.Recorded || r.Remaining != 0 {
		t.Fatalf("6th hit: %+v, want refused", r)
	}
	if r := c.AllowAt(60*time.Millisecond, 0, 5); r.Allowed || r.Recorded {
		t.Fatalf("check at the limit: %+v, want not allowed", r)
	}
	if got := c.CountAt(60 * time.Millisecond); got != 5 {
		t.Fatalf("count %d, want 5", got)
	}
}

// A clock that steps back is treated as standing still: counts recorded at
// the newer time are kept and still enforced (no fail-open), and new hits
// still count.
func TestBucketCounterClockStepBack(t *testing.T) {
	tests := []struct {
		name    string
		buckets int
		back    time.Duration
	}{
		{"1 bucket, 2s back", 1, 2 * time.Second},
		{"10 buckets, 2s back", 10, 2 * time.Second},
		{"10 buckets, half a bucket back", 10, 50 * time.Millisecond},
		{"20 buckets, an hour back", 20, time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewBucketCounter(mustSpec(t, time.Second, tt.buckets))
			t0 := 2*time.Hour + 500*time.Millisecond
			for range 6 {
				c.AllowAt(t0, 1, 10)
			}
			back := t0 - tt.back
			if got := c.CountAt(back); got != 6 {
				t.Fatalf("count after step back = %d, want 6 (counts dropped)", got)
			}
			admitted := 0
			for range 100 {
				if c.AllowAt(back, 1, 10).Allowed {
					admitted++
				}
			}
			if admitted != 4 {
				t.Fatalf("admitted %d after the step back, want 4 (limit 10, 6 counted)", admitted)
			}
			if got := c.CountAt(back); got != 10 {
				t.Fatalf("count = %d, want 10", got)
			}
		})
	}
}

// Every round moves to a new bucket, whose slot still holds counts of an
// epoch one ring turn older: the first writers reset it while others add.
// No add may be lost: the total after each round is exact.
func TestBucketCounterConcurrentWritersDuringReset(t *testing.T) {
	const (
		k       = 4
		writers = 8
		perG    = 300
		rounds  = 60
	)
	spec := mustSpec(t, 40*time.Millisecond, k)
	b := spec.BucketLength()
	c := NewBucketCounter(spec)
	var perRound [rounds]uint64
	for r := range rounds {
		var wg sync.WaitGroup
		start := make(chan struct{})
		now := time.Duration(r)*b + b/2
		for g := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := range perG {
					c.AllowAt(now+time.Duration(i%3), uint64(1+g%2), MaxLimit)
				}
			}()
		}
		close(start)
		wg.Wait()
		perRound[r] = perG * (writers/2*1 + writers/2*2)
		var want uint64
		for x := max(0, r-k); x <= r; x++ {
			want += perRound[x]
		}
		if got := c.CountAt(now); got != want {
			t.Fatalf("round %d: count %d, want %d (lost %d)", r, got, want, int64(want)-int64(got))
		}
	}
}

// Writers spread over time with the buckets turning under them: the sum of
// admitted hits still in the window is exact at the end.
func TestBucketCounterConcurrentWritersMovingClock(t *testing.T) {
	const (
		k       = 5
		writers = 8
		perG    = 4000
	)
	spec := mustSpec(t, 50*time.Millisecond, k)
	c := NewBucketCounter(spec)
	var clock atomic.Int64
	var wg sync.WaitGroup
	var perBucket [perG/100 + 2]atomic.Uint64
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perG {
				if i%100 == 0 {
					clock.CompareAndSwap(int64(i/100-1)*int64(spec.BucketLength()), int64(i/100)*int64(spec.BucketLength()))
				}
				now := time.Duration(clock.Load())
				if r := c.AllowAt(now, 1, MaxLimit); r.Allowed {
					perBucket[r.Bucket].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	now := time.Duration(clock.Load())
	e := int64(now / spec.BucketLength())
	var want uint64
	for x := max(0, e-k); x <= e; x++ {
		want += perBucket[x].Load()
	}
	if got := c.CountAt(now); got != want {
		t.Fatalf("count %d, want %d", got, want)
	}
}

// Many goroutines hammering one key at one instant: exactly limit admitted.
func TestBucketCounterAtomicAdmission(t *testing.T) {
	tests := []struct {
		limit uint64
		hits  uint64
	}{
		{1000, 1},
		{1, 1},
		{999, 3},
		{1000, 7},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("limit %d hits %d", tt.limit, tt.hits), func(t *testing.T) {
			c := NewBucketCounter(mustSpec(t, time.Second, 20))
			var admitted atomic.Uint64
			var wg sync.WaitGroup
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 500 {
						if c.AllowAt(time.Hour, tt.hits, tt.limit).Allowed {
							admitted.Add(tt.hits)
						}
					}
				}()
			}
			wg.Wait()
			want := tt.limit / tt.hits * tt.hits
			if got := admitted.Load(); got != want {
				t.Fatalf("admitted %d hits, want exactly %d", got, want)
			}
			if got := c.CountAt(time.Hour); got != want {
				t.Fatalf("counted %d, want %d", got, want)
			}
		})
	}
}

// maxInAnyWindow returns the largest number of admitted hits inside any
// real window (t-w, t], by an exact sliding log over the admission times
// (sorted).
func maxInAnyWindow(times []time.Duration, w time.Duration) int {
	best, lo := 0, 0
	for hi, t := range times {
		for times[lo] <= t-w {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// A plain LeapArray admits 2x the limit inside one real window: a burst at
// the end of the oldest bucket, another right after it expires. Ours must
// admit at most limit in every window of length W, for every bucket count.
func TestBucketCounterNoBoundaryBurst(t *testing.T) {
	const limit = 100
	for _, k := range []int{1, 2, 4, 10, 20, 60} {
		t.Run(fmt.Sprintf("%d buckets", k), func(t *testing.T) {
			w := 1200 * time.Millisecond
			spec := mustSpec(t, w, k)
			b := spec.BucketLength()
			c := NewBucketCounter(spec)
			var admitted []time.Duration
			// Burst at the very end of the first bucket, then probe every
			// millisecond with a burst for three windows.
			for now := b - time.Nanosecond; now < 3*w; now += time.Millisecond {
				for range limit {
					if c.AllowAt(now, 1, limit).Allowed {
						admitted = append(admitted, now)
					}
				}
			}
			if got := maxInAnyWindow(admitted, w); got > limit {
				t.Fatalf("%d hits admitted inside one window of %v, limit %d", got, w, limit)
			}
			if len(admitted) < 2*limit {
				t.Fatalf("only %d admitted over 3 windows: the window never frees", len(admitted))
			}
			// Random traffic at 1.5x the limit, sometimes bursty.
			c = NewBucketCounter(spec)
			rng := rand.New(rand.NewPCG(1, uint64(k)))
			admitted = admitted[:0]
			gap := w / (limit * 3 / 2)
			for now := time.Duration(0); now < 20*w; now += time.Duration(rng.Int64N(int64(2 * gap))) {
				n := uint64(1)
				if rng.IntN(20) == 0 {
					n = uint64(1 + rng.IntN(10))
				}
				if c.AllowAt(now, n, limit).Allowed {
					for range n {
						admitted = append(admitted, now)
					}
				}
			}
			if got := maxInAnyWindow(admitted, w); got > limit {
				t.Fatalf("random traffic: %d hits admitted inside one window of %v, limit %d", got, w, limit)
			}
		})
	}
}

// Refused hits are not counted: a client hammering while over the limit
// recovers exactly when its admitted hits age out, and a raised limit helps
// at once.
func TestBucketCounterOverLimitConsumesNoQuota(t *testing.T) {
	spec := mustSpec(t, time.Second, 10)
	quiet := NewBucketCounter(spec)
	hammered := NewBucketCounter(spec)
	for _, c := range []*BucketCounter{quiet, hammered} {
		for range 10 {
			c.AllowAt(0, 1, 10)
		}
	}
	for now := time.Duration(0); now < 1100*time.Millisecond; now += time.Millisecond {
		if r := hammered.AllowAt(now, 1, 10); r.Allowed {
			t.Fatalf("admitted at %v while 10 are counted", now)
		}
	}
	free := 1100 * time.Millisecond // bucket 0 leaves at (0+10+1) buckets
	if got, want := hammered.CountAt(free), quiet.CountAt(free); got != want || got != 0 {
		t.Fatalf("at %v hammered counter counts %d, quiet one %d, want 0", free, got, want)
	}
	if r := hammered.AllowAt(free, 10, 10); !r.Allowed {
		t.Fatalf("hammered client still blocked at %v: %+v", free, r)
	}
	// A raised limit applies at once to the full window.
	if r := hammered.AllowAt(free+time.Millisecond, 1, 10); r.Allowed {
		t.Fatalf("11th hit admitted under limit 10: %+v", r)
	}
	if r := hammered.AllowAt(free+time.Millisecond, 5, 15); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("raised limit did not apply at once: %+v", r)
	}
}

// A refused request's Reset is an honest Retry-After: at now+Reset it
// passes, one nanosecond earlier it does not. An allowed request's Reset is
// when everything counted has aged out.
func TestBucketCounterResetHonest(t *testing.T) {
	type hit struct {
		at time.Duration
		n  uint64
	}
	tests := []struct {
		name    string
		buckets int
		limit   uint64
		hits    []hit
		at      time.Duration
		n       uint64
	}{
		{"one bucket", 1, 5, []hit{{100 * time.Millisecond, 5}}, 300 * time.Millisecond, 1},
		{"spread", 10, 10, []hit{{0, 3}, {250 * time.Millisecond, 3}, {720 * time.Millisecond, 4}}, 900 * time.Millisecond, 1},
		{"needs two buckets", 10, 10, []hit{{0, 3}, {250 * time.Millisecond, 3}, {720 * time.Millisecond, 4}}, 900 * time.Millisecond, 5},
		{"needs all", 10, 10, []hit{{0, 3}, {250 * time.Millisecond, 3}, {720 * time.Millisecond, 4}}, 900 * time.Millisecond, 10},
		{"check only", 20, 4, []hit{{10 * time.Millisecond, 2}, {990 * time.Millisecond, 2}}, 995 * time.Millisecond, 0},
		{"late in window", 20, 4, []hit{{10 * time.Millisecond, 2}, {990 * time.Millisecond, 2}}, 1049 * time.Millisecond, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewBucketCounter(mustSpec(t, time.Second, tt.buckets))
			for _, h := range tt.hits {
				if !c.AllowAt(h.at, h.n, tt.limit).Allowed {
					t.Fatalf("setup hit %+v refused", h)
				}
			}
			r := c.AllowAt(tt.at, tt.n, tt.limit)
			if r.Allowed || r.Recorded || r.Reset <= 0 {
				t.Fatalf("request not refused with a Reset: %+v", r)
			}
			if early := c.AllowAt(tt.at+r.Reset-time.Nanosecond, tt.n, tt.limit); early.Allowed {
				t.Fatalf("allowed %v before the announced Reset %v", time.Nanosecond, r.Reset)
			}
			if on := c.AllowAt(tt.at+r.Reset, tt.n, tt.limit); !on.Allowed {
				t.Fatalf("refused at the announced Reset %v: %+v", r.Reset, on)
			}
		})
	}

	t.Run("allowed reset ages everything out", func(t *testing.T) {
		c := NewBucketCounter(mustSpec(t, time.Second, 20))
		c.AllowAt(10*time.Millisecond, 1, 10)
		r := c.AllowAt(420*time.Millisecond, 2, 10)
		if !r.Allowed {
			t.Fatalf("refused: %+v", r)
		}
		at := 420*time.Millisecond + r.Reset
		if got := c.CountAt(at - time.Nanosecond); got == 0 {
			t.Fatalf("nothing counted just before Reset %v", r.Reset)
		}
		if got := c.CountAt(at); got != 0 {
			t.Fatalf("%d still counted at Reset %v", got, r.Reset)
		}
		if r := c.AllowAt(at, 0, 10); r.Reset != 0 || r.Remaining != 10 {
			t.Fatalf("empty window: %+v, want Reset 0 and Remaining 10", r)
		}
	})
}

func TestBucketCounterImpossibleRequest(t *testing.T) {
	c := NewBucketCounter(mustSpec(t, time.Second, 10))
	for _, tc := range []struct{ hits, limit uint64 }{{1, 0}, {11, 10}, {0, 0}} {
		r := c.AllowAt(0, tc.hits, tc.limit)
		if r.Allowed || r.Reset != time.Second {
			t.Fatalf("hits %d limit %d: %+v, want refused with Reset of the full window", tc.hits, tc.limit, r)
		}
	}
	if got := c.CountAt(0); got != 0 {
		t.Fatalf("refused requests counted: %d", got)
	}
}

func TestBucketCounterUndoAndRefund(t *testing.T) {
	c := NewBucketCounter(mustSpec(t, time.Second, 10))
	r1 := c.AllowAt(0, 4, 10)
	r2 := c.AllowAt(150*time.Millisecond, 3, 10)
	c.UndoAt(r1.Bucket, 4)
	if got := c.CountAt(200 * time.Millisecond); got != 3 {
		t.Fatalf("after undo: count %d, want 3", got)
	}
	c.UndoAt(r1.Bucket, 4) // nothing left there
	if got := c.CountAt(200 * time.Millisecond); got != 3 {
		t.Fatalf("after a second undo: count %d, want 3", got)
	}
	// After the bucket left the window an undo must not touch a newer one.
	c.AllowAt(1200*time.Millisecond, 2, 10)
	c.UndoAt(r2.Bucket, 3)
	if got := c.CountAt(1200 * time.Millisecond); got != 2 {
		t.Fatalf("undo of an aged-out bucket changed the count: %d, want 2", got)
	}

	c = NewBucketCounter(mustSpec(t, time.Second, 10))
	c.AllowAt(0, 4, 10)
	c.AllowAt(500*time.Millisecond, 3, 10)
	c.RefundAt(600*time.Millisecond, 5)
	if got := c.CountAt(600 * time.Millisecond); got != 2 {
		t.Fatalf("after refund of 5: count %d, want 2", got)
	}
	// The refund took the newest hits first: the remaining 2 are in bucket
	// 0 and leave at 1.1 s.
	if got := c.CountAt(1100 * time.Millisecond); got != 0 {
		t.Fatalf("count at 1.1s = %d, want 0", got)
	}
	c.RefundAt(1200*time.Millisecond, 100) // floored at zero
	if got := c.CountAt(1200 * time.Millisecond); got != 0 {
		t.Fatalf("refund below zero: count %d", got)
	}
}

func TestBucketCounterIdleForLong(t *testing.T) {
	c := NewBucketCounter(mustSpec(t, time.Second, 10))
	c.AllowAt(0, 10, 10)
	later := 1000 * time.Hour
	if got := c.CountAt(later); got != 0 {
		t.Fatalf("count after a long idle = %d, want 0", got)
	}
	if r := c.AllowAt(later, 10, 10); !r.Allowed {
		t.Fatalf("refused after a long idle: %+v", r)
	}
}

// Resets on every other operation: a two-slot ring (one bucket) and a
// clock moving half a bucket per hit, with writers on every core. A reset
// that is not a compare-and-swap on the packed word wipes concurrent adds
// (their hits stay in the total forever), caught by the exact count.
func TestBucketCounterConcurrentResetsExact(t *testing.T) {
	const k = 1
	spec := mustSpec(t, 2*time.Microsecond, k)
	b := spec.BucketLength()
	c := NewBucketCounter(spec)
	writers := max(2, runtime.GOMAXPROCS(0))
	const perG = 200_000
	var clock atomic.Int64
	perBucket := make([]atomic.Uint64, writers*perG/2+2)
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perG {
				now := time.Duration(clock.Add(int64(b) / 2))
				if r := c.AllowAt(now, 1, MaxLimit); r.Allowed {
					perBucket[r.Bucket].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	now := time.Duration(clock.Load())
	e := int64(now / b)
	var want uint64
	for x := max(0, e-k); x <= e; x++ {
		want += perBucket[x].Load()
	}
	if got := c.CountAt(now); got != want {
		t.Fatalf("count %d, want %d", got, want)
	}
}

// Epoch tags are 32 bits: a counter idle for 2^31 buckets or more (a
// multiple of 2^32 included) must still see its old hits as stale.
func TestBucketCounterIdleBeyondTagRange(t *testing.T) {
	spec := mustSpec(t, 11*time.Nanosecond, 11) // 1 ns buckets: 2^32 buckets in 4.3 s
	for _, idle := range []int64{1 << 31, 1<<31 + 5, 1 << 32, 1<<32 + 12*7, 3 << 31, 5<<32 + 1} {
		t.Run(fmt.Sprint(idle), func(t *testing.T) {
			c := NewBucketCounter(spec)
			t0 := time.Duration(1000)
			for i := range 11 {
				c.AllowAt(t0+time.Duration(i), 1, 11)
			}
			later := t0 + time.Duration(idle)
			if got := c.CountAt(later); got != 0 {
				t.Fatalf("count after %d idle buckets = %d, want 0", idle, got)
			}
			for i := range 11 {
				if r := c.AllowAt(later+time.Duration(i), 1, 11); !r.Allowed {
					t.Fatalf("hit %d after %d idle buckets refused: %+v", i, idle, r)
				}
			}
			if got := c.CountAt(later + 10); got != 11 {
				t.Fatalf("count = %d, want 11", got)
			}
		})
	}
}

// A counter first used when the epoch's low 32 bits are in their upper
// half (a process up for a long time with short buckets) must count.
func TestBucketCounterFirstUseLate(t *testing.T) {
	spec := mustSpec(t, 11*time.Nanosecond, 11)
	for _, at := range []int64{3<<30 + 5, 1<<32 - 3, 7<<31 + 1} {
		c := NewBucketCounter(spec)
		for i := range 11 {
			if r := c.AllowAt(time.Duration(at), 1, 11); !r.Allowed {
				t.Fatalf("at %d: hit %d refused: %+v", at, i, r)
			}
		}
		if r := c.AllowAt(time.Duration(at), 1, 11); r.Allowed {
			t.Fatalf("at %d: 12th hit allowed (hits were lost): %+v", at, r)
		}
	}
}

// TestBucketCounterRefundReachesTheOldestBucket: a hit counts until its
// bucket is a whole window behind the current one (1.1 s here, for 10
// buckets of 100 ms), and a refund until then takes it back from there.
func TestBucketCounterRefundReachesTheOldestBucket(t *testing.T) {
	c := NewBucketCounter(mustSpec(t, time.Second, 10))
	t0 := 5 * time.Second
	c.AllowAt(t0, 1, 10)
	if got := c.CountAt(t0 + time.Second); got != 1 {
		t.Fatalf("a window later, in the oldest bucket still counted: count %d, want 1", got)
	}
	c.RefundAt(t0+time.Second, 1)
	if got := c.CountAt(t0 + time.Second); got != 0 {
		t.Errorf("after a refund from the oldest bucket: count %d, want 0", got)
	}
}

// TestBucketCounterLateWriter: a writer counts its hits in the total, then
// records them in its bucket's slot; descheduled in between, it may find
// that the newest bucket has moved on. While its bucket is in the window
// the hits go into its slot; once it is a window and one bucket behind
// (drained, its slot retagged), they come out of the total instead, and
// nothing is left counted. Driven step by step, as the race that leads
// there cannot be timed.
func TestBucketCounterLateWriter(t *testing.T) {
	spec := mustSpec(t, time.Second, 10) // buckets of 100 ms
	const e = 50                         // the writer's bucket
	for _, tt := range []struct {
		name   string
		behind int64 // buckets the newest moved on meanwhile
		want   uint64
	}{
		{"its bucket the oldest in the window", 10, 3},
		{"its bucket just gone", 11, 0},
		{"long gone", 25, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := NewBucketCounter(spec)
			c.CountAt(bucketStart(e)) // the writer's bucket is the newest
			c.total.Add(3)            // it counts its hits
			c.CountAt(bucketStart(e + tt.behind))
			c.record(e, 3) // and records them late
			if got := c.CountAt(bucketStart(e + tt.behind)); got != tt.want {
				t.Errorf("count %d, want %d", got, tt.want)
			}
		})
	}
}

// TestBucketCounterWriterAheadOfDrain: a writer of a new bucket may reach
// its slot before the drain that the move of the newest bucket started:
// the slot still holds the hits of the bucket a ring earlier. They leave
// the total as the writer's hits replace them, and the drain that follows
// keeps the writer's hits. Driven step by step, as the race that leads
// there cannot be timed.
func TestBucketCounterWriterAheadOfDrain(t *testing.T) {
	spec := mustSpec(t, time.Second, 10) // buckets of 100 ms
	c := NewBucketCounter(spec)
	const old = 50
	if r := c.AllowAt(bucketStart(old), 3, 100); !r.Allowed || r.Bucket != old {
		t.Fatalf("3 hits at bucket %d: %+v", old, r)
	}
	next := old + c.ring() // the same slot, a ring later
	c.latest.Store(next)   // a writer moved the newest bucket on, its drain not yet run
	c.total.Add(2)         // a second writer counts its hits
	c.record(next, 2)      // and records them before the drain reaches the slot
	c.drain(old, next)     // the first writer's drain
	if got := c.CountAt(bucketStart(next)); got != 2 {
		t.Errorf("count %d, want 2: the writer's hits, none of the bucket a ring earlier", got)
	}
}

// bucketStart is the start of bucket epoch for the 100 ms buckets (a 1 s
// window of 10) of the step-by-step race tests.
func bucketStart(epoch int64) time.Duration { return time.Duration(epoch) * 100 * time.Millisecond }
