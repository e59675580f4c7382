package window

import (
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// MaxLogLimit is the largest limit the SlidingLog algorithm enforces: its
// ring holds one 8-byte timestamp per hit in the window, so a key at
// MaxLogLimit costs about 80 KB. Store.Do refuses SlidingLog requests with a larger Limit (rule
// validation in package service rejects such rules first); LogCounter.AllowAt
// called directly clamps the limit to it.
const MaxLogLimit = 10_000

// LogCounter is the exact sliding window of one key (the SlidingLog
// algorithm): the timestamps (ns on the Clock, one entry per admitted hit,
// so a request of n hits occupies n entries) of the hits admitted in the
// trailing window, oldest first, in a ring whose capacity is the limit. A request of n hits is admitted iff
// hits in (now-W, now] + n <= limit, exactly: no boundary burst (0
// overshoot) and no false reject (a refusal always means the real window has
// no room). Refused hits are not recorded.
//
// Unlike the other algorithms it is a multi-word structure (ring, head,
// count), so it is the one meter with a lock: a small per-key mutex, held
// for a few tens of nanoseconds per call. It does not allocate once its
// ring is sized: the ring is allocated by the first AllowAt (capacity =
// limit) and re-sized only when the limit changes. A raised limit grows it
// at once; a lowered one applies at once and the ring shrinks to the new
// limit as soon as the hits in the window fit in it, so no counted hit is
// ever dropped (a limit lowered and raised again still sees them).
//
// Memory is 8 bytes per unit of limit plus a fixed header, whatever the
// traffic (BenchmarkBytesPerKey). The default Counter is the same exact log
// up to ExactLimit in a fixed size, so a LogCounter is only for larger limits
// that need nanosecond timestamps. A clock that steps back is treated as standing still (the
// newest time seen is used), so counts are never dropped and the log never
// fails open.
type LogCounter struct {
	spec Spec
	seen atomic.Int64 // newest time seen (ns), written under mu; read lock-free for LRU

	mu   sync.Mutex
	ring []int64 // timestamps of admitted hits; entries head .. head+n-1 (mod len) oldest first
	head int32   // int32: the header fits a 64-byte allocation (len(ring) <= MaxLogLimit)
	n    int32
	// grown is the change in footprint since the Store last took it
	// (takeGrowth): resizing the ring is the one way a counter's size
	// changes after it was created.
	grown atomic.Int64
}

// NewLogCounter returns an empty exact sliding log over spec.Length() (the
// Spec's bucket count is ignored). The Spec must come from NewSpec.
func NewLogCounter(spec Spec) *LogCounter {
	if !spec.valid() {
		panic("window: NewLogCounter with an invalid Spec (build it with NewSpec)")
	}
	return &LogCounter{spec: spec}
}

// AllowAt atomically admits hits more hits if the window ending at now
// holds at most limit-hits of them, and records one timestamp per hit; with
// hits == 0 it checks whether one more hit would fit and records nothing.
// Remaining is exact. Reset is, when allowed, the time until the newest
// counted hit leaves the window (0 when nothing is counted); when refused,
// the exact time at which enough old hits have left for the same request to
// pass, or the window length when no window can take it (hits > limit).
// Result.Bucket is the time (ns) the hits were recorded at, for undo.
func (l *LogCounter) AllowAt(now time.Duration, hits, limit uint64) Result {
	limit = min(limit, MaxLogLimit)
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.advance(now, limit)
	count := uint64(l.n)
	r := Result{Remaining: limit - min(count, limit), Bucket: t}
	need := max(hits, 1)
	if count > limit || need > limit-count {
		r.Reset = l.retryAfter(now, count, need, limit)
		return r
	}
	if hits == 0 {
		r.Allowed = true
		r.Reset = l.newestAgeOut(now)
		return r
	}
	for range hits {
		l.push(t)
	}
	r.Allowed, r.Recorded = true, true
	r.Remaining = limit - count - hits
	r.Reset = l.newestAgeOut(now)
	return r
}

// CountAt returns the number of hits in the window ending at now (the
// newest time seen, if now is older). It is a read: it neither moves the
// newest time seen nor drops entries.
func (l *LogCounter) CountAt(now time.Duration) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	edge := l.edge(now)
	i := 0
	for i < int(l.n) && l.at(i) <= edge {
		i++
	}
	return uint64(int(l.n) - i)
}

// LastUsed returns the newest time seen by AllowAt or RefundAt (reads such
// as CountAt and Store.Sweep do not count as use).
func (l *LogCounter) LastUsed() time.Duration { return time.Duration(l.seen.Load()) }

// UndoAt takes back up to hits entries recorded at time at (a Result.Bucket
// of an allowed AllowAt), as if they had never been admitted. Entries with
// the same timestamp are indistinguishable, so the take-back is exact; hits
// that already left the window are already forgotten.
func (l *LogCounter) UndoAt(at int64, hits uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// The entries stamped at lie in one run (the ring is sorted); find its
	// end, remove up to hits of it, and close the gap with the newer ones.
	end := int(l.n)
	for end > 0 && l.at(end-1) > at {
		end--
	}
	start := end
	for start > 0 && uint64(end-start) < hits && l.at(start-1) == at {
		start--
	}
	if start == end {
		return
	}
	removed := end - start
	for i := end; i < int(l.n); i++ {
		l.ring[l.index(i-removed)] = l.at(i)
	}
	l.n -= int32(removed)
}

// RefundAt takes back hits as of now, the newest first and never below
// zero: a refund of hits admitted earlier.
func (l *LogCounter) RefundAt(now time.Duration, hits uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire(l.clamp(now))
	l.n -= int32(min(hits, uint64(l.n)))
}

func (l *LogCounter) undo(bucket int64, hits, _ uint64) { l.UndoAt(bucket, hits) }

func (l *LogCounter) refund(now time.Duration, hits, limit uint64) Result {
	l.RefundAt(now, hits)
	return l.AllowAt(now, 0, limit)
}

func (l *LogCounter) idleAt(now time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n == 0 || l.at(int(l.n)-1) <= l.edge(now)
}

// edge is the start of the window ending at now (or at the newest time
// seen, if later): entries at or before it are outside. l.mu is held.
func (l *LogCounter) edge(now time.Duration) int64 {
	return max(int64(max(now, 0)), l.seen.Load()) - l.spec.length
}

func (l *LogCounter) layout() (Spec, Algorithm) { return l.spec, SlidingLog }

// footprint reads len(l.ring) without l.mu: the Store calls it with its
// shard locked for writing, when no call is inside the counter.
func (l *LogCounter) footprint() int64 {
	return sizeClass(int64(unsafe.Sizeof(*l))) + sizeClass(int64(len(l.ring))*8)
}

// takeGrowth returns the change in footprint since the last call, and
// forgets it.
func (l *LogCounter) takeGrowth() int64 { return l.grown.Swap(0) }

// advance clamps now to the newest time seen, drops the entries that left
// the window and sizes the ring for limit; it returns the time to act at.
// l.mu is held.
func (l *LogCounter) advance(now time.Duration, limit uint64) int64 {
	t := l.clamp(now)
	l.expire(t)
	if c := int(limit); c > len(l.ring) || (c < len(l.ring) && int(l.n) <= c) {
		l.resize(c)
	}
	return t
}

// clamp returns now as ns, never earlier than the newest time seen, and
// records it as seen. l.mu is held.
func (l *LogCounter) clamp(now time.Duration) int64 {
	t := int64(max(now, 0))
	if s := l.seen.Load(); t <= s {
		return s
	}
	l.seen.Store(t)
	return t
}

// expire drops the entries at or before t-W: they left the window (t-W, t].
func (l *LogCounter) expire(t int64) {
	edge := t - l.spec.length
	for l.n > 0 && l.ring[l.head] <= edge {
		l.head++
		if int(l.head) == len(l.ring) {
			l.head = 0
		}
		l.n--
	}
}

// resize gives the ring capacity c >= l.n, keeping every entry in order.
func (l *LogCounter) resize(c int) {
	l.grown.Add(sizeClass(int64(c)*8) - sizeClass(int64(len(l.ring))*8))
	ring := make([]int64, c)
	for i := range int(l.n) {
		ring[i] = l.at(i)
	}
	l.ring, l.head = ring, 0
}

// index is the ring position of the i-th oldest entry.
func (l *LogCounter) index(i int) int {
	j := int(l.head) + i
	if j >= len(l.ring) {
		j -= len(l.ring)
	}
	return j
}

// at returns the time of the i-th oldest entry.
func (l *LogCounter) at(i int) int64 { return l.ring[l.index(i)] }

// push appends an entry at t (the caller checked there is room).
func (l *LogCounter) push(t int64) {
	l.ring[l.index(int(l.n))] = t
	l.n++
}

// newestAgeOut is the time from now until the newest entry leaves the
// window: until every counted hit has aged out (0 when nothing is counted).
func (l *LogCounter) newestAgeOut(now time.Duration) time.Duration {
	if l.n == 0 {
		return 0
	}
	return max(0, time.Duration(l.at(int(l.n)-1)+l.spec.length)-now)
}

// retryAfter is the time from now until need more hits fit under limit:
// when the (count+need-limit)-th oldest entry leaves the window. When no
// window can take need hits (need > limit) it is the window length.
func (l *LogCounter) retryAfter(now time.Duration, count, need, limit uint64) time.Duration {
	if need > limit {
		return l.spec.Length()
	}
	k := int(count + need - limit) // entries that must leave; 1 <= k <= count
	return max(0, time.Duration(l.at(k-1)+l.spec.length)-now)
}
