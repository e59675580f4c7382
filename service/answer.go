package service

import (
	"context"
	"math"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/leapgate/leapgate/internal/envoyhdr"
	"github.com/leapgate/leapgate/window"
)

// consultBreakers asks the breakers of matched rules; it reports whether an
// enforcing breaker refused the request.
func (s *Service) consultBreakers(sc *scratch) bool {
	if s.breakers == nil {
		return false
	}
	refused := false
	for i := range sc.plans {
		p := &sc.plans[i]
		if p.info == nil || p.info.rule.Breaker == nil || p.refund {
			continue
		}
		ok, probe, retry := s.breakers.AllowProbe(p.info.rule, p.entries)
		if ok {
			if probe != 0 {
				sc.probes = append(sc.probes, probe)
			}
			continue
		}
		p.breakerOff = true
		p.retryAfter = max(retry, 0)
		if !p.shadow {
			refused = true
		}
	}
	return refused
}

// decide picks each descriptor's reported result and computes the overall
// rate-limit outcome before breakers and global shadow mode, as
// envoyproxy/ratelimit does: the request is over when an enforcing
// descriptor (neither shadow nor quota mode) is over, or when it has
// descriptors in quota mode and every one of them is over (a descriptor in
// shadow mode is never over). With QUOTA_MODE every descriptor but an
// unlimited one is in quota mode, one that matches no rule too.
func (s *Service) decide(sc *scratch, results []window.Result) (over bool, reason string) {
	quota, quotaOver := 0, 0
	for i := range sc.plans {
		p := &sc.plans[i]
		for j := p.first; j < p.first+p.n; j++ {
			r := &results[j]
			if !r.Allowed && !p.refund {
				p.over = true
			}
			if p.best < 0 || moreConstraining(r, &results[p.best]) {
				p.best = j
			}
		}
		switch {
		case inQuotaMode(s, p):
			quota++
			if p.over && !p.shadow {
				quotaOver++
			}
		case p.over && enforcing(p):
			over = true
		}
	}
	if over || quota > 0 && quotaOver == quota {
		return true, envoyhdr.ReasonRateLimited
	}
	return false, ""
}

// inQuotaMode reports whether a descriptor counts among the request's
// descriptors in quota mode (see decide).
func inQuotaMode(s *Service, p *plan) bool {
	if p.kind == kindBroken || p.kind == kindUnlimited {
		return false // a broken rule enforces; an unlimited one never counts
	}
	return p.quota || s.quota
}

// moreConstraining reports whether a should be reported rather than b: a
// refusal over an admission (the longest wait among refusals), else the
// least remaining.
func moreConstraining(a, b *window.Result) bool {
	if a.Allowed != b.Allowed {
		return !a.Allowed
	}
	if !a.Allowed {
		return a.Reset > b.Reset
	}
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	return a.Reset > b.Reset
}

// undo takes back hits that an over answer must not consume: those of
// non-vetoing descriptors (shadow, quota) with some limit over, and, when the
// request is refused overall without a veto having prevented recording (a
// circuit breaker open), every recorded hit, except always-charged ones.
func (s *Service) undo(ctx context.Context, sc *scratch, results []window.Result, over bool) error {
	all := over && !s.shadow
	for i := range sc.plans {
		p := &sc.plans[i]
		if !all && !(p.over && !p.veto) {
			continue
		}
		for j := p.first; j < p.first+p.n; j++ {
			r := &results[j]
			if !r.Recorded || sc.reqs[j].ChargeAlways {
				continue // an always-charged cost was consumed: it stays
			}
			sc.undoReq = append(sc.undoReq, sc.reqs[j])
			sc.undoRes = append(sc.undoRes, *r)
			// Report the quota as if the hits had not been recorded. The
			// reset stays an upper bound (the undone hits were the newest),
			// except that a window left empty has nothing to age out.
			r.Unrecord(&sc.reqs[j])
			if r.Remaining == sc.reqs[j].Limit {
				r.Reset = 0
			}
		}
	}
	if len(sc.undoReq) == 0 {
		return nil
	}
	return s.limiter.Undo(ctx, sc.undoReq, sc.undoRes)
}

// count updates the per-rule metrics.
func (s *Service) count(sc *scratch, st *ruleState, domain string, results []window.Result) {
	for i := range sc.plans {
		p := &sc.plans[i]
		var c *ruleCounters
		switch {
		case p.kind == kindOverride:
			d := st.overrides[domain]
			if d == nil {
				d = s.metrics.overrideCounters(domain)
			}
			c = d.get(overrideMetricKey(domain, p.entries, p.info != nil && p.info.rule.DetailedMetric))
		case p.info != nil:
			if p.info.counters != nil {
				c = p.info.counters
			} else {
				c = p.info.detailed.get(p.info.rule.MetricKey(p.entries))
			}
		}
		if c == nil || p.refund {
			continue // refunds are not hits
		}
		hits := float64(p.hits)
		c.total.Add(hits)
		if p.breakerOff {
			c.circuit.Add(hits)
		}
		if p.kind == kindBroken {
			c.over.Add(hits)
			continue
		}
		if p.best < 0 {
			if !p.breakerOff {
				c.within.Add(hits)
			}
			continue
		}
		r := &results[p.best]
		limit := sc.reqs[p.best].Limit
		switch {
		case p.over:
			c.over.Add(hits)
			if p.shadow {
				c.shadow.Add(hits)
			}
		default:
			if !p.breakerOff {
				c.within.Add(hits)
			}
			used := limit - min(r.Remaining, limit)
			if !r.Recorded {
				used += p.hits
			}
			if threshold := uint64(math.Floor(float64(limit) * s.nearRatio)); used > threshold {
				c.near.Add(float64(min(p.hits, used-threshold)))
			}
		}
	}
}

// statusBlock allocates a descriptor status with its parts in one piece.
type statusBlock struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	limit  rlsv3.RateLimitResponse_RateLimit
	reset  durationpb.Duration
	mult   wrapperspb.UInt32Value
}

// singleResponse allocates a one-descriptor response in one piece.
type singleResponse struct {
	resp     rlsv3.RateLimitResponse
	statuses [1]*rlsv3.RateLimitResponse_DescriptorStatus
	block    [1]statusBlock
}

// conclude sets every plan's answer from the limiter's results: the most
// constraining limit (or none), its remaining quota and reset, and whether
// the descriptor is OVER_LIMIT (its limit refused, in quota mode too, or its
// breaker is open; never in shadow mode).
func (s *Service) conclude(sc *scratch, results []window.Result) {
	for i := range sc.plans {
		p := &sc.plans[i]
		a := answer{}
		switch p.kind {
		case kindUnlimited:
			a.remaining = UnlimitedRemaining
		case kindBroken:
			a.over = true
		case kindLimited, kindOverride:
			a.limit = p.limitOf(p.best - p.first)
			r := &results[p.best]
			a.remaining = uint32(min(r.Remaining, math.MaxUint32))
			a.reset = r.Reset
			a.over = p.over && !p.shadow
		}
		if p.breakerOff && !p.shadow {
			a.over = true
			a.reset = p.retryAfter
			if p.over && p.best >= 0 {
				a.reset = max(a.reset, results[p.best].Reset)
			}
		}
		p.answer = a
	}
}

// respond builds the statuses from the plans' answers.
func (s *Service) respond(sc *scratch) *rlsv3.RateLimitResponse {
	n := len(sc.plans)
	var resp *rlsv3.RateLimitResponse
	var blocks []statusBlock
	if n == 1 {
		// The common case in one allocation.
		one := new(singleResponse)
		resp, blocks = &one.resp, one.block[:]
		resp.Statuses = one.statuses[:]
	} else {
		resp = &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
		blocks = make([]statusBlock, n)
	}
	for i := range sc.plans {
		a := &sc.plans[i].answer
		b := &blocks[i]
		st := &b.status
		resp.Statuses[i] = st
		st.Code = rlsv3.RateLimitResponse_OK
		if a.over {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		st.LimitRemaining = a.remaining
		if li := a.limit; li != nil {
			b.limit.Name = li.name
			b.limit.RequestsPerUnit = reportedLimit(li)
			b.limit.Unit = li.unit
			if li.mult > 1 {
				b.mult.Value = li.mult
				b.limit.UnitMultiplier = &b.mult
			}
			st.CurrentLimit = &b.limit
		}
		if a.limit != nil || a.over {
			setDuration(&b.reset, a.reset)
			st.DurationUntilReset = &b.reset
		}
	}
	return resp
}

// reportedLimit is a limit's requests_per_unit as Envoy's proto carries it.
func reportedLimit(li *limitInfo) uint32 { return uint32(min(li.limit, math.MaxUint32)) }

func setDuration(d *durationpb.Duration, v time.Duration) {
	d.Seconds = int64(v / time.Second)
	d.Nanos = int32(v % time.Second)
}
