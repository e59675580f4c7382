// Package window implements sliding-window counters in the LeapArray style:
// a fixed ring of time buckets per key, reset in place by compare-and-swap,
// with a running sum so that an admission check does not walk the ring.
//
// Every time-dependent method takes the current time explicitly (the ...At
// style of golang.org/x/time/rate), as a Duration since the origin of a
// monotonic Clock, so behaviour at window edges is testable without sleeping.
//
// # The guarantee: no boundary burst
//
// A window of length W is split into k buckets of length b = W/k (NewSpec
// refuses a W that k does not divide). Bucket epoch e = floor(now/b). The
// real window (now-W, now] overlaps buckets e-k .. e, so a Counter keeps a
// ring of k+1 slots and its admission check counts all of them, the oldest
// (only partly inside the window) in full. This is conservative and gives
// an exact bound: in any window of length W at most limit hits are
// admitted, whatever the bucket count. (Proof: the last admitted hit of any
// real window saw every earlier hit of that window in its sum, since those
// lie in buckets it still counted.) A plain LeapArray, which counts only
// the whole buckets, admits up to 2x the limit in one real window: a burst
// at the end of its oldest bucket and another right after that bucket
// expires.
//
// The price is that a hit keeps counting for between W and W+b, so under
// sustained overload a key gets somewhat less than its limit. Measured by
// BenchmarkShortfall (Poisson traffic at 1.5x the limit, against an exact
// sliding log over the same arrivals; shortfall = capacity lost as a share
// of requests):
//
//	buckets  shortfall  quota used  bytes per key (BenchmarkBytesPerKey)
//	      1         32.0 %      50.9 %     152
//	     10          5.0 %      92.3 %     232
//	     20          2.4 %      96.4 %     312
//	     60          0.70 %     98.9 %     648
//
// DefaultBuckets is 20: about 2 % of requests lost at 1.5x overload for about
// 300 bytes per active key (map entry and a 24-byte key included); each
// further bucket costs 8 bytes per key. 20 also divides every whole-second
// window (60 does not divide one second).
//
// # Counting without locks
//
// Each slot is one 64-bit word packing the bucket's epoch (high 32 bits) and
// its count (low 32 bits): adding to a bucket and resetting it for a newer
// epoch are each one compare-and-swap on that word, so a writer is never
// wiped by a concurrent reset. A running total of all undrained counts is
// admitted against by compare-and-swap (check-and-add is atomic: at most
// limit hits are admitted on a key under any concurrency, and refused hits
// are never counted). When the newest epoch moves, the slots that left the
// window are drained from the total, each count exactly once. A clock that
// steps back is treated as standing still: counts are neither dropped nor
// ignored.
//
// Remaining is limit minus the counted hits. Reset is, for an allowed
// request, when everything counted will have aged out; for a refused one,
// the exact time at which enough buckets will have left the window for the
// same request to pass (an honest Retry-After), or the full window length
// when no window can ever take it (hits greater than the limit, limit 0).
//
// # Other algorithms
//
// A Request may choose TokenBucket (GCRA, one timestamp per key: bursts of
// up to the limit, exact retry times), FixedWindow (envoyproxy/ratelimit's
// epoch-aligned windows, without counting refused hits) or SlidingLog (the
// exact sliding window: one timestamp per admitted hit, no overshoot and no
// false rejects, memory proportional to the limit, limits up to
// MaxLogLimit) instead of the default SlidingWindow; see Algorithm. The
// bucketed default trades a few per cent of the quota (a hit counts for up
// to W+W/k) for a size independent of the limit; SlidingLog is exact and
// fits in the same memory up to a limit of about 12 (BenchmarkBytesPerKey).
//
// # Store
//
// Store is the in-memory Limiter: a sharded map from key to counter, with
// Sweep/Run reclaiming idle counters and WithMaxKeys bounding the number of
// keys by approximate-LRU eviction; Stats reports evictions and reclaims.
package window

import (
	"context"
	"time"
)

// Clock reads a monotonic time as the Duration elapsed since its origin.
// It never steps backwards for the process's own clock; windows nevertheless
// tolerate a Clock that does (they clamp to the newest bucket they have seen).
type Clock interface {
	Now() time.Duration
}

// MonotonicClock is a Clock backed by Go's monotonic clock reading.
type MonotonicClock struct{ origin time.Time }

// NewMonotonicClock returns a Clock whose origin is the moment of the call.
func NewMonotonicClock() *MonotonicClock { return &MonotonicClock{origin: time.Now()} }

// Now returns the monotonic time elapsed since the clock's origin.
func (c *MonotonicClock) Now() time.Duration { return time.Since(c.origin) }

// Request is one check-and-add against one counter, identified by Key.
type Request struct {
	// Key identifies the counter: one per rule and, for value-less or
	// wildcard rules, per distinct request value. Keys of different Specs
	// must differ.
	Key string
	// Spec is the window length and bucket layout of the counter.
	Spec Spec
	// Limit is the number of hits allowed in any window of length Spec.Length().
	Limit uint64
	// Hits is the number of hits to add; 0 checks without counting.
	Hits uint64
	// Veto marks a request whose refusal makes the whole batch record nothing
	// (see Limiter.Do). Shadow-mode and quota-mode rules leave it false.
	Veto bool
	// Algorithm selects how the counter admits hits; the zero value is
	// SlidingWindow. A key is bound to its Spec and Algorithm.
	Algorithm Algorithm
	// Negative makes the request a refund: Hits are taken back from the
	// counter (the newest first, never below zero) instead of added. A
	// refund is never refused; it applies only if the batch is not vetoed.
	Negative bool
}

// Result is the answer to one Request.
type Result struct {
	// Allowed reports whether the hits fit in the window (for a check-only
	// request: whether one more hit would fit).
	Allowed bool
	// Recorded reports whether the hits were added to the counter.
	Recorded bool
	// Remaining is the quota left now, after this request's hits if recorded.
	Remaining uint64
	// Reset is, when Allowed, the time until every hit now counted has aged
	// out (0 when nothing is counted); when refused, the time until enough
	// old hits age out that this request would pass (an honest Retry-After).
	Reset time.Duration
	// Bucket identifies the bucket the hits were recorded in, for Undo.
	Bucket int64
}

// AlgorithmChecker is implemented by a Limiter that can say which
// algorithms it serves. A distributed backend whose scripts do not have
// every Algorithm must implement it, so that rules asking for the others are
// rejected when they are loaded (package service checks it) rather than
// served by another algorithm; a Limiter that does not implement it is
// taken to serve every Algorithm.
type AlgorithmChecker interface {
	// SupportsAlgorithm reports whether the Limiter serves a.
	SupportsAlgorithm(a Algorithm) bool
}

// Limiter admits batches of requests. The in-memory Store implements it; a
// distributed backend implements the same contract.
type Limiter interface {
	// Do answers every request, results[i] for reqs[i]. It is all-or-nothing:
	// if any request with Veto set is refused, no request's hits are recorded;
	// otherwise every allowed request's hits are recorded. Refused requests
	// never consume quota.
	Do(ctx context.Context, reqs []Request) ([]Result, error)
	// Undo takes back hits recorded by an earlier Do (pairs of reqs[i] and
	// results[i] with Recorded set), as if they had never been admitted.
	Undo(ctx context.Context, reqs []Request, results []Result) error
}
