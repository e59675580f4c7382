package rlqs

import (
	"math"
	"time"

	"github.com/leapgate/leapgate/rlqs/quota"
	"github.com/leapgate/leapgate/window"
)

// pool is one limit's counter key, the unit of allocation: every bucket
// whose rule and values fold into the key shares the limit.
type pool struct {
	key     string
	domain  string
	ruleID  string
	limit   float64 // requests per window
	window  float64 // the window, seconds
	reserve float64 // tokens per window kept for the holds of newcomers
	members map[*bucket]struct{}
	// committed is the sum over members of the cost of what they may
	// enforce (their held assignments).
	committed float64
	// The pool's last division: its level and spare, the grant left for
	// this tick's raises, and the replicas sharing the pool. learning is
	// set while the pool learns (see claim).
	level, spare, grant float64
	replicas            int
	learning            bool
	// holds is the cost of the holds given since the last tick.
	holds float64
	// claimed is set while the ledger holds a claim of this replica on
	// the pool (cleared once it is withdrawn).
	claimed bool
}

// newPool returns an empty pool of limit requests per window.
func newPool(key, domain, ruleID string, limit uint32, w time.Duration) *pool {
	l := float64(limit)
	return &pool{
		key: key, domain: domain, ruleID: ruleID,
		limit: l, window: max(w.Seconds(), 1e-3),
		reserve: min(max(2, math.Ceil(l/100)), l/4),
		members: map[*bucket]struct{}{},
	}
}

// holdTokens is the share of a newcomer until it gets its own: a quarter
// half of the reserve, at least one token.
func (p *pool) holdTokens() float64 { return max(1, p.reserve/2) }

// claim returns the pool's claim as this replica sees it, with its live
// members and their demands (tokens per window): the members of closed
// streams are fixed at their assignments until they expire, the others
// claim their demand (see bucket.demandIn). While the server learns (its
// first TTL), a pool with a member that reports usage from before this
// server claims for each member no more than it was admitting: with none,
// no Envoy holds a previous server's assignment for it (a fresh start).
func (p *pool) claim(learning bool, hold time.Duration) (c quota.Claim, live []*bucket, demands []float64) {
	c = quota.Claim{Key: p.key, Limit: p.limit, Reserve: p.reserve, Hold: hold}
	inherited := false
	for b := range p.members {
		if b.stream.closed {
			c.Fixed += b.current.cost(p.window)
			continue
		}
		live = append(live, b)
		c.Committed += b.held.cost(p.window)
		inherited = inherited || b.inherited
	}
	p.learning = learning && inherited
	demands = make([]float64, len(live))
	for i, b := range live {
		demands[i] = b.demandIn(p, p.learning)
	}
	c.Demands, c.Weights = summarize(demands, p.limit)
	c.Want = p.limit
	if p.level > 0 || p.spare > 0 {
		c.Want = 0
		for i, b := range live {
			t := b.tokenBucket(p.share(demands[i]) / p.window)
			c.Want += max(0, t.cost(p.window)-b.held.cost(p.window))
		}
	}
	return c, live, demands
}

// withdrawal is the claim that withdraws this replica's claim on the pool:
// no demand, nothing fixed or committed (see Ledger).
func (p *pool) withdrawal() quota.Claim {
	return quota.Claim{Key: p.key, Limit: p.limit, Reserve: p.reserve}
}

// share is a member's share of the pool by the last division, tokens per
// window: the lesser of its demand and the level, plus the spare; while
// learning, no more than its demand.
func (p *pool) share(demand float64) float64 {
	s := min(demand, p.level) + p.spare
	if p.learning {
		s = min(s, demand)
	}
	return s
}

// divide takes the pool's division: each live member's target is at most
// its share, and the raises of this tick may add at most the grant to the
// pool's committed cost.
func (p *pool) divide(d quota.Division, live []*bucket, demands []float64) {
	p.level, p.spare, p.grant, p.replicas = d.Level, d.Spare, d.Grant, max(d.Replicas, 1)
	for i, b := range live {
		b.target = min(b.target, p.share(demands[i])/p.window)
	}
}

// raise returns the most rate b may be raised to in p: what adds at most
// the pool's grant left to its cost, counting b's burst.
func (p *pool) raise(b *bucket) float64 {
	free := p.grant + b.held.cost(p.window)
	return min((free-quota.MinBurst)/p.window, free/(p.window+quota.BurstShare*b.minWin))
}

// match matches b against the rules and puts it into the pools of its
// rule's limits, keeping its current assignment (counted in its new pools;
// the next tick cuts it if the pools cannot afford it).
func (s *Server) match(b *bucket) {
	s.detach(b)
	b.ruleID, b.pools, b.shadow, b.fixed = "", nil, false, allowAll
	r, entries := s.rules.MatchUnordered(b.stream.domain, b.id.GetBucket())
	if r == nil || r.Unlimited {
		b.current, b.held = assignment{kind: allowAll}, assignment{kind: allowAll}
		return
	}
	b.ruleID = r.ID
	shadow := r.ShadowMode || s.opts.ShadowMode
	minWin := math.Inf(1)
	var pools []*pool
	for i, l := range r.Limits {
		switch {
		case l.Algorithm == window.Concurrency:
			continue
		case l.RequestsPerUnit == 0:
			if !shadow {
				b.fixed = denyAll
				b.current, b.held = assignment{kind: denyAll}, assignment{kind: denyAll}
				return
			}
			continue
		}
		key := string(r.AppendCounterKey(nil, entries, i))
		p := s.pools[key]
		if p == nil {
			p = newPool(key, r.Domain, r.ID, l.RequestsPerUnit, l.Window())
			s.pools[key] = p
		}
		pools = append(pools, p)
		minWin = min(minWin, p.window)
	}
	if len(pools) == 0 {
		b.current, b.held = assignment{kind: b.fixed}, assignment{kind: b.fixed}
		return
	}
	b.pools, b.shadow, b.minWin = pools, shadow, minWin
	b.fill = uint32(max(1, math.Round(minWin)))
	for _, p := range pools {
		p.members[b] = struct{}{}
		p.committed += b.held.cost(p.window)
	}
}

// detach takes b out of its pools, dropping pools left empty.
func (s *Server) detach(b *bucket) {
	for _, p := range b.pools {
		delete(p.members, b)
		p.committed -= b.held.cost(p.window)
		if len(p.members) == 0 {
			delete(s.pools, p.key)
			if p.claimed {
				s.withdraw[p.key] = p.withdrawal()
			}
		}
	}
	b.pools = nil
}

// hold gives a new pooled bucket its first assignment: a hold of each
// pool's reserve, as far as it is free (shared by the replicas of the
// pool, with a ledger); DENY_ALL when it is not.
func (s *Server) hold(b *bucket) {
	rate := math.Inf(1)
	for _, p := range b.pools {
		free := p.limit - p.committed - quota.MinBurst
		if s.opts.Ledger != nil {
			free = p.reserve/float64(max(p.replicas, 1)) - p.holds - quota.MinBurst
		}
		rate = min(rate, min(free, p.holdTokens())/p.window)
	}
	s.change(b, b.tokenBucket(rate))
	for _, p := range b.pools {
		p.holds += b.current.cost(p.window)
	}
}

// change makes a b's current assignment. An increase counts in its pools
// at once; a cut only from the next tick, since b may enforce its larger
// assignment until the cut reaches it (b.held keeps the larger). The burst
// of a bucket's token buckets grows with their rate, so the larger rate is
// the larger cost in every pool.
func (s *Server) change(b *bucket, a assignment) {
	b.current = a
	if a.rate() <= b.held.rate() && b.held.kind != unassigned {
		return
	}
	for _, p := range b.pools {
		p.committed += a.cost(p.window) - b.held.cost(p.window)
	}
	b.held = a
}
