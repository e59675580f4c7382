package rlqs

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/ruletest"
)

// costOf is the most the latest token bucket for bucket admits in w
// seconds (burst plus rate over w).
func (c *client) costOf(bucket map[string]string, w float64) float64 {
	tb := c.latest[bucketKey(bucket)].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb == nil {
		return 0
	}
	return float64(tb.GetMaxTokens()) + c.rate(bucket)*w
}

// TestAssignmentsNeverExceedTheLimit: under random joins, leaves and
// demand changes, the assignments every client may be enforcing (its
// latest, and for one tick after a cut its previous one; those of closed
// streams until they expire) never admit more than the limit in a window.
func TestAssignmentsNeverExceedTheLimit(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		h := newHarness(t, Options{}, testRules)
		rng := rand.New(rand.NewPCG(seed, 7))
		type member struct {
			c       *client
			offered float64
			closed  bool
			prev    float64 // cost before the last change
			changed time.Duration
		}
		var members []*member
		since := time.Duration(0)
		for step := 0; step < 400; step++ {
			switch r := rng.IntN(20); {
			case r == 0 || len(members) < 2:
				m := &member{c: h.open(), offered: float64(rng.IntN(600))}
				m.c.report("web", usage(api, 0, 1, 0))
				members = append(members, m)
			case r == 1:
				m := members[rng.IntN(len(members))]
				if !m.closed {
					m.closed = true
					m.c.stream.Close()
				}
			case r < 4:
				members[rng.IntN(len(members))].offered = float64(rng.IntN(600))
			}
			h.clock.Advance(500 * time.Millisecond)
			if since += 500 * time.Millisecond; since >= time.Second {
				since = 0
				for _, m := range members {
					if !m.closed {
						allowed := math.Min(m.offered, m.c.rate(api))
						m.c.report("web", usage(api, 1, uint64(allowed), uint64(m.offered-allowed)))
					}
				}
			}
			before := map[*member]float64{}
			for _, m := range members {
				before[m] = m.c.costOf(api, 1)
			}
			h.server.Tick(context.Background())
			now := h.clock.Now()
			total := 0.0
			for _, m := range members {
				c := m.c.costOf(api, 1)
				if c != before[m] {
					m.prev, m.changed = before[m], now
				}
				if now >= m.c.expires[bucketKey(api)] {
					continue
				}
				if now == m.changed {
					c = math.Max(c, m.prev)
				}
				total += c
			}
			if total > 400+1e-9 {
				for i, m := range members {
					t.Logf("member %d closed=%v expires=%v now=%v offered=%v cost=%v prev=%v changed=%v", i, m.closed, m.c.expires[bucketKey(api)], now, m.offered, m.c.costOf(api, 1), m.prev, m.changed)
				}
				for _, a := range h.server.Allocations() {
					t.Logf("%+v", a)
				}
				t.Fatalf("seed %d step %d: the assignments in force admit %.1f per second, over the limit of 400", seed, step, total)
			}
		}
	}
}

// TestTakeBeforeGive: when a newcomer's share must come from the others,
// the cuts go out on one tick and the newcomer's raise on a later one.
func TestTakeBeforeGive(t *testing.T) {
	h := newHarness(t, Options{}, testRules)
	h.server.learnUntil = 0
	a, b := h.open(), h.open()
	load := map[*client]map[string]float64{a: {"name=api": 1000}, b: {"name=api": 1000}}
	a.report("web", usage(api, 0, 1, 0))
	b.report("web", usage(api, 0, 1, 0))
	h.run(10*time.Second, time.Second, load)
	if a.rate(api) < 180 || b.rate(api) < 180 {
		t.Fatalf("two heavy clients got %v and %v per second, want about 195 each", a.rate(api), b.rate(api))
	}
	c := h.open()
	c.report("web", usage(api, 0, 1, 0))
	hold := c.rate(api)
	if hold <= 0 || hold > 4 {
		t.Fatalf("the newcomer's hold is %v per second, want a small part of the reserve", hold)
	}
	ticks := 0
	cutAt, raisedAt := -1, -1
	for ticks = 1; ticks <= 10 && raisedAt < 0; ticks++ {
		ra := a.rate(api)
		h.clock.Advance(500 * time.Millisecond)
		h.server.Tick(context.Background())
		if cutAt < 0 && a.rate(api) < ra {
			cutAt = ticks
		}
		if raisedAt < 0 && c.rate(api) > hold {
			raisedAt = ticks
		}
	}
	if cutAt < 0 || raisedAt <= cutAt {
		t.Fatalf("cut on tick %d, newcomer raised on tick %d: want the raise after the cut", cutAt, raisedAt)
	}
	h.run(10*time.Second, time.Second, map[*client]map[string]float64{a: {"name=api": 1000}, b: {"name=api": 1000}, c: {"name=api": 1000}})
	for _, x := range []*client{a, b, c} {
		if r := x.rate(api); r < 120 || r > 134 {
			t.Errorf("three heavy clients: a rate of %v, want about 128 (a third of what the limit leaves)", r)
		}
	}
}

// TestClosedStreamFreesItsShareWhenItsTTLEnds: a stream that closes keeps
// its share until its assignment expires; then the others grow into it.
func TestClosedStreamFreesItsShareWhenItsTTLEnds(t *testing.T) {
	h := newHarness(t, Options{}, testRules)
	h.server.learnUntil = 0
	a, b := h.open(), h.open()
	a.report("web", usage(api, 0, 1, 0))
	b.report("web", usage(api, 0, 1, 0))
	h.run(10*time.Second, time.Second, map[*client]map[string]float64{a: {"name=api": 1000}, b: {"name=api": 1000}})
	bCost := b.costOf(api, 1)
	b.stream.Close()
	bExpires := b.expires[bucketKey(api)]
	for h.clock.Now() < bExpires+2*time.Second {
		h.run(500*time.Millisecond, 500*time.Millisecond, map[*client]map[string]float64{a: {"name=api": 1000}})
		if h.clock.Now() < bExpires && a.costOf(api, 1)+bCost > 400 {
			t.Fatalf("at %v, before the closed stream's assignment expires at %v, the other was raised to %v per second", h.clock.Now(), bExpires, a.rate(api))
		}
	}
	if r := a.rate(api); r < 380 {
		t.Fatalf("after the closed stream's assignment expired, the remaining client has %v per second, want nearly all 400", r)
	}
}

// TestReloadReachesAssignmentsWithinATick: a lowered limit cuts the
// assignments on the next tick, a raised one raises them.
func TestReloadReachesAssignmentsWithinATick(t *testing.T) {
	h := newHarness(t, Options{}, testRules)
	h.server.learnUntil = 0
	a := h.open()
	a.report("web", usage(api, 0, 1, 0))
	h.run(5*time.Second, time.Second, map[*client]map[string]float64{a: {"name=api": 1000}})
	if r := a.rate(api); r < 380 {
		t.Fatalf("one heavy client has %v per second, want nearly 400", r)
	}
	for _, tt := range []struct {
		limit    int
		min, max float64
	}{{100, 90, 100}, {1000, 950, 1000}} {
		set := ruletest.Parse(t, descriptors.Options{},
			"domain: web\ndescriptors:\n  - key: name\n    value: api\n    rate_limit: {unit: second, requests_per_unit: "+itoa(tt.limit)+"}\n")
		h.server.SetRules(set)
		h.clock.Advance(500 * time.Millisecond)
		h.server.Tick(context.Background())
		h.clock.Advance(500 * time.Millisecond)
		h.server.Tick(context.Background())
		if r := a.rate(api); r < tt.min || r > tt.max {
			t.Errorf("limit %d: %v per second two ticks after the reload, want within [%v, %v]", tt.limit, r, tt.min, tt.max)
		}
	}
}

func itoa(n int) string {
	b := []byte{}
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}
