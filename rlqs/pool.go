package rlqs

import (
	"math"
	"time"

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

// divide sets, for each member of a live stream, target to at most its
// max-min fair share of what the pool has left once the members of closed
// streams (whose assignments run on until their TTL ends), the reserve
// and minBurst tokens per member are taken out. While the server learns
// (its first TTL), a pool that has a bucket with inherited usage gives no
// member more than it claims.
func (p *pool) divide(learning bool) {
	live := make([]*bucket, 0, len(p.members))
	orphaned := 0.0
	inherited := false
	for b := range p.members {
		if b.stream.closed {
			orphaned += b.current.cost(p.window)
			continue
		}
		live = append(live, b)
		inherited = inherited || b.inherited
	}
	// Only a pool with a bucket that reports time from before this server
	// learns: with none, no Envoy holds a previous server's assignment
	// for it (a fresh start, or a limit no Envoy had a bucket for).
	learning = learning && inherited
	if len(live) == 0 {
		return
	}
	demands := make([]float64, len(live))
	shares := make([]float64, len(live))
	for i, b := range live {
		demands[i] = b.demandIn(p, learning)
	}
	// Every member's burst is at least minBurst; a large share's is
	// burstShare of it, so a second pass takes out what those add.
	capacity := p.limit - p.reserve - orphaned - minBurst*float64(len(live))
	maxMinShares(capacity, demands, shares)
	extra := 0.0
	for _, s := range shares {
		extra += max(0, math.Floor(burstShare*s)-minBurst)
	}
	if extra > 0 {
		maxMinShares(capacity-extra, demands, shares)
	}
	for i, b := range live {
		if learning {
			shares[i] = min(shares[i], demands[i])
		}
		b.target = min(b.target, shares[i]/p.window)
	}
}

// room is the most rate b may be given in p: what keeps the pool's
// committed cost within its limit less the reserve, counting b's burst.
func (p *pool) room(b *bucket) float64 {
	free := p.limit - p.reserve - (p.committed - b.held.cost(p.window))
	return min((free-minBurst)/p.window, free/(p.window+burstShare*b.minWin))
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
		}
	}
	b.pools = nil
}

// hold gives a new pooled bucket its first assignment: a hold of each
// pool's reserve, as far as it is free; DENY_ALL when it is not.
func (s *Server) hold(b *bucket) {
	rate := math.Inf(1)
	for _, p := range b.pools {
		free := p.limit - p.committed - minBurst
		rate = min(rate, min(free, p.holdTokens())/p.window)
	}
	s.change(b, b.tokenBucket(rate))
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
