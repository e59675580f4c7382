package main

import (
	"runtime"
	"time"
)

// cost is what one key of an algorithm costs.
type cost struct {
	// bytesPerKey is the live heap per active key, measured with
	// runtime.MemStats over many keys.
	bytesPerKey float64
	// nsPerDecision is the wall time of one decision in a timing loop on one
	// key: indicative only (go test -bench gives the real figures).
	nsPerDecision float64
}

// activeWorkload returns request times that keep one key at its limit:
// two limits' worth of one-hit requests evenly spread over one window.
func activeWorkload(p params, n int) []time.Duration {
	gap := spacing(p, 2)
	ts := make([]time.Duration, n)
	t := origin * p.window
	for i := range ts {
		ts[i] = t
		t += gap
	}
	return ts
}

// measureBytesPerKey builds keys deciders, drives each to its limit, and
// returns the growth of the live heap per key (runtime.MemStats.HeapAlloc
// after a GC, so allocator size classes and slice headroom are included).
func measureBytesPerKey(p params, alg algorithm, keys int) float64 {
	ts := activeWorkload(p, int(2*p.limit))
	ds := make([]decider, keys)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range ds {
		d := alg.newDecider()
		for _, t := range ts {
			d.allow(t, 1, p.limit)
		}
		ds[i] = d
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(ds)
	return (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(keys)
}

// measureNsPerDecision times n one-hit decisions on one key offered at 1.5x
// the limit (a mix of admissions and refusals) and returns the best of five
// runs, per decision (the best, because other load on a shared machine only
// ever adds time).
func measureNsPerDecision(p params, alg algorithm, n int) float64 {
	gap := spacing(p, 1.5)
	ts := make([]time.Duration, n)
	for i := range ts {
		ts[i] = origin*p.window + time.Duration(i)*gap
	}
	best := time.Duration(1<<63 - 1)
	for range 5 {
		d := alg.newDecider()
		start := time.Now()
		for _, t := range ts {
			d.allow(t, 1, p.limit)
		}
		best = min(best, time.Since(start))
	}
	return float64(best) / float64(n)
}
