// Package limitertest checks that an implementation of window.Limiter keeps
// the Limiter contract, as testing/fstest.TestFS does for an fs.FS: every
// Limiter (the in-memory window.Store, the Redis store on one node and on a
// Cluster, window.Split) runs the same suite, for every algorithm of
// window.Algorithms, so a new backend or a new algorithm is covered without
// editing the suite.
package limitertest

import (
	"errors"
	"testing"
	"time"

	"github.com/leapgate/leapgate/internal/testclock"
	"github.com/leapgate/leapgate/window"
)

// Clock is a window.Clock that moves only when told (Set, Advance): the
// time a Limiter under test reads for every call.
type Clock = testclock.Clock

// Open returns a new Limiter, holding no counter, whose every call acts at
// clock.Now() (in whole microseconds is enough: the suite moves the clock
// in milliseconds). It is called once per subtest; t is that subtest's.
type Open func(t *testing.T, clock *Clock) window.Limiter

// start is the clock's time when a subtest begins: far from 0, as Unix
// time is.
const start = 1000 * time.Hour

// Run runs the conformance suite against the Limiters open returns, as
// subtests of t: for every algorithm, admission up to the limit, checks
// that record nothing, all-or-nothing batches (a refused Veto records
// nothing, a refused request without Veto vetoes nothing, an error records
// nothing), refunds (applied only without a veto, never below zero),
// charge: always (recorded when over, kept by a vetoed batch, refused as
// an error where the algorithm does not serve it), holders of concurrency
// slots, Undo, a clock that steps back, and windows that age out.
func Run(t *testing.T, open Open) {
	for _, alg := range window.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					if c.only != nil && !c.only(alg) {
						t.Skipf("does not apply to %v", alg)
					}
					clock := &Clock{}
					clock.Set(start)
					h := &harness{t: t, l: open(t, clock), clock: clock, alg: alg, newest: start}
					c.run(h)
				})
			}
		})
	}
}

// window is the window (or lease) of every counter of the suite.
const length = 10 * time.Second

// limit is the limit of every counter of the suite.
const limit = 5

// harness is one subtest's Limiter and what its requests share.
type harness struct {
	t     *testing.T
	l     window.Limiter
	clock *Clock
	alg   window.Algorithm
	// newest is the newest time the clock was set to.
	newest time.Duration
}

// req returns a request for key with hits, of the subtest's algorithm,
// limit and window, vetoing.
func (h *harness) req(key string, hits uint64) window.Request {
	buckets := 1
	if h.alg.Info().Bucketed {
		buckets = 10
	}
	spec, err := window.NewSpec(length, buckets)
	if err != nil {
		h.t.Fatal(err)
	}
	return window.Request{Key: key, Spec: spec, Limit: limit, Hits: hits, Veto: true, Algorithm: h.alg}
}

// advance moves the clock d forward.
func (h *harness) advance(d time.Duration) {
	h.clock.Advance(d)
	h.newest = max(h.newest, h.clock.Now())
}

// do runs one batch and fails the test on an error.
func (h *harness) do(reqs ...window.Request) []window.Result {
	h.t.Helper()
	res, err := h.l.Do(h.t.Context(), reqs)
	if err != nil {
		h.t.Fatalf("Do(%+v): %v", reqs, err)
	}
	if len(res) != len(reqs) {
		h.t.Fatalf("Do: %d results for %d requests", len(res), len(reqs))
	}
	return res
}

// remaining checks key (a check-only request) and returns its Remaining.
func (h *harness) remaining(key string) uint64 {
	h.t.Helper()
	r := h.do(h.req(key, 0))[0]
	if r.Recorded {
		h.t.Fatalf("a check of %q recorded: %+v", key, r)
	}
	return r.Remaining
}

// want fails the test when the remaining quota of key is not n.
func (h *harness) want(key string, n uint64, when string) {
	h.t.Helper()
	if got := h.remaining(key); got != n {
		h.t.Fatalf("%s: %q has %d remaining, want %d", when, key, got, n)
	}
}

// admitted fails the test unless r admitted and recorded hits, leaving
// remaining.
func (h *harness) admitted(r window.Result, remaining uint64, what string) {
	h.t.Helper()
	if !r.Allowed || !r.Recorded || r.Remaining != remaining {
		h.t.Fatalf("%s: %+v, want allowed and recorded with %d remaining", what, r, remaining)
	}
}

// refused fails the test unless r is a refusal that recorded nothing, with
// a reset within the window (within a window and a bucket for time
// buckets, whose hits count for up to that long) of the newest time seen,
// as of the clock's now (later if the clock stepped back).
func (h *harness) refused(r window.Result, what string) {
	h.t.Helper()
	most := length
	if h.alg.Info().Bucketed {
		most += h.req("", 0).Spec.BucketLength()
	}
	most += h.newest - h.clock.Now()
	if r.Allowed || r.Recorded || r.Reset <= 0 || r.Reset > most {
		h.t.Fatalf("%s: %+v, want refused, unrecorded, with a reset in (0, %v]", what, r, most)
	}
}

var cases = []struct {
	name string
	only func(window.Algorithm) bool // nil: every algorithm
	run  func(h *harness)
}{
	{"admits up to the limit", nil, func(h *harness) {
		for i := range limit {
			h.admitted(h.do(h.req("k", 1))[0], uint64(limit-1-i), "hit")
		}
		h.refused(h.do(h.req("k", 1))[0], "one hit over the limit")
		h.want("k", 0, "after the limit")
	}},
	{"checks record nothing and create nothing", nil, func(h *harness) {
		r := h.do(h.req("k", 0))[0]
		if !r.Allowed || r.Recorded || r.Remaining != limit {
			h.t.Fatalf("check of an unknown key: %+v", r)
		}
		h.do(h.req("k", 2))
		for range 3 {
			h.want("k", limit-2, "checks after 2 hits")
		}
	}},
	{"more hits than the limit", nil, func(h *harness) {
		h.refused(h.do(h.req("k", limit+1))[0], "limit+1 hits at once")
		h.want("k", limit, "after a refusal")
		h.admitted(h.do(h.req("k", limit))[0], 0, "limit hits at once")
	}},
	{"a refused veto records nothing", nil, func(h *harness) {
		h.do(h.req("full", limit))
		res := h.do(h.req("a", 2), h.req("b", 1), h.req("full", 1))
		h.refused(res[2], "the full counter")
		for i, key := range []string{"a", "b"} {
			if res[i].Recorded || res[i].Remaining != limit {
				h.t.Fatalf("%q in a vetoed batch: %+v, want unrecorded with the whole limit left", key, res[i])
			}
			h.want(key, limit, "after a vetoed batch")
		}
	}},
	{"a refusal without veto vetoes nothing", nil, func(h *harness) {
		h.do(h.req("full", limit))
		over := h.req("full", 1)
		over.Veto = false
		res := h.do(h.req("a", 2), over)
		h.admitted(res[0], limit-2, "beside a refused request without veto")
		h.want("a", limit-2, "after the batch")
	}},
	{"an invalid request records nothing", nil, func(h *harness) {
		bad := h.req("bad", 1)
		bad.Spec = window.Spec{}
		if _, err := h.l.Do(h.t.Context(), []window.Request{h.req("a", 1), bad}); !errors.Is(err, window.ErrInvalidSpec) {
			h.t.Fatalf("a batch with the zero Spec: %v, want ErrInvalidSpec", err)
		}
		h.want("a", limit, "after a failed batch")
	}},
	{"refunds", nil, func(h *harness) {
		h.do(h.req("k", 3))
		back := h.req("k", 2)
		back.Negative, back.Veto = true, false
		h.do(h.req("full", limit))
		res := h.do(back, h.req("full", 1))
		if res[0].Recorded || res[0].Remaining != limit-3 {
			h.t.Fatalf("a refund in a vetoed batch: %+v, want a check with %d remaining", res[0], limit-3)
		}
		h.want("k", limit-3, "after a vetoed refund")
		if r := h.do(back)[0]; !r.Allowed || r.Remaining != limit-1 {
			h.t.Fatalf("refund of 2 of 3: %+v, want allowed with %d remaining", r, limit-1)
		}
		back.Hits = 10 * limit
		h.do(back)
		h.want("k", limit, "after refunding more than was recorded")
		back.Key = "unknown"
		h.do(back)
		h.want("unknown", limit, "after a refund of an unknown key")
	}},
	{"undo", nil, func(h *harness) {
		reqs := []window.Request{h.req("a", 2), h.req("b", 3)}
		res := h.do(reqs...)
		h.do(h.req("a", 1))
		if err := h.l.Undo(h.t.Context(), reqs, res); err != nil {
			h.t.Fatal(err)
		}
		h.want("a", limit-1, "after undoing 2 of 3 hits")
		h.want("b", limit, "after undoing every hit")
		res[1].Recorded = false
		if err := h.l.Undo(h.t.Context(), reqs[1:], res[1:]); err != nil {
			h.t.Fatal(err)
		}
		h.want("b", limit, "after an Undo of an unrecorded result")
	}},
	{"charge always", func(a window.Algorithm) bool { return a.Info().ChargeAlways }, func(h *harness) {
		c := h.req("k", limit+3)
		c.ChargeAlways = true
		r := h.do(c)[0]
		if r.Allowed || !r.Recorded || r.Remaining != 0 {
			h.t.Fatalf("a charge over the limit: %+v, want refused, recorded, 0 remaining", r)
		}
		if r := h.do(h.req("k", 0))[0]; r.Allowed {
			h.t.Fatalf("a check after a debt: %+v, want refused", r)
		}
		h.do(h.req("full", limit))
		c.Key, c.Hits = "kept", 2
		res := h.do(c, h.req("full", 1))
		if !res[0].Recorded {
			h.t.Fatalf("a charge in a vetoed batch: %+v, want recorded", res[0])
		}
		h.want("kept", limit-2, "after a charge in a vetoed batch")
		h.advance(2 * length)
		h.want("k", limit, "after the debt aged out")
	}},
	{"charge always refused", func(a window.Algorithm) bool { return !a.Info().ChargeAlways }, func(h *harness) {
		c := h.req("k", 1)
		c.ChargeAlways = true
		if _, err := h.l.Do(h.t.Context(), []window.Request{h.req("a", 1), c}); !errors.Is(err, window.ErrChargeAlways) {
			h.t.Fatalf("charge always on %v: %v, want ErrChargeAlways", h.alg, err)
		}
		h.want("a", limit, "after a refused batch")
	}},
	{"holders", func(a window.Algorithm) bool { return a == window.Concurrency }, func(h *harness) {
		take := func(holder string) window.Result {
			q := h.req("k", 1)
			q.Holder = holder
			return h.do(q)[0]
		}
		give := func(holder string) {
			q := h.req("k", 1)
			q.Holder, q.Negative, q.Veto = holder, true, false
			h.do(q)
		}
		for i, holder := range []string{"a", "b", "c", "d", "e"} {
			h.admitted(take(holder), uint64(limit-1-i), "slot of "+holder)
		}
		h.refused(take("f"), "a slot past the cap")
		give("nobody")
		h.want("k", 0, "after the refund of a holder that holds nothing")
		give("a")
		h.want("k", 1, "after a's refund")
		give("a")
		h.want("k", 1, "after a's second refund")
		h.admitted(take("f"), 0, "f in a's slot")
	}},
	{"the clock steps back", nil, func(h *harness) {
		h.do(h.req("k", 3))
		h.clock.Set(start - time.Hour)
		h.want("k", limit-3, "an hour earlier")
		h.admitted(h.do(h.req("k", 2))[0], 0, "the rest of the limit, an hour earlier")
		h.refused(h.do(h.req("k", 1))[0], "over the limit, an hour earlier")
		h.clock.Set(start)
		h.want("k", 0, "back at the newest time")
	}},
	{"a changed limit takes effect", func(a window.Algorithm) bool { return a != window.Concurrency }, changedLimit},
	{"windows age out", nil, func(h *harness) {
		h.do(h.req("k", limit))
		h.advance(length / 2)
		if h.alg != window.TokenBucket { // which refills half its tokens
			h.refused(h.do(h.req("k", 1))[0], "half a window later")
		}
		h.advance(2 * length)
		h.admitted(h.do(h.req("k", limit))[0], 0, "two windows later")
	}},
}

// changedLimit offers a steady 1.5 × high hits a window to a key whose
// limit goes from low to high (a raise, as a reload or an xDS update makes
// it) and then to low again (a cut), and the same traffic to control keys:
// one at high all along, one created at low when the cut applies. In the
// second window after the raise, the raised key must admit what the
// control at high admits, less one block of a checkpoint window (it is not
// held at the old limit); from the cut on, it must never admit more than
// the fresh control (a key that already counts hits is no freer than a new
// one).
func changedLimit(h *harness) {
	const low, high = 200, 400
	step := length / (3 * high / 2)
	type at struct {
		key   string
		limit uint64
	}
	offer := func(windows int, keys ...at) []int {
		admitted := make([]int, len(keys))
		for range windows * 3 * high / 2 {
			reqs := make([]window.Request, len(keys))
			for i, k := range keys {
				reqs[i] = h.req(k.key, 1)
				reqs[i].Limit, reqs[i].Veto = k.limit, false
			}
			for i, r := range h.do(reqs...) {
				if r.Allowed {
					admitted[i]++
				}
			}
			h.advance(step)
		}
		return admitted
	}
	offer(2, at{"k", low}, at{"high", high})
	offer(1, at{"k", high}, at{"high", high})
	got := offer(1, at{"k", high}, at{"high", high})
	if slack := high/window.Blocks + 1; got[0]+slack < got[1] {
		h.t.Fatalf("the second window after a raise from %d to %d admitted %d, a key at %d all along %d", low, high, got[0], high, got[1])
	}
	got = offer(1, at{"k", low}, at{"low", low})
	if got[0] > got[1] {
		h.t.Fatalf("the window after a cut from %d to %d admitted %d, more than a key created at %d (%d)", high, low, got[0], low, got[1])
	}
}
