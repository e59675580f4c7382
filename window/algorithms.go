package window

import (
	"sync/atomic"
	"time"
	"unsafe"
)

// Algorithm selects how a key's counter admits hits. Its number is also how
// the Redis backend's scripts name it (they are given the constants by name,
// generated from Algorithms), so the numbers of the constants below never
// change; a new algorithm takes the next one.
type Algorithm uint8

// The algorithms a Request may choose.
const (
	// SlidingWindow (the default) admits at most limit hits in any window
	// of length Spec.Length() (no boundary burst) and gives up less than
	// one block, ceil(limit/Blocks) hits, of the capacity an exact sliding
	// log would admit, whatever the traffic shape; for a limit of at most
	// ExactLimit it is the exact sliding log, and up to Blocks the exact log
	// with times rounded up to TickLength. 256 bytes per key whatever the
	// limit; see Counter. The Spec's bucket count is ignored.
	SlidingWindow Algorithm = 0
	// TokenBucket is GCRA: a bucket of limit tokens refilled at limit per
	// Spec.Length(), one timestamp per key. A full bucket admits a burst of
	// limit at once, then hits pass at the refill rate; in any interval T at
	// most limit + limit*T/Length() are admitted. Pick it for burst-friendly
	// APIs and smooth pacing; retry times are exact. Buckets are ignored.
	TokenBucket Algorithm = 1
	// FixedWindow counts hits in epoch-aligned windows of Spec.Length()
	// (as envoyproxy/ratelimit does), so up to 2x limit can pass around a
	// window edge. Unlike envoyproxy/ratelimit, refused hits are not
	// counted. Pick it to reproduce that service's behaviour exactly.
	// Buckets are ignored.
	FixedWindow Algorithm = 2
	// SlidingLog is the exact sliding window to the nanosecond: one
	// timestamp per admitted hit, at most limit hits in any window of
	// length Spec.Length() and no false rejects. Memory is 8 bytes per unit
	// of limit (BenchmarkBytesPerKey), so limits are capped at MaxLogLimit,
	// and it is the one algorithm whose cost grows with the limit. The
	// default SlidingWindow is the same log for limits up to Blocks (with
	// timestamps rounded up to TickLength) in a fixed size, so SlidingLog
	// is only for rules that need nanosecond timestamps. Buckets are
	// ignored.
	SlidingLog Algorithm = 3
	// TimeBuckets is Sentinel's LeapArray made safe: Spec.Buckets() time
	// buckets per window, the oldest (partly overlapping) bucket counted in
	// full, so at most limit hits pass in any window; a hit counts for
	// between W and W + W/buckets, which costs up to 1/(buckets+1) of the
	// capacity under steady load and much more for bursty clients (see
	// BucketCounter). Pick it for Sentinel's semantics or comparisons.
	TimeBuckets Algorithm = 4
	// Concurrency limits requests in flight, not a rate: a hit holds a slot
	// until a refund (Request.Negative) gives it back, or until its lease,
	// Spec.Length(), ends; see LeaseCounter. Limits are capped at
	// MaxLogLimit. Rule files spell it as a concurrency_limit block, not as
	// a rate_limit algorithm, so ParseAlgorithm does not name it.
	Concurrency Algorithm = 5
)

// meter is what a Store keeps per key: one of Counter, GCRA, FixedCounter,
// LogCounter, BucketCounter.
type meter interface {
	AllowAt(now time.Duration, hits, limit uint64) Result
	// undo takes back hits recorded in bucket under limit.
	undo(bucket int64, hits, limit uint64)
	// refund takes back hits as of now and answers a check.
	refund(now time.Duration, hits, limit uint64) Result
	idleAt(now time.Duration) bool
	LastUsed() time.Duration
	layout() (Spec, Algorithm)
	// footprint is the heap bytes the counter holds now: the struct and
	// what it points to, rounded to Go's allocation size classes.
	footprint() int64
}

// grower is a meter whose footprint changes after it was created (a
// sliding log's ring, a lease counter's leases): the Store adds the change
// to its accounted bytes after each call.
type grower interface {
	takeGrowth() int64
}

// charger is a meter that serves Request.ChargeAlways (an algorithm whose
// Info().ChargeAlways is set).
type charger interface {
	ChargeAt(now time.Duration, hits, limit uint64) Result
}

// newMeter returns a new counter of algorithm alg (a valid one) for spec.
func newMeter(spec Spec, alg Algorithm) meter { return algorithms[alg].newMeter(spec) }

func (c *BucketCounter) undo(bucket int64, hits, _ uint64) { c.UndoAt(bucket, hits) }
func (c *BucketCounter) refund(now time.Duration, hits, limit uint64) Result {
	c.RefundAt(now, hits)
	return c.AllowAt(now, 0, limit)
}
func (c *BucketCounter) layout() (Spec, Algorithm) { return c.Spec(), TimeBuckets }
func (c *BucketCounter) footprint() int64 {
	return sizeClass(int64(unsafe.Sizeof(*c))) + sizeClass(int64(len(c.slots))*8)
}

// GCRA is a token bucket kept as one theoretical arrival time (TAT) per
// key, updated by compare-and-swap (the generic cell rate algorithm). With
// limit L per window W, a hit costs the emission interval T = ceil(W/L) and
// a request passes if the TAT it would leave is at most L*T ahead of now:
// a full bucket admits L hits at once, then one per T.
//
// A GCRA is safe for concurrent use, lock-free and allocation-free. Times
// are Durations on a monotonic Clock; a time earlier than one already seen
// is treated as that time.
type GCRA struct {
	spec Spec
	tat  atomic.Int64 // theoretical arrival time, ns
	seen atomic.Int64 // newest time seen
}

// NewGCRA returns a full token bucket refilled over spec.Length().
func NewGCRA(spec Spec) *GCRA {
	if !spec.valid() {
		panic("window: NewGCRA with an invalid Spec (build it with NewSpec)")
	}
	return &GCRA{spec: spec}
}

// AllowAt takes hits tokens if the bucket holds them (all or nothing);
// hits == 0 checks for one token. Result.Remaining is the whole tokens
// left; Reset is, when allowed, the time until the bucket is full again,
// when refused, the exact time until the request would pass.
func (g *GCRA) AllowAt(now time.Duration, hits, limit uint64) Result {
	limit = min(limit, MaxLimit)
	t := g.clamp(now)
	if limit == 0 || hits > limit {
		return Result{Reset: g.spec.Length()}
	}
	interval := g.interval(limit)
	tau := int64(limit) * interval // burst tolerance: L tokens
	for {
		tat := g.tat.Load()
		base := max(tat, t)
		cost := int64(max(hits, 1)) * interval
		next := base + cost
		if next-t > tau || hits == 0 {
			r := Result{
				Allowed:   next-t <= tau,
				Remaining: uint64(max(0, tau-(base-t)) / interval), // < 0 after a lowered limit
			}
			if r.Allowed {
				r.Reset = max(0, time.Duration(base)-now)
			} else {
				r.Reset = max(0, time.Duration(next-tau)-now)
			}
			return r
		}
		if g.tat.CompareAndSwap(tat, next) {
			return Result{
				Allowed:   true,
				Recorded:  true,
				Remaining: uint64((tau - (next - t)) / interval),
				Reset:     max(0, time.Duration(next)-now),
			}
		}
	}
}

// LastUsed returns the newest time seen.
func (g *GCRA) LastUsed() time.Duration { return time.Duration(g.seen.Load()) }

func (g *GCRA) undo(_ int64, hits, limit uint64) { g.giveBack(g.seen.Load(), hits, limit) }

func (g *GCRA) refund(now time.Duration, hits, limit uint64) Result {
	g.giveBack(g.clamp(now), hits, limit)
	return g.AllowAt(now, 0, limit)
}

// giveBack returns hits tokens, never filling the bucket beyond full.
func (g *GCRA) giveBack(t int64, hits, limit uint64) {
	limit = min(limit, MaxLimit)
	if hits == 0 || limit == 0 {
		return
	}
	back := int64(min(hits, limit)) * g.interval(limit)
	for {
		tat := g.tat.Load()
		if tat <= t {
			return
		}
		if g.tat.CompareAndSwap(tat, max(tat-back, t)) {
			return
		}
	}
}

func (g *GCRA) idleAt(now time.Duration) bool { return g.tat.Load() <= g.clamp(now) }

func (g *GCRA) layout() (Spec, Algorithm) { return g.spec, TokenBucket }
func (g *GCRA) footprint() int64          { return sizeClass(int64(unsafe.Sizeof(*g))) }

// interval is the emission interval for limit: W/limit rounded up, so the
// sustained rate never exceeds limit per window.
func (g *GCRA) interval(limit uint64) int64 {
	l := int64(limit)
	return (g.spec.length + l - 1) / l
}

// clamp returns now as ns, never earlier than a time already seen.
func (g *GCRA) clamp(now time.Duration) int64 {
	t := int64(max(now, 0))
	for {
		s := g.seen.Load()
		if t <= s {
			return s
		}
		if g.seen.CompareAndSwap(s, t) {
			return t
		}
	}
}

// FixedCounter counts hits in epoch-aligned windows of Spec.Length()
// (window n covers [n*W, (n+1)*W)), in one word packing the window number
// (high 32 bits) and its count (low 32 bits), updated by compare-and-swap;
// the full newest window number is kept beside it, so the 32-bit tag is
// only compared for equality with a current window. Refused hits are not
// counted. It is safe for concurrent use, lock-free and allocation-free; a
// clock that steps back is treated as standing still.
type FixedCounter struct {
	spec   Spec
	latest atomic.Int64  // newest window number seen
	word   atomic.Uint64 // window tag << 32 | count
	seen   atomic.Int64  // latest time passed to AllowAt, for LRU eviction
}

// NewFixedCounter returns an empty fixed-window counter.
func NewFixedCounter(spec Spec) *FixedCounter {
	if !spec.valid() {
		panic("window: NewFixedCounter with an invalid Spec (build it with NewSpec)")
	}
	return &FixedCounter{spec: spec}
}

// AllowAt adds hits to the current window if they fit under limit;
// hits == 0 checks for one more. Reset is the time until the window ends.
// Result.Bucket is the window number, for undo.
func (f *FixedCounter) AllowAt(now time.Duration, hits, limit uint64) Result {
	return f.admit(now, hits, limit, false)
}

// ChargeAt is AllowAt for hits consumed whether they fit or not
// (Request.ChargeAlways): hits that do not fit are added all the same (the
// count is capped at MaxLimit), and the answer is refused with Recorded
// set, Remaining 0 and Reset the time until the window ends.
func (f *FixedCounter) ChargeAt(now time.Duration, hits, limit uint64) Result {
	return f.admit(now, hits, limit, true)
}

// admit is AllowAt, or ChargeAt when always is set.
func (f *FixedCounter) admit(now time.Duration, hits, limit uint64, always bool) Result {
	limit = min(limit, MaxLimit)
	if now > 0 && int64(now) > f.seen.Load() {
		f.seen.Store(int64(now)) // racy max, fine for LRU
	}
	cur := f.advance(now)
	for {
		w := f.word.Load()
		cnt, ok := f.countIn(cur, w)
		if !ok {
			cur = f.latest.Load() // descheduled past a window edge: act in the newest
			continue
		}
		r := Result{
			Remaining: limit - min(cnt, limit),
			Reset:     max(0, time.Duration((cur+1)*f.spec.length)-now),
			Bucket:    cur,
		}
		if hits == 0 {
			r.Allowed = cnt < limit
			return r
		}
		if (cnt > limit || hits > limit-cnt) && always {
			total := min(cnt+min(hits, MaxLimit), MaxLimit)
			if f.word.CompareAndSwap(w, pack(cur, total)) {
				r.Recorded, r.Remaining = true, 0
				return r
			}
			continue
		}
		if cnt > limit || hits > limit-cnt {
			if hits > limit {
				r.Reset = f.spec.Length()
			}
			return r
		}
		if f.word.CompareAndSwap(w, pack(cur, cnt+hits)) {
			r.Allowed, r.Recorded = true, true
			r.Remaining = limit - cnt - hits
			return r
		}
	}
}

// advance moves the newest window number up to now's and returns the
// window to act in (the newest seen, if the clock stepped back). When the
// window moves it resets the word, unless a writer of the new window got
// there first.
func (f *FixedCounter) advance(now time.Duration) int64 {
	id := int64(max(now, 0)) / f.spec.length
	for {
		l := f.latest.Load()
		if id <= l {
			return l
		}
		if f.latest.CompareAndSwap(l, id) {
			for {
				w := f.word.Load()
				if tag(w) == uint32(id) || f.word.CompareAndSwap(w, pack(id, 0)) {
					return id
				}
			}
		}
	}
}

// countIn returns the count of window cur held in w, and false if cur is
// no longer the newest window.
func (f *FixedCounter) countIn(cur int64, w uint64) (uint64, bool) {
	if tag(w) == uint32(cur) {
		return uint64(count(w)), true
	}
	if f.latest.Load() > cur {
		return 0, false
	}
	return 0, true // the word still holds an older window: cur starts empty
}

// LastUsed returns the latest time passed to AllowAt.
func (f *FixedCounter) LastUsed() time.Duration { return time.Duration(f.seen.Load()) }

func (f *FixedCounter) undo(bucket int64, hits, _ uint64) {
	for {
		w := f.word.Load()
		if tag(w) != uint32(bucket) || f.latest.Load() != bucket || count(w) == 0 {
			return
		}
		if f.word.CompareAndSwap(w, w-min(uint64(count(w)), hits)) {
			return
		}
	}
}

func (f *FixedCounter) refund(now time.Duration, hits, limit uint64) Result {
	cur := f.advance(now)
	for {
		w := f.word.Load()
		cnt, ok := f.countIn(cur, w)
		if !ok {
			cur = f.latest.Load()
			continue
		}
		if cnt == 0 || f.word.CompareAndSwap(w, pack(cur, cnt-min(cnt, hits))) {
			break
		}
	}
	return f.AllowAt(now, 0, limit)
}

func (f *FixedCounter) idleAt(now time.Duration) bool {
	cur := f.advance(now)
	cnt, _ := f.countIn(cur, f.word.Load())
	return cnt == 0
}

func (f *FixedCounter) layout() (Spec, Algorithm) { return f.spec, FixedWindow }
func (f *FixedCounter) footprint() int64          { return sizeClass(int64(unsafe.Sizeof(*f))) }

// sizeClass is the size of the heap allocation Go makes for n bytes: its
// small-object size classes up to 32 KiB (approximated from above: the
// next multiple of 16 up to 256 bytes, of 128 up to 2 KiB, of 1 KiB up to
// 32 KiB), whole 8 KiB pages beyond.
func sizeClass(n int64) int64 {
	round := func(n, to int64) int64 { return (n + to - 1) / to * to }
	switch {
	case n <= 0:
		return 0
	case n <= 256:
		return round(n, 16)
	case n <= 2048:
		return round(n, 128)
	case n <= 32<<10:
		return round(n, 1024)
	}
	return round(n, 8192)
}
