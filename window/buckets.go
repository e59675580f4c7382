package window

import (
	"sync/atomic"
	"time"
)

// BucketCounter is the sliding window of one key: a ring of time buckets with a
// running sum. It guarantees that in any window of length Spec.Length() at
// most limit hits are admitted (see the package documentation for why).
//
// Each of the ring's Buckets()+1 slots is one 64-bit word packing the
// bucket's epoch tag (high 32 bits) and its count (low 32 bits), so adding
// to a bucket and resetting it for a newer epoch are both a single
// compare-and-swap: a concurrent writer can never be wiped by a reset.
//
// A BucketCounter is safe for concurrent use; its methods take no lock and do not
// allocate. Every method takes the current time explicitly, as a Duration
// since the origin of a monotonic Clock; a time earlier than one already
// seen is treated as that newer time (a clock that steps back stands still).
//
// Epoch tags are truncated to 32 bits and compared in serial-number
// arithmetic; a counter idle for any length of time (even 2^32 buckets and
// more) drains correctly, because stale slots are judged against the last
// epoch seen. Only a caller descheduled for 2^31 bucket lengths between
// reading the clock and recording could misplace its own hits.
type BucketCounter struct {
	// The fields touched by every call fill one 64-byte cache line; the
	// ring is a second allocation.
	bucketLen int64         // ns
	buckets   int64         // k
	latest    atomic.Int64  // newest bucket epoch seen
	total     atomic.Uint64 // sum of all undrained bucket counts (may be transiently high)
	used      atomic.Int64  // latest time passed to AllowAt, for LRU eviction
	// slots is the ring: Buckets()+1 words, epoch tag << 32 | count.
	slots []atomic.Uint64
}

// NewBucketCounter returns an empty BucketCounter with the given layout. The Spec must
// come from NewSpec; NewBucketCounter panics on the zero Spec.
func NewBucketCounter(spec Spec) *BucketCounter {
	if !spec.valid() {
		panic("window: NewBucketCounter with an invalid Spec (build it with NewSpec)")
	}
	return &BucketCounter{
		bucketLen: spec.length / spec.buckets,
		buckets:   spec.buckets,
		slots:     make([]atomic.Uint64, spec.buckets+1),
	}
}

// ring returns the number of slots of the ring.
func (c *BucketCounter) ring() int64 { return int64(len(c.slots)) }

// Spec returns the counter's window layout.
func (c *BucketCounter) Spec() Spec { return Spec{length: c.bucketLen * c.buckets, buckets: c.buckets} }

// AllowAt atomically checks whether hits more hits fit under limit in the
// window ending at now and, if they do, records them. Refused hits are not
// recorded (an over-limit answer consumes no quota). With hits == 0 it only
// checks whether one more hit would fit, and records nothing.
//
// Result.Bucket names the bucket the hits went to, for UndoAt.
func (c *BucketCounter) AllowAt(now time.Duration, hits, limit uint64) Result {
	limit = min(limit, MaxLimit)
	e := c.advance(now)
	if now > 0 && int64(now) > c.used.Load() {
		c.used.Store(int64(now)) // racy max, fine for LRU
	}
	if hits == 0 {
		return c.check(now, e, limit)
	}
	var s uint64
	for {
		s = c.total.Load()
		if s > limit || hits > limit-s {
			return Result{
				Remaining: limit - min(s, limit),
				Reset:     c.retryAfter(now, e, s, hits, limit),
				Bucket:    e,
			}
		}
		if c.total.CompareAndSwap(s, s+hits) {
			break
		}
	}
	// Re-read latest after the admission so that the hit is never stamped
	// older than a drain it benefited from.
	bucket := max(e, c.latest.Load())
	c.record(bucket, hits)
	return Result{
		Allowed:   true,
		Recorded:  true,
		Remaining: limit - s - hits,
		Reset:     c.ageOut(now, bucket),
		Bucket:    bucket,
	}
}

// CountAt returns the number of hits counted in the window ending at now.
// The count includes the whole of the oldest bucket that overlaps the
// window, so it may exceed the hits of the exact window (never fall short).
func (c *BucketCounter) CountAt(now time.Duration) uint64 {
	c.advance(now)
	return c.total.Load()
}

// LastUsed returns the latest time passed to AllowAt (reads such as
// CountAt do not count as use).
func (c *BucketCounter) LastUsed() time.Duration {
	return time.Duration(c.used.Load())
}

// UndoAt takes back hits recorded in bucket (a Result.Bucket of an allowed
// AllowAt) as if they had never been admitted. Hits whose bucket has since
// left the window are already forgotten; nothing is taken back for them.
func (c *BucketCounter) UndoAt(bucket int64, hits uint64) {
	if hits == 0 || bucket < 0 {
		return
	}
	slot := &c.slots[bucket%c.ring()]
	for {
		w := slot.Load()
		cnt := count(w)
		if tag(w) != uint32(bucket) || cnt == 0 {
			return
		}
		sub := min(uint64(cnt), hits)
		if slot.CompareAndSwap(w, w-sub) {
			c.uncount(sub)
			return
		}
	}
}

// RefundAt subtracts hits from the counter as of now, taking them from the
// newest buckets first and never below zero: a refund of hits admitted
// earlier (for example a request that turned out not to count).
func (c *BucketCounter) RefundAt(now time.Duration, hits uint64) {
	e := c.advance(now)
	k := c.buckets
	for x := e; x >= e-k && x >= 0 && hits > 0; x-- {
		slot := &c.slots[x%c.ring()]
		for {
			w := slot.Load()
			cnt := count(w)
			if cnt == 0 || !notNewer(tag(w), e) {
				break
			}
			sub := min(uint64(cnt), hits)
			if slot.CompareAndSwap(w, w-sub) {
				c.uncount(sub)
				hits -= sub
				break
			}
		}
	}
}

// idleAt reports whether nothing is counted in the window ending at now.
func (c *BucketCounter) idleAt(now time.Duration) bool { return c.CountAt(now) == 0 }

// check answers a check-only request: would one more hit fit?
func (c *BucketCounter) check(now time.Duration, e int64, limit uint64) Result {
	s := c.total.Load()
	r := Result{Remaining: limit - min(s, limit), Bucket: e}
	if s < limit {
		r.Allowed = true
		r.Reset = c.newestAgeOut(now, e)
		return r
	}
	r.Reset = c.retryAfter(now, e, s, 1, limit)
	return r
}

// advance moves the counter's newest epoch up to now's and drains the
// buckets that left the window. It returns the epoch to act in: now's, or
// the newest already seen if the clock stepped back.
func (c *BucketCounter) advance(now time.Duration) int64 {
	e := int64(0)
	if now > 0 {
		e = int64(now) / c.bucketLen
	}
	for {
		l := c.latest.Load()
		if e <= l {
			return l
		}
		if c.latest.CompareAndSwap(l, e) {
			c.drain(l, e)
			return e
		}
	}
}

// drain empties the slots of the epochs that left the window when the
// newest epoch moved from prev to next: epochs prev-k .. next-k-1 (at most
// one ring turn). Each walked slot is retagged with the epoch x that just
// left, empty slots included, so that every slot's 32-bit tag stays within
// a couple of ring turns of latest and serial comparisons never alias.
func (c *BucketCounter) drain(prev, next int64) {
	k := c.buckets
	m := c.ring()
	hi := next - k - 1
	lo := max(prev-k, hi-m+1, 0)
	// After a jump past the whole ring, every slot filled before it is
	// stale; judged against prev its tag cannot alias, however long the
	// counter sat idle (even 2^32 buckets).
	wholeRing := next-prev > k
	for x := lo; x <= hi; x++ {
		slot := &c.slots[x%m]
		for {
			w := slot.Load()
			t, cnt := tag(w), count(w)
			if t == uint32(x) && cnt == 0 {
				break // already retagged
			}
			if !notNewer(t, hi) && !(wholeRing && notNewer(t, prev)) {
				break // holds a bucket still in the window
			}
			if slot.CompareAndSwap(w, pack(x, 0)) {
				if cnt > 0 {
					c.uncount(uint64(cnt))
				}
				break
			}
		}
	}
}

// uncount takes n hits, counted in total, back out of it: hits refunded,
// or that left the window with their bucket (adding the two's complement
// of n subtracts it; n == 0 changes nothing).
func (c *BucketCounter) uncount(n uint64) { c.total.Add(^(n - 1)) }

// record adds hits, already counted in total, to the slot of bucket.
func (c *BucketCounter) record(bucket int64, hits uint64) {
	k := c.buckets
	if bucket <= c.latest.Load()-k-1 {
		c.uncount(hits) // the bucket already left the window
		return
	}
	slot := &c.slots[bucket%c.ring()]
	for {
		w := slot.Load()
		switch d := int32(uint32(bucket) - tag(w)); {
		case d == 0:
			if slot.CompareAndSwap(w, w+hits) {
				return
			}
		case d > 0: // the slot holds an older epoch: reset it to ours
			if slot.CompareAndSwap(w, pack(bucket, hits)) {
				if cnt := count(w); cnt > 0 {
					c.uncount(uint64(cnt))
				}
				return
			}
		default: // the ring came round while we were descheduled
			c.uncount(hits)
			return
		}
	}
}

// ageOut is the time from now until bucket leaves the window.
func (c *BucketCounter) ageOut(now time.Duration, bucket int64) time.Duration {
	return max(0, time.Duration((bucket+c.buckets+1)*c.bucketLen)-now)
}

// newestAgeOut is the time until every hit now counted ages out: the
// age-out of the newest non-empty bucket, 0 when nothing is counted.
func (c *BucketCounter) newestAgeOut(now time.Duration, e int64) time.Duration {
	m := c.ring()
	for x := e; x >= e-c.buckets && x >= 0; x-- {
		if count(c.slots[x%m].Load()) > 0 {
			return c.ageOut(now, x)
		}
	}
	return 0
}

// retryAfter is the time until enough old hits age out that hits more fit
// under limit, given total s: the buckets are walked from the oldest and
// the first one whose departure frees enough quota names the time. When no
// window can ever take hits (hits > limit, e.g. limit 0) it is the full
// window length: retrying sooner is pointless.
func (c *BucketCounter) retryAfter(now time.Duration, e int64, s, hits, limit uint64) time.Duration {
	if hits > limit {
		return time.Duration(c.bucketLen * c.buckets)
	}
	m := c.ring()
	var freed uint64
	for x := max(e-c.buckets, 0); x <= e; x++ {
		freed += uint64(count(c.slots[x%m].Load()))
		if freed >= s || s-freed <= limit-hits {
			return c.ageOut(now, x)
		}
	}
	// Hits admitted but not yet in a slot: they age out with bucket e at
	// the latest.
	return c.ageOut(now, e)
}

func pack(epoch int64, n uint64) uint64 { return uint64(uint32(epoch))<<32 | n }
func tag(w uint64) uint32               { return uint32(w >> 32) }
func count(w uint64) uint32             { return uint32(w) }

// notNewer reports whether the epoch tag t is not newer than epoch e, in
// serial-number arithmetic on the 32-bit tags.
func notNewer(t uint32, e int64) bool { return int32(uint32(e)-t) >= 0 }
