// Package window implements sliding-window counters in the LeapArray style:
// a fixed ring of time buckets per key, reset in place by compare-and-swap,
// with a running sum so that an admission check does not walk the ring.
//
// Every time-dependent method takes the current time explicitly (the ...At
// style of golang.org/x/time/rate), as a Duration since the origin of a
// monotonic Clock, so behaviour at window edges is testable without sleeping.
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
