package main

import (
	"math"
	"time"
)

// This file holds models: admission algorithms other projects run, written
// here from their documented behaviour (see /work/shared/reference) so the
// simulator can replay the same traces through them. They are not those
// projects' code.

// exactLog is the ideal limiter: it keeps every admitted hit's time and
// admits a request iff the hits in (now-W, now] plus its own fit the limit.
// It must show 0 overshoot and 0 false rejects (a self-check of the metrics).
type exactLog slidingLog

func (e *exactLog) allow(now time.Duration, hits, limit uint64) bool {
	l := (*slidingLog)(e)
	if l.count(now)+hits > limit {
		return false
	}
	l.add(now, hits)
	return true
}

func exactLogAlgorithm(p params) algorithm {
	return algorithm{
		name:        "model: exact sliding log",
		exact:       true,
		granularity: p.window / 2, // no buckets; the adversary aims mid-window
		newDecider: func() decider {
			return &exactLog{window: p.window}
		},
	}
}

// envoyFixedWindow models envoyproxy/ratelimit's Redis algorithm: one
// counter per epoch-aligned window (key suffix floor(now/unit)*unit), INCRBY
// on every call, refused hits included, and OVER_LIMIT iff the new count
// exceeds the limit. Virtual time 0 is the Unix epoch. The optional local
// over-limit cache is off by default upstream and not modelled.
type envoyFixedWindow struct {
	window time.Duration
	start  time.Duration // start of the window the count belongs to
	count  uint64
}

func (f *envoyFixedWindow) allow(now time.Duration, hits, limit uint64) bool {
	if start := now - now%f.window; start != f.start {
		f.start, f.count = start, 0 // a new Redis key
	}
	f.count += hits // INCRBY, whatever the answer
	return f.count <= limit
}

func envoyAlgorithm(p params) algorithm {
	return algorithm{
		name:        "model: envoyproxy/ratelimit fixed window",
		buckets:     1,
		granularity: p.window,
		newDecider: func() decider {
			return &envoyFixedWindow{window: p.window, start: -1}
		},
	}
}

// sentinelLeapArray models sentinel-golang's default flow check (Direct
// calculator, Reject behaviour): a LeapArray of sampleCount buckets over the
// interval (default 2 x 500 ms per second, the bucket scaled to W/2 for other
// windows). The check reads the pass count of the buckets whose start lies in
// [curStart - interval + bucketLen, curStart] (SlidingWindowMetric.GetSum),
// blocks iff count + batch > threshold, and otherwise adds the batch to the
// current bucket (stat slot, after the check). Only whole buckets count, so
// the effective window is between interval - bucketLen and interval long.
type sentinelLeapArray struct {
	interval, bucketLen time.Duration
	starts              []time.Duration
	passes              []uint64
}

func newSentinelLeapArray(interval time.Duration, sampleCount int) *sentinelLeapArray {
	s := &sentinelLeapArray{
		interval:  interval,
		bucketLen: interval / time.Duration(sampleCount),
		starts:    make([]time.Duration, sampleCount),
		passes:    make([]uint64, sampleCount),
	}
	for i := range s.starts {
		s.starts[i] = math.MinInt64 / 2 // never inside any read range
	}
	return s
}

func (s *sentinelLeapArray) allow(now time.Duration, hits, limit uint64) bool {
	curStart := now - now%s.bucketLen
	var sum uint64
	for i, start := range s.starts {
		if start >= curStart-s.interval+s.bucketLen && start <= curStart {
			sum += s.passes[i]
		}
	}
	if sum+hits > limit {
		return false // Block events are counted apart; the pass count is untouched
	}
	idx := int(now/s.bucketLen) % len(s.starts)
	if s.starts[idx] != curStart { // stale: reset in place for the new bucket
		s.starts[idx], s.passes[idx] = curStart, 0
	}
	s.passes[idx] += hits
	return true
}

func sentinelAlgorithm(p params) algorithm {
	const sampleCount = 2
	return algorithm{
		name:        "model: Sentinel LeapArray 2 buckets",
		buckets:     sampleCount,
		granularity: p.window / sampleCount,
		newDecider: func() decider {
			return newSentinelLeapArray(p.window, sampleCount)
		},
	}
}

// gcra models the generic cell rate algorithm as go-redis/redis_rate runs it
// (a token bucket kept as one theoretical arrival time): rate limit/W,
// burst limit. A request of n hits is admitted iff
// now >= max(tat, now) + n*T - burst*T, T = W/limit; then tat advances by
// n*T. It is here for comparison (the reference notes recommend it): it
// bounds hits by burst + rate x T in any interval T, not by limit per window.
type gcra struct {
	interval, burst time.Duration // T and burst*T
	tat             time.Duration
}

func (g *gcra) allow(now time.Duration, hits, _ uint64) bool {
	tat := max(g.tat, now)
	next := tat + time.Duration(hits)*g.interval
	if now < next-g.burst {
		return false
	}
	g.tat = next
	return true
}

func gcraAlgorithm(p params) algorithm {
	interval := p.window / time.Duration(p.limit)
	return algorithm{
		name:        "model: GCRA token bucket, burst = limit",
		granularity: p.window,
		newDecider: func() decider {
			return &gcra{interval: interval, burst: interval * time.Duration(p.limit)}
		},
	}
}
