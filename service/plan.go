package service

import (
	"errors"
	"fmt"
	"iter"
	"math"
	"slices"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/window"
)

// descKind is how one descriptor of a request is answered.
type descKind uint8

const (
	kindNone      descKind = iota // no limit to check: no rule, a replaced rule, or only a breaker
	kindUnlimited                 // unlimited rule
	kindLimited                   // rule limits, checked by the limiter
	kindOverride                  // the descriptor's own limit
	kindBroken                    // matched rule cannot be served: OVER_LIMIT
)

// answer is the decision for one descriptor, from which its status, the
// response headers and the dynamic metadata are all built.
type answer struct {
	over      bool       // OVER_LIMIT
	limit     *limitInfo // the limit reported (current_limit), nil for none
	remaining uint32     // limit_remaining
	reset     time.Duration
}

// plan is the evaluation of one request descriptor.
type plan struct {
	kind    descKind
	info    *ruleInfo // matched rule (nil when none)
	entries []descriptors.Entry
	hits    uint64
	refund  bool   // is_negative_hits: hits are taken back, never refused
	holder  string // the request holding concurrency slots (descriptors.Set.MatchHolder)
	first   int    // index of its first window.Request
	n       int    // number of window.Requests
	veto    bool

	shadow bool // the rule's shadow_mode applies
	quota  bool // quota mode (the rule's quota_mode or QUOTA_MODE) applies

	override   limitInfo // for kindOverride
	breakerOff bool      // the rule's breaker refused the request
	retryAfter time.Duration

	// Outcome.
	best int  // index of the reported window.Result, -1 if none
	over bool // some limit refused

	answer answer // what the descriptor's status says; set by conclude
}

// plan matches every descriptor to a rule and decides how it is answered,
// applying replaces. Each descriptor is planned on its own: nothing one
// descriptor holds changes another's plan (see ShouldRateLimit).
func (s *Service) plan(sc *scratch, st *ruleState, req *rlsv3.RateLimitRequest) {
	descs := req.GetDescriptors()
	defaultHits := uint64(req.GetHitsAddend())
	if defaultHits == 0 {
		defaultHits = 1
	}
	// Convert all entries into one pooled buffer first; slices into it are
	// taken afterwards because append may move it.
	n := 0
	for _, d := range descs {
		n += len(d.GetEntries())
	}
	sc.entries = slices.Grow(sc.entries[:0], n)
	for _, d := range descs {
		for _, e := range d.GetEntries() {
			sc.entries = append(sc.entries, descriptors.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
	}
	sc.plans = slices.Grow(sc.plans[:0], len(descs))
	off := 0
	domain := req.GetDomain()
	for _, d := range descs {
		ne := len(d.GetEntries())
		p := plan{entries: sc.entries[off : off+ne : off+ne], hits: defaultHits, best: -1}
		off += ne
		if h := d.GetHitsAddend(); h != nil {
			p.hits = h.GetValue()
		}
		p.refund = d.GetIsNegativeHits()
		r, depth, holder := st.set.MatchHolder(domain, p.entries)
		if r != nil {
			p.entries, p.holder = p.entries[:depth], holder
			p.info = st.info(s, r)
			p.shadow = r.ShadowMode
			switch {
			case p.info.err != nil:
				s.metrics.refused.WithLabelValues(refusedBrokenRule).Inc()
				s.inputWarn.Warn(s.log, "rate limit rule cannot be served; descriptor answered OVER_LIMIT",
					"rule", r.ID, "file", r.File, "line", r.Line, "err", p.info.err)
				p.kind, p.over, p.shadow = kindBroken, true, false
			case r.Unlimited:
				p.kind = kindUnlimited
			case len(p.info.limits) > 0:
				p.kind = kindLimited
				p.quota = r.QuotaMode || s.quota
			}
		}
		if l := d.GetLimit(); l != nil && p.kind != kindBroken {
			if li, err := s.overrideLimit(l); err != nil {
				s.metrics.refused.WithLabelValues(refusedBadOverride).Inc()
				s.inputWarn.Warn(s.log, "descriptor limit override ignored; answered by its rule",
					"domain", loggable(domain), "descriptor", len(sc.plans), "err", err)
			} else {
				p.kind = kindOverride
				p.override = li
				p.shadow, p.quota = false, s.quota
			}
		}
		sc.plans = append(sc.plans, p)
	}
	applyReplaces(sc.plans)
}

// overrideLimit turns a descriptor's own limit into a limitInfo.
func (s *Service) overrideLimit(l *rlcommonv3.RateLimitDescriptor_RateLimitOverride) (limitInfo, error) {
	mult := uint32(1)
	if m := l.GetUnitMultiplier(); m != nil {
		mult = m.GetValue()
	}
	lim := descriptors.Limit{
		RequestsPerUnit: l.GetRequestsPerUnit(),
		Unit:            descriptors.Unit(l.GetUnit()),
		UnitMultiplier:  mult,
	}
	if lim.Unit.Duration() == 0 {
		return limitInfo{}, fmt.Errorf("unknown unit %v", l.GetUnit())
	}
	if mult == 0 {
		return limitInfo{}, errors.New("unit_multiplier must not be 0")
	}
	if u := lim.Unit.Duration(); time.Duration(mult) > math.MaxInt64/u {
		return limitInfo{}, fmt.Errorf("window of %d × %v is too long", mult, l.GetUnit())
	}
	spec, err := window.NewSpec(lim.Window(), s.buckets)
	if err != nil {
		return limitInfo{}, err
	}
	return limitInfo{
		spec:  spec,
		limit: uint64(lim.RequestsPerUnit),
		unit:  rlsv3.RateLimitResponse_RateLimit_Unit(lim.Unit),
		mult:  mult,
	}, nil
}

// applyReplaces drops every matched rule one of whose limits is named in the
// replaces list of another matched rule of the request. Descriptors with their
// own limit override neither replace nor are replaced.
func applyReplaces(plans []plan) {
	replacing := false
	for i := range plans {
		if ruleApplies(&plans[i]) && len(plans[i].info.rule.Replaces) > 0 {
			replacing = true
			break
		}
	}
	if !replacing {
		return
	}
	dropped := make([]bool, len(plans))
	for i := range plans {
		p := &plans[i]
		if !ruleApplies(p) {
			continue
		}
		for j := range plans {
			q := &plans[j]
			if !ruleApplies(q) || q.info.rule == p.info.rule || len(q.info.rule.Replaces) == 0 {
				continue
			}
			if replaces(q.info, p.info) {
				dropped[i] = true
				break
			}
		}
	}
	for i, d := range dropped {
		if d {
			plans[i] = plan{entries: plans[i].entries, hits: plans[i].hits, best: -1}
		}
	}
}

// concurrencyLimits yields the indexes in p.info.limits of the matched
// rule's concurrency_limit limits (none without a rule): what a limit
// override keeps of its rule.
func (p *plan) concurrencyLimits() iter.Seq[int] {
	return func(yield func(int) bool) {
		if p.info == nil {
			return
		}
		for j := range p.info.limits {
			if p.info.limits[j].alg == window.Concurrency && !yield(j) {
				return
			}
		}
	}
}

// limitOf returns the limit behind the descriptor's request p.first+j: the
// rule's j-th limit, or, for a limit override, the override (j == 0) and
// then the rule's concurrency limits it keeps, in order.
func (p *plan) limitOf(j int) *limitInfo {
	if p.kind != kindOverride {
		return &p.info.limits[j]
	}
	for k := range p.concurrencyLimits() {
		if j--; j == 0 {
			return &p.info.limits[k]
		}
	}
	return &p.override
}

// ruleApplies reports whether a descriptor is answered by its matched rule.
func ruleApplies(p *plan) bool { return p.info != nil && p.kind != kindOverride }

// replaces reports whether rule a replaces a (named) limit of rule b.
func replaces(a, b *ruleInfo) bool {
	for _, name := range a.rule.Replaces {
		for _, n := range b.names {
			if n == name {
				return true
			}
		}
	}
	return false
}

// buildRequests appends one window.Request per limit of every limited
// descriptor.
func (s *Service) buildRequests(sc *scratch, domain string) {
	for i := range sc.plans {
		p := &sc.plans[i]
		p.first = len(sc.reqs)
		hits := p.hits
		// Global shadow mode lets the request through whatever happens, so
		// no descriptor vetoes the others' hits.
		p.veto = !p.shadow && !p.quota && !s.shadow && !p.refund
		switch p.kind {
		case kindLimited:
			for j := range p.info.limits {
				li := &p.info.limits[j]
				key := li.key
				if !p.info.constKey {
					sc.keyBuf = p.info.rule.AppendCounterKey(sc.keyBuf[:0], p.entries, li.index)
					key = string(sc.keyBuf)
				}
				sc.reqs = append(sc.reqs, window.Request{
					Key: key, Spec: li.spec, Limit: li.limit, Hits: hits, Veto: p.veto, Algorithm: li.alg, Negative: p.refund,
					ChargeAlways: li.charge && !p.refund, Holder: p.holder,
				})
			}
		case kindOverride:
			sc.keyBuf = descriptors.AppendOverrideKey(sc.keyBuf[:0], domain, p.entries, p.override.spec)
			sc.reqs = append(sc.reqs, window.Request{
				Key: string(sc.keyBuf), Spec: p.override.spec, Limit: p.override.limit, Hits: hits, Veto: p.veto, Negative: p.refund,
			})
			// The override replaces the rule's rate limits, not its cap on
			// requests in flight.
			for j := range p.concurrencyLimits() {
				li := &p.info.limits[j]
				sc.keyBuf = p.info.rule.AppendCounterKey(sc.keyBuf[:0], p.entries, li.index)
				sc.reqs = append(sc.reqs, window.Request{
					Key: string(sc.keyBuf), Spec: li.spec, Limit: li.limit, Hits: hits, Veto: p.veto, Algorithm: li.alg,
					Negative: p.refund, Holder: p.holder,
				})
			}
		}
		p.n = len(sc.reqs) - p.first
	}
}
