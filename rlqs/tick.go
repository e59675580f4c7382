package rlqs

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/leapgate/leapgate/rlqs/quota"
)

// hysteresis is the least relative change of rate worth a new assignment:
// each new token bucket starts full (its burst again), so assignments
// change only when it matters.
const hysteresis = 1.0 / 100

// raiseHysteresis is the least relative raise worth a new assignment:
// smaller than a cut's, so that a bucket limited by the level ends within
// half a percent of its share.
const raiseHysteresis = 1.0 / 200

// Tick divides every limit anew and sends what changed. In order: buckets
// of closed streams whose assignments have expired free their share;
// buckets that reported no request for Options.BucketIdle are abandoned;
// the cuts sent on the previous tick count as in force; each pool's
// capacity is divided max-min fairly by demand; cuts go out at once, and
// increases as far as the pools can pay for them without the cuts of this
// tick (take before give); assignments past half their TTL are refreshed.
// With a Ledger, the division waits for it at most one Options.Tick, and
// no longer than ctx allows.
func (s *Server) Tick(ctx context.Context) {
	started := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Clock.Now()
	learning := now < s.learnUntil
	out := map[*Stream][]*rlqspb.RateLimitQuotaResponse_BucketAction{}

	if s.rematch {
		s.rematch = false
		s.eachBucket(func(b *bucket) {
			before := b.current
			s.match(b)
			if !b.pooled() && b.current != before && !b.stream.closed {
				out[b.stream] = append(out[b.stream], s.sendAction(b, now))
			}
		})
	}
	for b := range s.orphans {
		if now >= b.ttlEnd {
			delete(s.orphans, b)
			s.forget(b)
			s.metrics.abandoned.WithLabelValues("expired").Inc()
		}
	}
	for st := range s.streams {
		for key, b := range st.buckets {
			if now-b.lastUsed >= s.opts.BucketIdle {
				out[st] = append(out[st], abandonAction(b.id))
				delete(st.buckets, key)
				s.forget(b)
				s.metrics.abandoned.WithLabelValues("idle").Inc()
			}
		}
	}

	live := s.liveBuckets()
	for _, p := range s.pools {
		p.committed = 0
		for b := range p.members {
			b.held = b.current
			p.committed += b.current.cost(p.window)
		}
	}
	for _, b := range live {
		b.target = math.Inf(1)
	}
	divided := s.divide(ctx, learning)

	var raises []*bucket
	for _, b := range live {
		if !divided {
			break // no division this tick: assignments stay as they are
		}
		t := b.tokenBucket(b.target)
		switch {
		case lower(t, b.current, hysteresis):
			s.change(b, t)
			s.metrics.changes.WithLabelValues("cut").Inc()
			out[b.stream] = append(out[b.stream], s.sendAction(b, now))
		case lower(b.current, t, raiseHysteresis):
			raises = append(raises, b)
		}
	}
	// Within the hysteresis a pool could stay above its limit: cut every
	// member still above its target.
	for _, p := range s.pools {
		if !divided || s.currentCost(p) <= p.limit {
			continue
		}
		for b := range p.members {
			if t := b.tokenBucket(b.target); !b.stream.closed && lower(t, b.current, 0) {
				s.change(b, t)
				s.metrics.changes.WithLabelValues("cut").Inc()
				out[b.stream] = append(out[b.stream], s.sendAction(b, now))
			}
		}
	}
	slices.SortFunc(raises, func(a, b *bucket) int { return cmpFloat(a.target, b.target) })
	for _, b := range raises {
		rate := b.target
		for _, p := range b.pools {
			rate = min(rate, p.raise(b))
		}
		if a := b.tokenBucket(rate); lower(b.current, a, raiseHysteresis) {
			for _, p := range b.pools {
				p.grant -= max(0, a.cost(p.window)-b.held.cost(p.window))
			}
			s.change(b, a)
			s.metrics.changes.WithLabelValues("raise").Inc()
			out[b.stream] = append(out[b.stream], s.sendAction(b, now))
		}
	}

	// Without a division for a TTL (the ledger unreachable), assignments
	// are no longer refreshed: they expire, and Envoy falls back.
	refresh := s.opts.Ledger == nil || now-s.lastDivided <= s.opts.AssignmentTTL
	for st := range s.streams {
		for _, b := range st.buckets {
			if refresh && b.sentAt != now && b.ttlEnd-now <= s.opts.AssignmentTTL/2 {
				out[st] = append(out[st], s.sendAction(b, now))
			}
		}
	}
	s.observe(live)
	for st, actions := range out {
		if !st.closed && len(actions) > 0 {
			st.send(&rlqspb.RateLimitQuotaResponse{BucketAction: actions})
		}
	}
	s.metrics.tick.Observe(time.Since(started).Seconds())
}

// divide divides every pool, through the ledger when there is one, and
// reports whether it could: false when the ledger failed (logged, counted),
// and then the pools keep their last division.
func (s *Server) divide(ctx context.Context, learning bool) bool {
	type pending struct {
		p       *pool
		live    []*bucket
		demands []float64
	}
	work := make([]pending, 0, len(s.pools))
	claims := make([]quota.Claim, 0, len(s.pools))
	hold := 2*s.opts.AssignmentTTL + s.opts.Tick
	for _, p := range s.pools {
		c, live, demands := p.claim(learning, hold)
		p.holds = 0
		if len(live) == 0 && c.Fixed == 0 {
			if p.claimed {
				s.withdraw[p.key] = p.withdrawal()
			}
			continue
		}
		delete(s.withdraw, p.key) // its claim replaces any withdrawal
		work = append(work, pending{p, live, demands})
		claims = append(claims, c)
	}
	if s.opts.Ledger == nil {
		clear(s.withdraw)
	}
	// A pool this replica no longer serves gives its capacity back at
	// once rather than when its claim's hold ends.
	withdrawn := make([]quota.Claim, 0, len(s.withdraw))
	for _, c := range s.withdraw {
		c.Hold = hold
		withdrawn = append(withdrawn, c)
	}
	clear(s.withdraw)
	if len(claims) == 0 && len(withdrawn) == 0 {
		s.lastDivided = s.opts.Clock.Now()
		return true
	}
	var divisions []quota.Division
	if s.opts.Ledger == nil {
		for _, c := range claims {
			divisions = append(divisions, divideLocal(c))
		}
	} else {
		ctx, cancel := context.WithTimeout(ctx, s.opts.Tick)
		var err error
		divisions, err = s.opts.Ledger.Divide(ctx, append(claims, withdrawn...))
		cancel()
		if err == nil && len(divisions) != len(claims)+len(withdrawn) {
			err = fmt.Errorf("the ledger answered %d divisions for %d claims", len(divisions), len(claims)+len(withdrawn))
		}
		if err != nil {
			for _, c := range withdrawn {
				s.withdraw[c.Key] = c // again on the next tick
			}
			s.metrics.ledgerErrors.Inc()
			s.warn.Warn(s.opts.Logger, "RLQS: dividing the limits through the ledger failed; assignments stay as they are, and are no longer refreshed after a TTL", "error", err)
			return false
		}
	}
	for i, w := range work {
		w.p.divide(divisions[i], w.live, w.demands)
		w.p.claimed = s.opts.Ledger != nil
	}
	s.lastDivided = s.opts.Clock.Now()
	return true
}

// lower reports whether a admits less than b by more than the share h of
// b's rate: a DENY_ALL is lower than any token bucket.
func lower(a, b assignment, h float64) bool {
	switch {
	case a.kind == tokenBucket && b.kind == tokenBucket:
		return a.rate() < b.rate()*(1-h)
	case a.kind == denyAll && b.kind == tokenBucket:
		return true
	}
	return false
}

// currentCost is the sum over p's members of the cost of their current
// assignments.
func (s *Server) currentCost(p *pool) float64 {
	c := 0.0
	for b := range p.members {
		c += b.current.cost(p.window)
	}
	return c
}

// liveBuckets returns the pooled buckets of open streams.
func (s *Server) liveBuckets() []*bucket {
	var live []*bucket
	for st := range s.streams {
		for _, b := range st.buckets {
			if b.pooled() {
				live = append(live, b)
			}
		}
	}
	return live
}

// eachBucket calls f for every tracked bucket, orphans included.
func (s *Server) eachBucket(f func(*bucket)) {
	for st := range s.streams {
		for _, b := range st.buckets {
			f(b)
		}
	}
	for b := range s.orphans {
		f(b)
	}
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
