package main

import (
	"math/rand/v2"
	"time"
)

// request is one rate-limit call in a trace: at virtual time at, the counter
// of key asks for hits hits.
type request struct {
	at   time.Duration
	key  int
	hits uint64
}

// decider is one key's admission state for one algorithm: allow answers
// whether hits more may pass at now under limit, and records whatever the
// algorithm records. Calls come in non-decreasing time order. The limit is
// passed in (as window.Counter takes it) so that the state measured for
// bytes per key is the algorithm's own.
type decider interface {
	allow(now time.Duration, hits, limit uint64) bool
}

// params is the limit every key of a simulation has: at most limit hits in
// any window of length window.
type params struct {
	limit  uint64
	window time.Duration
}

// algorithm is an admission algorithm under test.
type algorithm struct {
	// name is what the tables print.
	name string
	// ours marks Leapgate's own window package (as opposed to a model
	// written in this simulator).
	ours bool
	// noBurst marks an algorithm that promises at most limit hits in any
	// window of length W (Leapgate's sliding window): any overshoot fails
	// the command and the tests.
	noBurst bool
	// exact marks an exact sliding log (the model, or window.LogCounter),
	// which must come out ideal: 0 overshoot, 0 false rejects, and the same
	// decisions as the ideal.
	exact bool
	// buckets is the bucket count per window (0: not bucketed).
	buckets int
	// granularity is the length of the algorithm's time buckets; the
	// boundary-burst adversary aims at the end of the first one.
	granularity time.Duration
	// newDecider returns the state of one fresh key.
	newDecider func() decider
}

// slidingLog is the exact record of the hits admitted on one key, with the
// sum of those inside the trailing window (now-window, now]. It is both the
// ground truth the metrics use and the ideal limiter (exactLog).
type slidingLog struct {
	window time.Duration
	at     []time.Duration
	hits   []uint64
	head   int // entries before head have left the window
	sum    uint64
}

// count returns the hits recorded in (now-window, now]. now must not
// decrease between calls.
func (l *slidingLog) count(now time.Duration) uint64 {
	for l.head < len(l.at) && l.at[l.head] <= now-l.window {
		l.sum -= l.hits[l.head]
		l.head++
	}
	if l.head > 64 && l.head*2 > len(l.at) { // compact: keep memory O(entries in window)
		n := copy(l.at, l.at[l.head:])
		copy(l.hits, l.hits[l.head:])
		l.at, l.hits, l.head = l.at[:n], l.hits[:n], 0
	}
	return l.sum
}

// add records hits admitted at now (after a count at the same now).
func (l *slidingLog) add(now time.Duration, hits uint64) {
	l.at = append(l.at, now)
	l.hits = append(l.hits, hits)
	l.sum += hits
}

// event is one decision taken during a run.
type event struct {
	request
	allowed bool
}

// outcome holds the figures of one algorithm on one trace.
type outcome struct {
	requests    int
	offeredHits uint64
	// admittedHits is what the algorithm let through; idealHits what an
	// exact sliding log lets through on the same requests.
	admittedHits, idealHits uint64
	// maxInWindow is the most admitted hits in any real window (t-W, t] of
	// any key.
	maxInWindow uint64
	// falseRejects counts refused requests for which the log of the hits this
	// algorithm admitted on that key showed room: count(t-W, t] + hits <= limit.
	falseRejects int
	// refusedIdealAdmits counts requests this algorithm refused that an exact
	// sliding log, fed the same request sequence, admits.
	refusedIdealAdmits int
}

// overshoot returns the most admitted hits in any real window over the
// limit, floored at 0.
func (o outcome) overshoot(limit uint64) uint64 {
	if o.maxInWindow <= limit {
		return 0
	}
	return o.maxInWindow - limit
}

// vsIdealHits returns the admitted hits relative to the ideal's on the same
// requests: negative when the algorithm let through less, positive more.
func (o outcome) vsIdealHits() float64 {
	if o.idealHits == 0 {
		return 0
	}
	return (float64(o.admittedHits) - float64(o.idealHits)) / float64(o.idealHits)
}

// simulate runs one trace through one algorithm with fresh per-key state and
// returns every decision in order. The trace may react to the answers (the
// boundary-burst adversary does); open-loop traces ignore them.
// The trace's random stream is seeded by seed and stream, so every
// algorithm sees the same open-loop requests.
func simulate(p params, tp traceParams, alg algorithm, tr trace, seed, stream uint64) []event {
	deciders := make(map[int]decider)
	var events []event
	decide := func(r request) bool {
		d, ok := deciders[r.key]
		if !ok {
			d = alg.newDecider()
			deciders[r.key] = d
		}
		allowed := d.allow(r.at, r.hits, p.limit)
		events = append(events, event{request: r, allowed: allowed})
		return allowed
	}
	tr.run(p, tp, alg.granularity, rand.New(rand.NewPCG(seed, stream)), decide)
	return events
}

// measure computes the figures of a run against the exact sliding log.
func measure(p params, events []event) outcome {
	var o outcome
	admitted := make(map[int]*slidingLog) // what the algorithm admitted, per key
	ideal := make(map[int]*slidingLog)    // an exact limiter fed the same requests
	logOf := func(m map[int]*slidingLog, key int) *slidingLog {
		l, ok := m[key]
		if !ok {
			l = &slidingLog{window: p.window}
			m[key] = l
		}
		return l
	}
	for _, e := range events {
		o.requests++
		o.offeredHits += e.hits

		own := logOf(admitted, e.key)
		inWindow := own.count(e.at)
		if e.allowed {
			own.add(e.at, e.hits)
			o.admittedHits += e.hits
			o.maxInWindow = max(o.maxInWindow, inWindow+e.hits)
		} else if inWindow+e.hits <= p.limit {
			o.falseRejects++
		}

		exact := logOf(ideal, e.key)
		idealAllows := exact.count(e.at)+e.hits <= p.limit
		if idealAllows {
			exact.add(e.at, e.hits)
			o.idealHits += e.hits
			if !e.allowed {
				o.refusedIdealAdmits++
			}
		}
	}
	return o
}
