package main

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/leapgate/leapgate/window"
)

// slidingWindow adapts one window.Counter (Leapgate's default sliding
// window, count-quantised checkpoints) to a decider, with no state of its
// own.
type slidingWindow window.Counter

func (s *slidingWindow) allow(now time.Duration, hits, limit uint64) bool {
	return (*window.Counter)(s).AllowAt(now, hits, limit).Allowed
}

// slidingWindowAlgorithm returns window.Counter. It has no time buckets:
// the boundary adversary aims at the end of the whole window (and the
// tests shift it to every tenth of a window).
func slidingWindowAlgorithm(p params) (algorithm, error) {
	spec, err := window.NewSpec(p.window, 1)
	if err != nil {
		return algorithm{}, err
	}
	return algorithm{
		name:        "Leapgate sliding_window (default)",
		ours:        true,
		noBurst:     true,
		granularity: p.window,
		newDecider: func() decider {
			return (*slidingWindow)(window.NewCounter(spec))
		},
	}, nil
}

// timeBuckets adapts one window.BucketCounter (Leapgate's time_buckets:
// check-and-add over every bucket overlapping (now-W, now]) to a decider.
type timeBuckets window.BucketCounter

func (s *timeBuckets) allow(now time.Duration, hits, limit uint64) bool {
	return (*window.BucketCounter)(s).AllowAt(now, hits, limit).Allowed
}

// timeBucketsAlgorithm returns window.BucketCounter with the given bucket
// count, or an error if the window length is not divisible into that many
// buckets.
func timeBucketsAlgorithm(p params, buckets int) (algorithm, error) {
	spec, err := window.NewSpec(p.window, buckets)
	if err != nil {
		return algorithm{}, err
	}
	return algorithm{
		name:        fmt.Sprintf("Leapgate time_buckets, %d buckets", buckets),
		ours:        true,
		noBurst:     true,
		buckets:     buckets,
		granularity: spec.BucketLength(),
		newDecider: func() decider {
			return (*timeBuckets)(window.NewBucketCounter(spec))
		},
	}, nil
}

// tokenBucket adapts window.GCRA (Leapgate's token bucket) to a decider.
type tokenBucket window.GCRA

func (t *tokenBucket) allow(now time.Duration, hits, limit uint64) bool {
	return (*window.GCRA)(t).AllowAt(now, hits, limit).Allowed
}

// fixedWindow adapts window.FixedCounter (Leapgate's fixed window) to a
// decider.
type fixedWindow window.FixedCounter

func (f *fixedWindow) allow(now time.Duration, hits, limit uint64) bool {
	return (*window.FixedCounter)(f).AllowAt(now, hits, limit).Allowed
}

// exactWindow adapts window.LogCounter (Leapgate's exact sliding log) to a
// decider.
type exactWindow window.LogCounter

func (l *exactWindow) allow(now time.Duration, hits, limit uint64) bool {
	return (*window.LogCounter)(l).AllowAt(now, hits, limit).Allowed
}

// otherWindowAlgorithms returns Leapgate's exact sliding log (which promises
// the no-burst bound, asserted like the sliding window's), token bucket and
// fixed window (which do not; they are measured, not asserted).
func otherWindowAlgorithms(p params) ([]algorithm, error) {
	spec, err := window.NewSpec(p.window, 1)
	if err != nil {
		return nil, err
	}
	return []algorithm{
		{
			name:        "Leapgate sliding_log (exact, window.LogCounter)",
			ours:        true,
			noBurst:     true,
			exact:       true,
			granularity: p.window / 2,
			newDecider:  func() decider { return (*exactWindow)(window.NewLogCounter(spec)) },
		},
		{
			name:        "Leapgate token_bucket (window.GCRA)",
			ours:        true,
			granularity: p.window,
			newDecider:  func() decider { return (*tokenBucket)(window.NewGCRA(spec)) },
		},
		{
			name:        "Leapgate fixed_window (window.FixedCounter)",
			ours:        true,
			buckets:     1,
			granularity: p.window,
			newDecider:  func() decider { return (*fixedWindow)(window.NewFixedCounter(spec)) },
		},
	}, nil
}

// fixedClock is a window.Clock that stands still: the Store is driven
// through DoAt with explicit times, so its clock is never read for them.
type fixedClock time.Duration

func (c fixedClock) Now() time.Duration { return time.Duration(c) }

// storeKey is a key shaped like a service counter key (rule and value), 24
// bytes long.
func storeKey(i int) string { return fmt.Sprintf("api/user_id=user-%07d", i) }

// measureStoreBytesPerKey fills a window.Store with keys active keys of the
// default sliding window (each given one admitted hit through DoAt) and
// returns the growth of the live heap per key: the Counter plus the Store's
// map entry.
func measureStoreBytesPerKey(p params, keys int) (float64, error) {
	spec, err := window.NewSpec(p.window, 1)
	if err != nil {
		return 0, err
	}
	now := origin * p.window
	reqs := make([]window.Request, 1)
	results := make([]window.Result, 1)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	store := window.NewStore(window.StoreOptions{Clock: fixedClock(now)})
	for i := range keys {
		reqs[0] = window.Request{Key: storeKey(i), Spec: spec, Limit: p.limit, Hits: 1}
		if err := store.DoAt(context.Background(), now, reqs, results); err != nil {
			return 0, err
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(store)
	return (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(keys), nil
}
