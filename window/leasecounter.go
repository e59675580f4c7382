package window

import (
	"crypto/sha256"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// HolderID is the identity a Concurrency counter keeps for a
// Request.Holder: the first 48 bits of its SHA-256, never 0 (0 is no
// holder). It is the same in every process (replicas sharing Redis agree
// on it) and fits a float64 exactly. Two holders sharing an ID (about one
// pair in 2^48) share one entry: their slots are still each counted, and
// only their lease times merge.
func HolderID(holder string) uint64 {
	if holder == "" {
		return 0
	}
	sum := sha256.Sum256([]byte(holder))
	id := binary.BigEndian.Uint64(sum[:8]) >> 16
	return max(id, 1)
}

// LeaseCounter limits the requests in flight for one key (the Concurrency
// algorithm): each admitted request holds slots (its hits) until it gives
// them back (a refund: Request.Negative) or until its lease, the Spec's
// length, ends, so a refund that never comes (a crashed proxy) frees its
// slots when the lease ends instead of leaking them. There is no other
// time decay. A request of n slots is admitted iff slots held + n <= limit.
//
// A slot is held by a holder (HolderID of Request.Holder, e.g. the request
// ID) or by nobody (holder 0). A refund names its holder and takes back
// that holder's slots only: a refund for slots whose lease already ended,
// or that were never admitted, frees nothing, so a late refund cannot free
// another request's slot. A refund without a holder takes back the oldest
// slots held by nobody. A holder admitted again holds more slots (each
// admission consumes its own), all leased from the newest admission.
//
// Entries (holder, start, slots) are kept in order of start, at most one
// per holder (and one per instant for slots held by nobody): memory is 24
// bytes per entry, at most the limit, capped at MaxLogLimit. It is safe for
// concurrent use (a per-key mutex); a clock that steps back stands still.
type LeaseCounter struct {
	spec Spec
	seen atomic.Int64 // newest time seen (ns), written under mu; read lock-free for LRU

	mu        sync.Mutex
	leases    []lease // in order of start (and so of end)
	held      uint64  // slots held by live leases
	grown     atomic.Int64
	accounted int // cap(leases) as last added to grown
}

// lease is one holder's slots, leased from start for a window length.
type lease struct {
	holder uint64
	start  int64 // ns
	n      uint64
}

// NewLeaseCounter returns an empty LeaseCounter whose leases last
// spec.Length(). The Spec must come from NewSpec.
func NewLeaseCounter(spec Spec) *LeaseCounter {
	if !spec.valid() {
		panic("window: NewLeaseCounter with an invalid Spec (build it with NewSpec)")
	}
	return &LeaseCounter{spec: spec}
}

// AcquireAt admits hits more slots for holder if the slots held at now
// leave room for them under limit (clamped to MaxLogLimit), and records
// them, leased from now; with hits == 0 it checks whether one more slot is
// free and records nothing. Remaining is exact. Reset is, when allowed, the
// time until every lease held ends (0 when none is); when refused, the time
// until enough leases end for the same request to pass if no slot is given
// back sooner, or the lease length when no request can take hits slots
// (hits > limit). Result.Bucket is the time (ns) the slots were leased at.
func (c *LeaseCounter) AcquireAt(now time.Duration, holder, hits, limit uint64) Result {
	limit = min(limit, MaxLogLimit)
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.advance(now)
	r := Result{Remaining: limit - min(c.held, limit), Bucket: t}
	need := max(hits, 1)
	switch {
	case c.held > limit || need > limit-c.held:
		r.Reset = c.retryAfter(now, need, limit)
	case hits == 0:
		r.Allowed = true
		r.Reset = c.lastEnd(now)
	default:
		c.add(holder, t, hits)
		r.Allowed, r.Recorded = true, true
		r.Remaining = limit - c.held
		r.Reset = c.lastEnd(now)
	}
	return r
}

// ReleaseAt gives back up to hits slots of holder as of now: those of its
// live lease (nothing if its lease ended or it holds none), or, for holder
// 0, the oldest slots held by nobody.
func (c *LeaseCounter) ReleaseAt(now time.Duration, holder, hits uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advance(now)
	if holder != 0 {
		for i := range c.leases {
			if c.leases[i].holder == holder {
				c.take(i, hits)
				return
			}
		}
		return
	}
	for i := 0; i < len(c.leases) && hits > 0; {
		if c.leases[i].holder != 0 {
			i++
			continue
		}
		took := min(hits, c.leases[i].n)
		hits -= took
		if !c.take(i, took) {
			i++
		}
	}
}

// undoAt takes back hits slots recorded by AcquireAt at time at (its
// Result.Bucket) for holder: of holder's lease, or, for holder 0, of the
// lease held by nobody that started at at.
func (c *LeaseCounter) undoAt(at int64, holder, hits uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.leases {
		if l := &c.leases[i]; l.holder == holder && (holder != 0 || l.start == at) {
			c.take(i, hits)
			return
		}
	}
}

// CountAt returns the slots held at now (or at the newest time seen, if
// later). It is a read: it drops no lease.
func (c *LeaseCounter) CountAt(now time.Duration) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	edge := max(int64(max(now, 0)), c.seen.Load()) - c.spec.length
	var n uint64
	for _, l := range c.leases {
		if l.start > edge {
			n += l.n
		}
	}
	return n
}

// LastUsed returns the newest time seen.
func (c *LeaseCounter) LastUsed() time.Duration { return time.Duration(c.seen.Load()) }

// AllowAt is AcquireAt for slots held by nobody.
func (c *LeaseCounter) AllowAt(now time.Duration, hits, limit uint64) Result {
	return c.AcquireAt(now, 0, hits, limit)
}

func (c *LeaseCounter) undo(bucket int64, hits, _ uint64) { c.undoAt(bucket, 0, hits) }

func (c *LeaseCounter) refund(now time.Duration, hits, limit uint64) Result {
	c.ReleaseAt(now, 0, hits)
	return c.AcquireAt(now, 0, 0, limit)
}

func (c *LeaseCounter) idleAt(now time.Duration) bool { return c.CountAt(now) == 0 }

func (c *LeaseCounter) layout() (Spec, Algorithm) { return c.spec, Concurrency }

// footprint reads cap(c.leases) without c.mu: the Store calls it with its
// shard locked for writing, when no call is inside the counter.
func (c *LeaseCounter) footprint() int64 {
	return sizeClass(int64(unsafe.Sizeof(*c))) + sizeClass(int64(cap(c.leases))*int64(unsafe.Sizeof(lease{})))
}

// takeGrowth returns the change in footprint since the last call, and
// forgets it.
func (c *LeaseCounter) takeGrowth() int64 { return c.grown.Swap(0) }

// advance clamps now to the newest time seen, records it and drops the
// leases that ended by then; it returns the time to act at. c.mu is held.
func (c *LeaseCounter) advance(now time.Duration) int64 {
	t := int64(max(now, 0))
	if s := c.seen.Load(); t <= s {
		t = s
	} else {
		c.seen.Store(t)
	}
	edge := t - c.spec.length
	ended := 0
	for ended < len(c.leases) && c.leases[ended].start <= edge {
		c.held -= c.leases[ended].n
		ended++
	}
	if ended > 0 {
		c.leases = append(c.leases[:0], c.leases[ended:]...)
		c.resized()
	}
	return t
}

// add records hits slots for holder leased from t, the newest time: a
// holder's existing lease is moved to t with its slots added; slots held by
// nobody join a lease held by nobody that started at t. c.mu is held.
func (c *LeaseCounter) add(holder uint64, t int64, hits uint64) {
	c.held += hits
	if n := len(c.leases); holder == 0 && n > 0 && c.leases[n-1].holder == 0 && c.leases[n-1].start == t {
		c.leases[n-1].n += hits
		return
	}
	if holder != 0 {
		for i := range c.leases {
			if c.leases[i].holder == holder {
				hits += c.leases[i].n
				c.leases = append(c.leases[:i], c.leases[i+1:]...)
				break
			}
		}
	}
	c.leases = append(c.leases, lease{holder: holder, start: t, n: hits})
	c.resized()
}

// take removes up to hits slots of lease i, and the lease once it holds
// none; it reports whether the lease was removed. c.mu is held.
func (c *LeaseCounter) take(i int, hits uint64) bool {
	l := &c.leases[i]
	took := min(hits, l.n)
	l.n -= took
	c.held -= took
	if l.n > 0 {
		return false
	}
	c.leases = append(c.leases[:i], c.leases[i+1:]...)
	c.resized()
	return true
}

// resized gives back the room of a slice of more than 16 leases' capacity
// that holds under a quarter of it (its capacity is halved), and accounts
// for any change of capacity. c.mu is held.
func (c *LeaseCounter) resized() {
	if cp := cap(c.leases); cp > 16 && len(c.leases) < cp/4 {
		c.leases = append(make([]lease, 0, cp/2), c.leases...)
	}
	if cp := cap(c.leases); cp != c.accounted {
		size := int64(unsafe.Sizeof(lease{}))
		c.grown.Add(sizeClass(int64(cp)*size) - sizeClass(int64(c.accounted)*size))
		c.accounted = cp
	}
}

// lastEnd is the time from now until every lease held has ended. c.mu is
// held, after advance.
func (c *LeaseCounter) lastEnd(now time.Duration) time.Duration {
	if len(c.leases) == 0 {
		return 0
	}
	return max(0, time.Duration(c.leases[len(c.leases)-1].start+c.spec.length)-now)
}

// retryAfter is the time from now until enough leases end for need more
// slots to fit under limit, or the lease length when need > limit. c.mu is
// held, after advance.
func (c *LeaseCounter) retryAfter(now time.Duration, need, limit uint64) time.Duration {
	if need > limit {
		return c.spec.Length()
	}
	held := c.held
	for _, l := range c.leases {
		held -= l.n
		if held+need <= limit {
			return max(0, time.Duration(l.start+c.spec.length)-now)
		}
	}
	return c.lastEnd(now)
}
