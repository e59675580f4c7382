package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// traceParams shapes the traces: how long they run and how many keys the
// many-keys trace spreads over.
type traceParams struct {
	// windows is the length of each open-loop trace in windows.
	windows int
	// keys is the number of keys of the Zipf trace.
	keys int
}

// origin is where every trace starts, in windows after virtual time 0 (the
// epoch of the fixed-window model): counters have run a while, and window
// and bucket edges of every algorithm fall on multiples of their lengths.
const origin = 100

// trace generates requests and feeds them, in time order, to decide. An
// adaptive trace (the boundary adversary) reads the answers; granularity is
// the bucket length of the algorithm under test.
type trace struct {
	name string
	// withinLimit marks a trace that offers at most the limit in every
	// window, on average: own-log false rejects are reported for these only
	// (under sustained overload every bounded-memory scheme scores high on
	// them while losing almost no capacity).
	withinLimit bool
	// adaptive marks a trace that reacts to the answers (the boundary
	// adversary): it tests overshoot, and its shortfall means nothing.
	adaptive bool
	run      func(p params, tp traceParams, granularity time.Duration, rng *rand.Rand, decide func(request) bool)
}

// traces returns the trace set, in table order.
func traces(tp traceParams) []trace {
	var ts []trace
	for _, r := range []float64{0.5, 1, 1.5, 3} {
		ts = append(ts, trace{name: fmt.Sprintf("steady %gx", r), withinLimit: r <= 1, run: steady(r)})
	}
	ts = append(ts, trace{name: "steady 1x, U(0, 100µs) jitter", withinLimit: true, run: jittered(1, 100*time.Microsecond)})
	for _, r := range []float64{0.7, 1.2, 1.5} {
		ts = append(ts, trace{name: fmt.Sprintf("Poisson %gx", r), withinLimit: r <= 1, run: poisson(r, 1, 1)})
	}
	ts = append(ts,
		trace{name: "cron: the limit within 1 ms, every window", withinLimit: true, run: cron},
		trace{name: "bursty: 1/4 W at 4x, every 1.1 W", withinLimit: true, run: quarterBursts},
		trace{name: "on/off: 0.3 W at 5x, every 1.3 W", run: onOff},
		trace{name: "mixed hits 1-5, Poisson 1.2x", run: poisson(1.2, 1, 5)},
		trace{name: fmt.Sprintf("%d keys Zipf, 10x total", tp.keys), run: zipfKeys},
		trace{name: "boundary burst", adaptive: true, run: boundaryBurst},
	)
	return ts
}

// spacing returns the gap between requests that offers rate x the limit,
// rounded up so that a rate of 1x never offers more than the limit.
func spacing(p params, rate float64) time.Duration {
	return time.Duration(math.Ceil(float64(p.window) / (rate * float64(p.limit))))
}

// steady offers one hit per request, evenly spaced at rate x the limit.
func steady(rate float64) func(params, traceParams, time.Duration, *rand.Rand, func(request) bool) {
	return func(p params, tp traceParams, _ time.Duration, _ *rand.Rand, decide func(request) bool) {
		gap := spacing(p, rate)
		start := origin * p.window
		end := start + time.Duration(tp.windows)*p.window
		for t := start + gap/2; t < end; t += gap {
			decide(request{at: t, hits: 1})
		}
	}
}

// jittered is steady with each request sent up to jitter late (uniform), as
// a client's timer and scheduler make it: the requests of a steady trace
// come exactly W apart to the nanosecond, so a request may meet the hit of
// one window before at the very instant it leaves.
func jittered(rate float64, jitter time.Duration) func(params, traceParams, time.Duration, *rand.Rand, func(request) bool) {
	return func(p params, tp traceParams, _ time.Duration, rng *rand.Rand, decide func(request) bool) {
		gap := spacing(p, rate)
		start := origin * p.window
		end := start + time.Duration(tp.windows)*p.window
		last := time.Duration(0)
		for t := start + gap/2; t < end; t += gap {
			at := max(t+time.Duration(rng.Int64N(int64(jitter))), last) // in time order
			decide(request{at: at, hits: 1})
			last = at
		}
	}
}

// poisson offers requests with exponential gaps so that the mean offered
// hits are rate x the limit; each request carries minHits..maxHits hits
// (uniform).
func poisson(rate float64, minHits, maxHits uint64) func(params, traceParams, time.Duration, *rand.Rand, func(request) bool) {
	return func(p params, tp traceParams, _ time.Duration, rng *rand.Rand, decide func(request) bool) {
		meanHits := float64(minHits+maxHits) / 2
		meanGap := float64(p.window) / (rate * float64(p.limit) / meanHits)
		start := origin * p.window
		end := start + time.Duration(tp.windows)*p.window
		for t := start + time.Duration(rng.ExpFloat64()*meanGap); t < end; t += time.Duration(rng.ExpFloat64() * meanGap) {
			hits := minHits + rng.Uint64N(maxHits-minHits+1)
			decide(request{at: t, hits: hits})
		}
	}
}

// boundaryBurst is the adversary of bucketed windows: the limit at the very
// end of the algorithm's first bucket (one step before its edge), then a
// one-hit probe every step until one passes, then the rest of a second limit
// at that instant. A step is W/1000 (1 ms for a 1 s window). Against an
// algorithm that forgets the first bucket before it leaves the real window,
// both bursts fall in one real window: 2x the limit.
func boundaryBurst(p params, _ traceParams, granularity time.Duration, _ *rand.Rand, decide func(request) bool) {
	step := max(p.window/1000, 1)
	t := origin*p.window + granularity - step
	for range p.limit {
		decide(request{at: t, hits: 1})
	}
	for deadline := t + 2*p.window; t < deadline; {
		t += step
		if decide(request{at: t, hits: 1}) {
			for range p.limit - 1 {
				decide(request{at: t, hits: 1})
			}
			return
		}
	}
}

// onOff offers bursts at 5x the limit's rate lasting 0.3 W, one every 1.3 W
// (so 1.5 limits per burst, never aligned with window or bucket edges).
func onOff(p params, tp traceParams, _ time.Duration, _ *rand.Rand, decide func(request) bool) {
	gap := spacing(p, 5)
	period, on := p.window*13/10, p.window*3/10
	start := origin * p.window
	end := start + time.Duration(tp.windows)*p.window
	for burst := start; burst < end; burst += period {
		for t := burst; t < burst+on && t < end; t += gap {
			decide(request{at: t, hits: 1})
		}
	}
}

// cron is a client that sends its whole limit in one go at the top of
// every window, as a cron job or a batch at the top of the minute does: the
// limit within 1 ms starting at k*W + 100µs + U(0, 2ms). An exact sliding
// log admits all of it whenever the previous batch started earlier; time
// buckets hold the previous batch a bucket longer and refuse most of it
// about every other window.
func cron(p params, tp traceParams, _ time.Duration, rng *rand.Rand, decide func(request) bool) {
	for k := range tp.windows {
		start := (origin+time.Duration(k))*p.window + 100*time.Microsecond + time.Duration(rng.Int64N(int64(2*time.Millisecond)))
		for i := range p.limit {
			decide(request{at: start + time.Duration(i)*time.Millisecond/time.Duration(p.limit), hits: 1})
		}
	}
}

// quarterBursts offers the limit as a burst lasting a quarter of a window
// (4x the limit's rate), one burst every 1.1 W: each burst's window still
// holds the end of the previous burst.
func quarterBursts(p params, tp traceParams, _ time.Duration, _ *rand.Rand, decide func(request) bool) {
	gap := spacing(p, 4)
	period, on := p.window*11/10, p.window/4
	start := origin * p.window
	end := start + time.Duration(tp.windows)*p.window
	for burst := start; burst < end; burst += period {
		for t := burst; t < burst+on && t < end; t += gap {
			decide(request{at: t, hits: 1})
		}
	}
}

// zipfKeys spreads Poisson arrivals offering 10x one key's limit over
// tp.keys keys with Zipf popularity (s = 1.1): the hottest key gets about
// 1.8x its limit, most keys a small share of theirs.
func zipfKeys(p params, tp traceParams, _ time.Duration, rng *rand.Rand, decide func(request) bool) {
	zipf := rand.NewZipf(rng, 1.1, 1, uint64(tp.keys-1))
	meanGap := float64(p.window) / (10 * float64(p.limit))
	start := origin * p.window
	end := start + time.Duration(tp.windows)*p.window
	for t := start + time.Duration(rng.ExpFloat64()*meanGap); t < end; t += time.Duration(rng.ExpFloat64() * meanGap) {
		decide(request{at: t, key: int(zipf.Uint64()), hits: 1})
	}
}
