// Package window implements the rate-limit counters: check-and-add of hits
// against a limit over a sliding window, one counter per key, in memory.
//
// Every time-dependent method takes the current time explicitly (the ...At
// style of golang.org/x/time/rate), as a Duration since the origin of a
// monotonic Clock, so behaviour at window edges is testable without sleeping.
//
// # The default: full capacity, zero overshoot
//
// The default algorithm, SlidingWindow, is served by Counter, a
// count-quantised checkpoint log in 256 bytes per key: admitted hits are
// grouped, in arrival order, into blocks of ceil(limit/Blocks), and each
// closed block keeps only the time of its newest hit. Its estimate of the
// hits in (now-W, now] is never below the real count (so in any window of
// length W at most limit hits are admitted: no boundary burst, under any
// concurrency) and less than one block above it (so it admits all but less
// than 1/Blocks of what an exact sliding log would, whatever the traffic
// shape, and exactly what the log admits for limits up to Blocks). See
// Counter for why, and cmd/accuracy for the measurements.
//
// Remaining is limit minus the counted hits. Reset is, for an allowed
// request, when everything counted will have aged out; for a refused one,
// the time at which enough hits will have left the window for the same
// request to pass (an honest Retry-After), or the full window length when
// no window can ever take it (hits greater than the limit, limit 0).
//
// # Other algorithms
//
// A Request may choose TokenBucket (GCRA, one timestamp per key: bursts of
// up to the limit, exact retry times), FixedWindow (envoyproxy/ratelimit's
// epoch-aligned windows, without counting refused hits), SlidingLog (the
// exact sliding window to the nanosecond, memory proportional to the limit,
// limits up to MaxLogLimit) or TimeBuckets (Sentinel's LeapArray with the
// oldest bucket counted in full: no boundary burst, but a hit counts for up
// to W+W/k, so it refuses part of what the limit allows; see BucketCounter)
// instead; see Algorithm.
//
// # Store
//
// Store is the in-memory Limiter: a sharded map from key to counter, with
// Sweep/Run reclaiming idle counters and StoreOptions.MaxKeys bounding the number of
// keys by approximate-LRU eviction; Stats reports evictions and reclaims.
package window

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// MaxLimit is the largest limit the counters enforce; larger limits are
// clamped to it. Counts are 32-bit fields that never exceed the limit, and
// Envoy's requests_per_unit is itself a uint32.
const MaxLimit = math.MaxUint32

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
	// ChargeAlways records Hits even when they do not fit: the window goes
	// into debt (it counts more than Limit), the request is still answered
	// as refused (Allowed false, Recorded true, Remaining 0), and every
	// later request is refused until enough of the window has aged out to
	// bring its count back under Limit. Its hits are never taken back by a
	// vetoed batch (see Limiter.Do), though its refusal vetoes the batch as
	// any refusal does. Only the algorithms ChargeAlwaysSupported names
	// serve it; the Limiters refuse it on the others. It is for charges
	// known only after the fact (tokens, bytes), which have been consumed
	// whether they fit or not.
	ChargeAlways bool
	// Holder names what holds the slots of a Concurrency request (such as
	// a request ID), so that its refund gives back its own slots and no
	// other's; "" is nobody (a refund then takes the oldest slots held by
	// nobody). Other algorithms ignore it. See LeaseCounter.
	Holder string
}

// ErrChargeAlways is returned (wrapped) for a Request with ChargeAlways set
// whose Algorithm does not serve it (see ChargeAlwaysSupported).
var ErrChargeAlways = errors.New("window: charge always is served only by " + strings.Join(chargeableNames(), " and "))

// ErrUnknownAlgorithm is returned (wrapped) for a Request whose Algorithm
// is not one of Algorithms.
var ErrUnknownAlgorithm = errors.New("window: unknown algorithm")

// chargeableNames returns the names of the algorithms that serve
// Request.ChargeAlways.
func chargeableNames() []string {
	var names []string
	for _, info := range algorithms {
		if info.ChargeAlways {
			names = append(names, info.Name)
		}
	}
	return names
}

// CheckRequest returns nil if every Limiter serves req, or why none does:
// a Spec not built by NewSpec (ErrInvalidSpec), an unknown Algorithm
// (ErrUnknownAlgorithm), a Limit above what the algorithm enforces
// (CheckLimit), or ChargeAlways on an algorithm that does not serve it
// (ErrChargeAlways). It ignores Key, Hits, Veto, Negative and Holder: no
// value of theirs makes a request an error. Every Limiter refuses a batch
// holding such a request before recording anything.
func CheckRequest(req *Request) error {
	switch {
	case !req.Spec.valid():
		return ErrInvalidSpec
	case !req.Algorithm.Valid():
		return fmt.Errorf("%w %v", ErrUnknownAlgorithm, req.Algorithm)
	case req.ChargeAlways && !ChargeAlwaysSupported(req.Algorithm):
		return fmt.Errorf("%v: %w", req.Algorithm, ErrChargeAlways)
	}
	if err := CheckLimit(req.Algorithm, req.Limit); err != nil {
		return fmt.Errorf("limit %d: %w", req.Limit, err)
	}
	return nil
}

// RequestChecker is implemented by a Limiter that refuses some requests
// CheckRequest accepts (a backend that works in coarser units, say).
// CheckRequest returns nil if and only if Do serves req rather than failing
// with an error, whatever req's Key, Hits, Veto, Negative and Holder; it
// never talks to a remote store. Package service checks every limit of a
// rule set with it when the rules load, so that a rule the backend cannot
// serve is refused with its file and line instead of turning each request
// it matches into an error (which Envoy lets through). A Limiter that does
// not implement it is taken to serve every request CheckRequest accepts.
type RequestChecker interface {
	CheckRequest(req *Request) error
}

// RequestCheckerFunc adapts a function to a RequestChecker.
type RequestCheckerFunc func(req *Request) error

// CheckRequest returns f(req).
func (f RequestCheckerFunc) CheckRequest(req *Request) error { return f(req) }

// CheckerOf returns l's RequestChecker, or CheckRequest for a Limiter that
// does not implement one.
func CheckerOf(l Limiter) RequestChecker {
	if c, ok := l.(RequestChecker); ok {
		return c
	}
	return RequestCheckerFunc(CheckRequest)
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

// Unrecord marks r, the answer to req, as not recorded and gives req's hits
// back to Remaining, at most the limit (clamped to MaxLimit): how an answer
// reads once its hits have been taken back (Limiter.Undo, a vetoed batch).
func (r *Result) Unrecord(req *Request) {
	r.Recorded = false
	r.Remaining = min(r.Remaining+req.Hits, min(req.Limit, MaxLimit))
}

// Limiter admits batches of requests. The in-memory Store implements it; a
// distributed backend implements the same contract.
type Limiter interface {
	// Do answers every request, results[i] for reqs[i]. It is all-or-nothing:
	// if any request with Veto set is refused, no request's hits are recorded
	// (except those of ChargeAlways requests, which are always recorded);
	// otherwise every allowed request's hits are recorded. Refused requests
	// never consume quota, unless they are ChargeAlways.
	Do(ctx context.Context, reqs []Request) ([]Result, error)
	// Undo takes back hits recorded by an earlier Do (pairs of reqs[i] and
	// results[i] with Recorded set), as if they had never been admitted.
	Undo(ctx context.Context, reqs []Request, results []Result) error
}
