package window

import (
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Blocks is the number of closed blocks a Counter remembers. A limit of at
// most Blocks is counted hit by hit (blocks of one hit: the exact sliding
// log up to tick rounding, and exactly for limits up to ExactLimit); a
// larger limit groups hits into Blocks blocks per limit, of
// floor(limit/Blocks) or ceil(limit/Blocks) hits. It is what fits the
// Counter in 256 bytes.
const Blocks = 106

// ExactLimit is the largest limit a Counter keeps as an exact sliding log:
// up to it, the ring holds the full time of every admitted hit (8 bytes
// each, in the room of Blocks 16-bit ticks), so its decisions are those of
// an exact log to the nanosecond.
const ExactLimit = 2 * Blocks / 8

// TicksPerWindow is the most ticks one window spans (the Redis scripts are
// given it as CP_TICKS). A tick is the window
// divided by it, rounded up to a whole microsecond (so the Redis backend,
// whose clock is in microseconds, uses the same grid); 16-bit ticks then
// name every time within a little over a window of the newest one.
const TicksPerWindow = 64_000

// TickLength returns the timestamp resolution of a Counter over a window of
// length w: w/64000 rounded up to a whole microsecond (at least 1µs). A
// Counter rounds every hit's time up to it, so a hit may count for up to one
// tick longer than w (never shorter).
func TickLength(w time.Duration) time.Duration {
	us := (int64(w) + TicksPerWindow*int64(time.Microsecond) - 1) / (TicksPerWindow * int64(time.Microsecond))
	return time.Duration(max(us, 1)) * time.Microsecond
}

// Counter is the default sliding window of one key (the SlidingWindow
// algorithm): a count-quantised checkpoint log. Admitted hits, in arrival
// order, are grouped into blocks of about limit/Blocks hits; for each closed
// block only the time of its newest hit is kept (a FIFO ring of Blocks
// 16-bit ticks), plus the open block's count and newest time. The count of
// the window (now-W, now] is estimated as
//
//	the hits of the closed blocks newer than now-W + the open block's count
//
// and a request of h hits is admitted iff estimate + h <= limit.
//
// The block in ring slot p holds floor((p+1)q/Blocks) - floor(pq/Blocks)
// hits, q being the limit (at least Blocks) when the window was last empty:
// any Blocks consecutive blocks hold exactly q hits, the sizes differ by at
// most one, and the hits of any run of slots have a closed form, so the
// estimate and the retry time take constant time.
//
// Why it is exact enough:
//
//   - It never undercounts: every hit of a block is no newer than the
//     block's time (rounded up to a tick), so a block dropped at a time
//     <= now-W has nothing left in the window. Hence at most limit hits are
//     admitted in any window of length W, under any traffic: 0 overshoot.
//   - It overcounts by less than one block (plus the hits of one tick): the
//     blocks are FIFO, so only the oldest live block can be partly expired,
//     and it still holds its newest hit. So a request is refused only when
//     the real window holds more than limit-h-b hits (b = ceil(limit/Blocks)):
//     the capacity given up is under b hits, about 1/Blocks of the limit,
//     whatever the traffic shape (bursts, cron jobs, Poisson, adversaries).
//
// Times are ticks of TickLength(W), kept modulo 2^16 next to the full
// newest time seen; they are rounded up, which keeps the estimate
// conservative. A limit of at most ExactLimit keeps full times instead (8
// bytes each, in the same ring): the Counter is then the exact sliding log.
// A weighted request (hits > 1) may close several blocks at its own time. A
// limit that changes (a reload, an xDS update, the lowered limits of Redis's
// local failure mode) re-sizes the blocks at once: the hits counted are
// regrouped, oldest first, into blocks sized for the new limit, each
// stamped with the newest time of the hits it takes (see resize), so a
// raise takes effect within one window and a cut from the moment it
// applies. Refunds take from the open block, then reopen the newest closed
// blocks.
//
// A Counter is 256 bytes, safe for concurrent use (a small per-key mutex,
// held for a few tens of nanoseconds) and does not allocate. Every method
// takes the current time explicitly, as a Duration since the origin of a
// monotonic Clock; a time earlier than one already seen is treated as that
// newer time (a clock that steps back stands still), and a key idle for a
// window or longer starts afresh, however long it sat.
type Counter struct {
	mu     sync.Mutex
	window int64        // W, ns
	tick   int64        // TickLength(W), ns
	newest atomic.Int64 // newest time seen, ns; written under mu, read lock-free for LRU
	// quota is q, the limit the block sizes divide (at least Blocks), or,
	// below Blocks, the limit of an exact log (at most ExactLimit) whose
	// ring holds full times: see exact.
	quota uint32
	open  uint32 // hits in the open block
	// openTick is the tick of the open block's newest hit; meaningful when
	// open > 0.
	openTick uint16
	head     uint8 // ring index of the oldest closed block
	n        uint8 // closed blocks held
	// ring holds the closed blocks' times: Blocks little-endian 16-bit
	// ticks, or ExactLimit 64-bit times (ns) when exact.
	ring [2 * Blocks]byte
}

// NewCounter returns an empty Counter over spec.Length() (the Spec's bucket
// count is ignored). The Spec must come from NewSpec; NewCounter panics on
// the zero Spec.
func NewCounter(spec Spec) *Counter {
	if !spec.valid() {
		panic("window: NewCounter with an invalid Spec (build it with NewSpec)")
	}
	return &Counter{window: spec.length, tick: int64(TickLength(spec.Length())), quota: Blocks}
}

// AllowAt atomically checks whether hits more hits fit under limit in the
// window ending at now and, if they do, records them. Refused hits are not
// recorded (an over-limit answer consumes no quota). With hits == 0 it only
// checks whether one more hit would fit, and records nothing.
//
// Remaining is limit minus the estimate (after this request's hits, if
// recorded). Reset is, when allowed, the time until every hit now counted
// has aged out (0 when nothing is counted); when refused, the time at which
// enough blocks will have left the window for the same request to pass (an
// honest Retry-After), or the window length when no window can take it
// (hits > limit). Result.Bucket is the time (ns) the hits were recorded at,
// for UndoAt.
func (c *Counter) AllowAt(now time.Duration, hits, limit uint64) Result {
	return c.admit(now, hits, limit, false)
}

// ChargeAt is AllowAt for hits consumed whether they fit or not
// (Request.ChargeAlways). Hits that fit are recorded and answered as
// AllowAt does. Hits that do not are recorded all the same, at now: the
// window then counts more than limit (a debt), and the answer is refused
// with Recorded set, Remaining 0 and Reset the time until one more hit
// would fit, which is when enough of the window, debt included, has aged
// out. The count is capped at MaxLimit. With hits == 0 it is AllowAt's
// check.
func (c *Counter) ChargeAt(now time.Duration, hits, limit uint64) Result {
	return c.admit(now, hits, limit, true)
}

// admit is AllowAt, or ChargeAt when always is set.
func (c *Counter) admit(now time.Duration, hits, limit uint64, always bool) Result {
	limit = min(limit, MaxLimit)
	c.mu.Lock()
	t, anchor := c.advance(now)
	c.resize(quotaFor(limit), anchor)
	est := c.estimate()
	r := Result{Remaining: limit - min(est, limit), Bucket: t}
	need := max(hits, 1)
	switch {
	case always && hits > 0 && (est > limit || hits > limit-est):
		// Debt: every hit is counted, up to what the fields can hold.
		hits = min(hits, MaxLimit-min(est, MaxLimit))
		c.add(t, anchor, hits)
		r.Recorded, r.Remaining = true, 0
		r.Reset = c.retryAfter(now, anchor, c.estimate(), 1, limit)
	case est > limit || need > limit-est:
		r.Reset = c.retryAfter(now, anchor, est, need, limit)
	case hits == 0:
		r.Allowed = true
		r.Reset = c.newestAgeOut(now, anchor)
	default:
		c.add(t, anchor, hits)
		r.Allowed, r.Recorded = true, true
		r.Remaining = limit - est - hits
		r.Reset = c.newestAgeOut(now, anchor)
	}
	c.mu.Unlock()
	return r
}

// CountAt returns the estimated hits in the window ending at now (or at the
// newest time seen, if later): never fewer than the real ones, fewer than
// one block more. It is a read: it neither moves the newest time seen nor
// drops blocks.
func (c *Counter) CountAt(now time.Duration) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	newest := c.newest.Load()
	edge := max(int64(now), newest) - c.window
	if edge >= newest {
		return 0
	}
	anchor := c.absTick(newest)
	var est uint64
	for i := range int(c.n) {
		if c.stamp(c.index(i), anchor) > edge {
			est += c.size(int(c.head) + i)
		}
	}
	if c.open > 0 && c.lift(c.openTick, anchor)*c.tick > edge {
		est += uint64(c.open)
	}
	return est
}

// LastUsed returns the newest time seen by AllowAt or RefundAt.
func (c *Counter) LastUsed() time.Duration { return time.Duration(c.newest.Load()) }

// UndoAt takes back hits recorded at time at (a Result.Bucket of an allowed
// AllowAt) as if they had never been admitted: the newest hits counted are
// taken back, which leaves the same count with times no older than before.
// Hits that have left the window since are already forgotten.
func (c *Counter) UndoAt(at int64, hits uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	newest := c.newest.Load()
	if newest-at >= c.window {
		return
	}
	c.takeBack(hits, c.absTick(newest))
}

// RefundAt takes back hits as of now, the newest first and never below
// zero: a refund of hits admitted earlier.
func (c *Counter) RefundAt(now time.Duration, hits uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, anchor := c.advance(now)
	c.takeBack(hits, anchor)
}

func (c *Counter) undo(bucket int64, hits, _ uint64) { c.UndoAt(bucket, hits) }

func (c *Counter) refund(now time.Duration, hits, limit uint64) Result {
	c.RefundAt(now, hits)
	return c.AllowAt(now, 0, limit)
}

func (c *Counter) idleAt(now time.Duration) bool { return c.CountAt(now) == 0 }

func (c *Counter) layout() (Spec, Algorithm) {
	return Spec{length: c.window, buckets: 1}, SlidingWindow
}

func (c *Counter) footprint() int64 { return sizeClass(int64(unsafe.Sizeof(*c))) }

// quotaFor is the quota of an empty window under limit: the limit itself
// for an exact log, else the limit the block sizes divide.
func quotaFor(limit uint64) uint32 {
	if limit <= ExactLimit {
		return uint32(limit)
	}
	return uint32(max(limit, Blocks))
}

// resize sizes the blocks for quota q (quotaFor of the limit in force).
// An empty window takes q as it is. Otherwise the hits counted are
// regrouped, in arrival order, into the size cycle of q from slot 0: each
// new block is stamped with the time of the newest old block it takes hits
// from (old blocks are stamped in FIFO order, so that is the newest time of
// any of its hits), and what does not fill a block, or does not fit the
// ring, is the open block, at the time of the newest hit it holds. No hit
// is stamped earlier than it was, so the window still never undercounts,
// and the count is unchanged. It costs one pass over the ring, only when
// the limit changed. c.mu is held, after advance; anchor is the newest
// time's tick.
func (c *Counter) resize(q uint32, anchor int64) {
	if q == c.quota {
		return
	}
	if c.n == 0 && c.open == 0 {
		c.quota = q
		return
	}
	var sizes [Blocks + 1]uint64
	var stamps [Blocks + 1]int64 // ns
	k := int(c.n)
	for i := range k {
		sizes[i], stamps[i] = c.size(int(c.head)+i), c.stamp(c.index(i), anchor)
	}
	if c.open > 0 {
		sizes[k], stamps[k] = uint64(c.open), c.openTime(anchor)
		k++
	}
	c.quota, c.head, c.n, c.open = q, 0, 0, 0
	var pending uint64 // hits taken from old blocks, not yet in a new one
	var at int64       // the newest of their stamps
	for i := range k {
		pending, at = pending+sizes[i], stamps[i]
		for int(c.n) < c.slots() {
			b := c.size(int(c.n))
			if pending < b {
				break
			}
			c.setStamp(int(c.n), at, c.absTick(at))
			c.n++
			pending -= b
		}
	}
	c.open, c.openTick = uint32(pending), uint16(c.absTick(at))
}

// estimate is the count of the window after advance. c.mu is held.
func (c *Counter) estimate() uint64 {
	h := int(c.head)
	return c.filled(h+int(c.n)) - c.filled(h) + uint64(c.open)
}

// advance clamps now to the newest time seen, drops the blocks that left
// the window ending there, records it as the newest time and returns it,
// with its tick (the anchor every stored tick is lifted against from now
// on). c.mu is held.
func (c *Counter) advance(now time.Duration) (t, anchor int64) {
	t = int64(max(now, 0))
	prev := c.newest.Load()
	if t <= prev {
		t = prev
	}
	edge := t - c.window
	anchor = c.absTick(prev)
	if edge >= anchor*c.tick {
		// Every tick held is at most prev's, so every block has left: what
		// pruning would find, also for keys idle for longer than 16-bit
		// ticks can name.
		c.n, c.open = 0, 0
	} else {
		// Ticks are lifted against prev's: every block held survived the
		// previous advance, so it lies within a window and a tick of it.
		for c.n > 0 && c.stamp(int(c.head), anchor) <= edge {
			c.head = uint8(c.index(1))
			c.n--
		}
		if c.open > 0 && c.lift(c.openTick, anchor)*c.tick <= edge {
			c.open = 0
		}
	}
	if c.n == 0 && c.open == 0 {
		// An empty window starts the size cycle afresh, so the answers do
		// not depend on when the emptiness was noticed (the Redis backend,
		// which writes only when hits change, gives the same answers).
		c.head = 0
	}
	if t > prev {
		c.newest.Store(t)
		anchor = c.absTick(t)
	}
	return t, anchor
}

// add records hits at time t (the newest time seen, whose tick is tick): into
// the open block, closing full blocks while the ring has room. A block made
// only of hits the open block already held (left while the ring was full,
// by a debt or a raised limit) is stamped with the open block's own time,
// so they age out when they would have; any other is stamped at t. c.mu is
// held; the caller checked that the hits fit under the limit, or that the
// count stays within MaxLimit (a debt).
func (c *Counter) add(t, tick int64, hits uint64) {
	old := uint64(c.open)          // hits stamped at the open block's tick
	ot := c.lift(c.openTick, tick) // that tick, in full
	total := old + hits            // at most MaxLimit: fits in 32 bits
	for int(c.n) < c.slots() {
		b := c.size(int(c.head) + int(c.n))
		if total < b {
			break
		}
		if old >= b {
			c.setStamp(c.index(int(c.n)), ot*c.tick, ot)
			old -= b
		} else {
			c.setStamp(c.index(int(c.n)), t, tick)
			old = 0
		}
		c.n++
		total -= b
	}
	c.open, c.openTick = uint32(total), uint16(tick)
}

// takeBack removes hits, newest first: from the open block, then reopening
// closed blocks from the newest. c.mu is held; anchor is the newest time's
// tick.
func (c *Counter) takeBack(hits uint64, anchor int64) {
	take := min(uint64(c.open), hits)
	c.open -= uint32(take)
	hits -= take
	for hits > 0 && c.n > 0 {
		c.n--
		c.openTick = c.stampTick(c.index(int(c.n)))
		b := c.size(int(c.head) + int(c.n))
		take = min(b, hits)
		c.open = uint32(b - take)
		hits -= take
	}
}

// retryAfter is the time from now until need more hits fit under limit with
// estimate est: when the k-th oldest closed block leaves the window, k being
// the fewest oldest blocks that hold the excess, or, if the closed blocks
// alone do not free enough, when the open block does. When no window can
// take need hits (need > limit) it is the window length. c.mu is held,
// after advance.
func (c *Counter) retryAfter(now time.Duration, anchor int64, est, need, limit uint64) time.Duration {
	if need > limit {
		return time.Duration(c.window)
	}
	excess := est + need - limit // hits that must leave: 1 <= excess <= est
	// The fewest slots x past head with filled(x) - filled(head) >= excess:
	// x = ceil((excess + filled(head)) * Blocks / q).
	h := int(c.head)
	q := uint64(max(c.quota, Blocks))
	x := ((excess+c.filled(h))*Blocks + q - 1) / q
	if k := x - uint64(h); k <= uint64(c.n) {
		return c.ageOut(now, c.stamp(c.index(int(k)-1), anchor))
	}
	return c.ageOut(now, c.openTime(anchor))
}

// newestAgeOut is the time from now until every counted hit has left the
// window (0 when nothing is counted). c.mu is held, after advance.
func (c *Counter) newestAgeOut(now time.Duration, anchor int64) time.Duration {
	switch {
	case c.open > 0:
		return c.ageOut(now, c.openTime(anchor))
	case c.n > 0:
		return c.ageOut(now, c.stamp(c.index(int(c.n)-1), anchor))
	}
	return 0
}

// ageOut is the time from now until a block stamped at (ns) leaves the
// window.
func (c *Counter) ageOut(now time.Duration, at int64) time.Duration {
	return max(0, time.Duration(at+c.window)-now)
}

// openTime is the time (ns) the open block is stamped at: its tick, lifted
// against anchor, the newest time's tick.
func (c *Counter) openTime(anchor int64) int64 {
	return c.lift(c.openTick, anchor) * c.tick
}
