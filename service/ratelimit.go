package service

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/window"
)

// ReasonHeader is the response header that tells why a request was refused:
// ReasonCircuitOpen when a circuit breaker refused it, ReasonRateLimited when
// only rate limits did. It is added only to OVER_LIMIT answers.
const (
	ReasonHeader      = "x-ratelimit-reason"
	ReasonCircuitOpen = "circuit-open"
	ReasonRateLimited = "rate-limited"
)

// UnlimitedRemaining is the limit_remaining reported for an unlimited rule.
const UnlimitedRemaining = math.MaxUint32

// Errors of ShouldRateLimit that do not depend on the request.
var (
	errNoConfig = status.Error(codes.Unavailable, "no rate limit configuration loaded")
)

// LimiterError is the error ShouldRateLimit returns when the window.Limiter
// fails: gRPC Unavailable, or Canceled/DeadlineExceeded when the caller's
// own context ended, wrapping the cause. The code follows the caller's
// context, not the cause: a backend dial timeout wraps
// context.DeadlineExceeded although the caller still waits.
type LimiterError struct {
	Err  error
	code codes.Code
}

// newLimiterError wraps err, choosing the code from the caller's ctx.
func newLimiterError(ctx context.Context, err error) *LimiterError {
	code := codes.Unavailable
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		code = codes.Canceled
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	return &LimiterError{Err: err, code: code}
}

func (e *LimiterError) Error() string { return "rate limit backend: " + e.Err.Error() }

// Unwrap returns the limiter's error.
func (e *LimiterError) Unwrap() error { return e.Err }

// GRPCStatus maps the error to a gRPC status.
func (e *LimiterError) GRPCStatus() *status.Status {
	code := e.code
	if code == codes.OK {
		code = codes.Unavailable
	}
	return status.New(code, e.Error())
}

// descKind is how one descriptor of a request is answered.
type descKind uint8

const (
	kindNone      descKind = iota // no limit to check: no rule, a replaced rule, or only a breaker
	kindUnlimited                 // unlimited rule
	kindLimited                   // rule limits, checked by the limiter
	kindOverride                  // the descriptor's own limit
)

// plan is the evaluation of one request descriptor.
type plan struct {
	kind    descKind
	info    *ruleInfo // matched rule (nil when none)
	entries []descriptors.Entry
	hits    uint64
	refund  bool // is_negative_hits: hits are taken back, never refused
	first   int  // index of its first window.Request
	n       int  // number of window.Requests
	veto    bool

	shadow bool // the rule's shadow_mode applies
	quota  bool // the rule's quota_mode applies

	override   limitInfo // for kindOverride
	breakerOff bool      // the rule's breaker refused the request
	retryAfter time.Duration

	// Outcome.
	best int  // index of the reported window.Result, -1 if none
	over bool // some limit refused
}

// maxPooledDescriptors bounds the buffers kept for reuse: those of a larger
// request are left to the garbage collector.
const maxPooledDescriptors = 256

// scratch holds per-request buffers, pooled to avoid per-request allocation.
type scratch struct {
	entries []descriptors.Entry
	plans   []plan
	reqs    []window.Request
	keyBuf  []byte
	undoReq []window.Request
	undoRes []window.Result
}

func (sc *scratch) reset() {
	clear(sc.entries)
	sc.entries = sc.entries[:0]
	clear(sc.plans)
	sc.plans = sc.plans[:0]
	clear(sc.reqs)
	sc.reqs = sc.reqs[:0]
	clear(sc.undoReq)
	sc.undoReq = sc.undoReq[:0]
	clear(sc.undoRes)
	sc.undoRes = sc.undoRes[:0]
}

// ShouldRateLimit answers whether the request's descriptors are within their
// limits. Statuses are in request order. The overall code is OVER_LIMIT if
// any enforcing descriptor is over its limit or refused by a circuit breaker,
// or if every quota_mode descriptor of the request is over; global shadow
// mode then forces it to OK. Hits are recorded only for an admitted request
// (all-or-nothing): an OVER_LIMIT answer consumes no quota.
//
// Errors: InvalidArgument for a malformed request, Unavailable when no rules
// are loaded, a *LimiterError when the limiter fails.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := validate(req); err != nil {
		s.metrics.error(errTypeInvalid)
		return nil, err
	}
	st := s.state.Load()
	if st == nil {
		s.metrics.error(errTypeNoConfig)
		return nil, errNoConfig
	}
	domain := req.GetDomain()
	descs := req.GetDescriptors()
	if !st.set.HasDomain(domain) {
		s.metrics.notFound(domain)
		resp := allOK(len(descs))
		if s.metadata {
			resp.DynamicMetadata = dynamicMetadata(req, nil, resp.Statuses)
		}
		return resp, nil
	}

	sc := s.scratch.Get().(*scratch)
	defer func() {
		if cap(sc.plans) <= maxPooledDescriptors {
			sc.reset()
			s.scratch.Put(sc)
		}
	}()

	if err := s.plan(sc, st, req); err != nil {
		return nil, err
	}
	s.buildRequests(sc, domain)

	var results []window.Result
	if len(sc.reqs) > 0 {
		var err error
		results, err = s.limiter.Do(ctx, sc.reqs)
		if err == nil && len(results) != len(sc.reqs) {
			err = fmt.Errorf("limiter returned %d results for %d requests", len(results), len(sc.reqs))
		}
		if err != nil {
			s.metrics.error(errTypeLimiter)
			s.backendWarn.log(s.log, "rate limit backend failed", "domain", domain, "err", err)
			return nil, newLimiterError(ctx, err)
		}
	}

	over, reason := s.decide(sc, results)
	// Breakers are asked only for a request that will pass the rate limits,
	// so a half-open breaker never spends its probe on a request refused
	// anyway; a breaker's refusal then takes back the recorded hits.
	if (!over || s.shadow) && s.consultBreakers(sc) {
		over, reason = true, ReasonCircuitOpen
	}
	if err := s.undo(ctx, sc, results, over); err != nil {
		s.metrics.error(errTypeLimiter)
		s.backendWarn.log(s.log, "rate limit backend failed to undo hits", "domain", domain, "err", err)
		return nil, newLimiterError(ctx, err)
	}
	s.count(sc, st, domain, results)

	resp := s.respond(sc, results)
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	refused := over && !s.shadow
	if refused {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	} else if over {
		s.metrics.globalShadow.Inc()
	}
	s.addHeaders(sc, resp, refused, reason)
	if s.metadata {
		resp.DynamicMetadata = dynamicMetadata(req, sc.plans, resp.Statuses)
	}
	return resp, nil
}

// validate rejects malformed requests with InvalidArgument.
func validate(req *rlsv3.RateLimitRequest) error {
	if req.GetDomain() == "" {
		return status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	for i, d := range descs {
		entries := d.GetEntries()
		if len(entries) == 0 {
			return status.Errorf(codes.InvalidArgument, "rate limit descriptor %d has no entries", i)
		}
		for j, e := range entries {
			if e.GetKey() == "" {
				return status.Errorf(codes.InvalidArgument, "rate limit descriptor %d, entry %d: key must not be empty", i, j)
			}
		}
		if l := d.GetLimit(); l != nil {
			if l.GetUnit() == typev3.RateLimitUnit_UNKNOWN || descriptors.Unit(l.GetUnit()).Duration() == 0 {
				return status.Errorf(codes.InvalidArgument, "rate limit descriptor %d: limit override has unknown unit %v", i, l.GetUnit())
			}
			if m := l.GetUnitMultiplier(); m != nil && m.GetValue() == 0 {
				return status.Errorf(codes.InvalidArgument, "rate limit descriptor %d: limit override unit_multiplier must not be 0", i)
			}
		}
	}
	return nil
}

// allOK answers n descriptors OK with no limit.
func allOK(n int) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, n),
	}
	blocks := make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
	for i := range blocks {
		blocks[i].Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = &blocks[i]
	}
	return resp
}

// plan matches every descriptor to a rule and decides how it is answered,
// applying replaces.
func (s *Service) plan(sc *scratch, st *ruleState, req *rlsv3.RateLimitRequest) error {
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
	sc.entries = grow(sc.entries, n)
	for _, d := range descs {
		for _, e := range d.GetEntries() {
			sc.entries = append(sc.entries, descriptors.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
	}
	sc.plans = growPlans(sc.plans, len(descs))
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
		if r := st.set.Match(domain, p.entries); r != nil {
			p.info = st.info(s, r)
			if p.info.err != nil {
				s.metrics.error(errTypeConfig)
				return status.Errorf(codes.Internal, "rate limit rule %s cannot be served: %v", r.ID, p.info.err)
			}
			p.shadow = r.ShadowMode
			switch {
			case r.Unlimited:
				p.kind = kindUnlimited
			case len(p.info.limits) > 0:
				p.kind = kindLimited
				p.quota = r.QuotaMode
			}
		}
		if l := d.GetLimit(); l != nil {
			li, err := s.overrideLimit(l)
			if err != nil {
				s.metrics.error(errTypeInvalid)
				return status.Errorf(codes.InvalidArgument, "rate limit descriptor %d: limit override: %v", len(sc.plans), err)
			}
			p.kind = kindOverride
			p.override = li
			p.shadow, p.quota = false, false
		}
		sc.plans = append(sc.plans, p)
	}
	applyReplaces(sc.plans)
	return nil
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
	if u := lim.Unit.Duration(); u <= 0 || time.Duration(mult) > math.MaxInt64/u {
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
		ok, retry := s.breakers.Allow(p.info.rule, p.entries)
		if ok {
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
					sc.keyBuf = p.info.rule.AppendKey(sc.keyBuf[:0], p.entries)
					sc.keyBuf = append(sc.keyBuf, li.suffix...)
					key = string(sc.keyBuf)
				}
				sc.reqs = append(sc.reqs, window.Request{
					Key: key, Spec: li.spec, Limit: li.limit, Hits: hits, Veto: p.veto, Algorithm: li.alg, Negative: p.refund,
				})
			}
		case kindOverride:
			sc.keyBuf = appendOverrideKey(sc.keyBuf[:0], domain, p.entries, p.override.spec)
			sc.reqs = append(sc.reqs, window.Request{
				Key: string(sc.keyBuf), Spec: p.override.spec, Limit: p.override.limit, Hits: hits, Veto: p.veto, Negative: p.refund,
			})
		}
		p.n = len(sc.reqs) - p.first
	}
}

// appendOverrideKey appends the counter key of a descriptor limited by its
// own override: domain and entries, length-prefixed so that no two distinct
// descriptors share a key, and the window layout.
func appendOverrideKey(dst []byte, domain string, entries []descriptors.Entry, spec window.Spec) []byte {
	dst = append(dst, "\x00override\x00"...)
	dst = appendString(dst, domain)
	for _, e := range entries {
		dst = appendString(dst, e.Key)
		dst = appendString(dst, e.Value)
	}
	dst = append(dst, 'w')
	dst = appendUint(dst, uint64(spec.Length()))
	dst = append(dst, '/')
	return appendUint(dst, uint64(spec.Buckets()))
}

func appendString(dst []byte, s string) []byte {
	dst = appendUint(dst, uint64(len(s)))
	dst = append(dst, ':')
	return append(dst, s...)
}

func appendUint(dst []byte, v uint64) []byte {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	return append(dst, b[i:]...)
}

// decide picks each descriptor's reported result and computes the overall
// rate-limit outcome before breakers and global shadow mode.
func (s *Service) decide(sc *scratch, results []window.Result) (over bool, reason string) {
	quotaTotal, quotaOver := 0, 0
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
		case p.shadow:
		case p.quota:
			quotaTotal++
			if p.over {
				quotaOver++
			}
		case p.over:
			over = true
		}
	}
	if quotaTotal > 0 && quotaOver == quotaTotal {
		over = true
	}
	if over {
		return true, ReasonRateLimited
	}
	return false, ""
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
// request is refused overall without a veto having prevented recording (all
// quota descriptors over, or a circuit breaker open), every recorded hit.
func (s *Service) undo(ctx context.Context, sc *scratch, results []window.Result, over bool) error {
	all := over && !s.shadow
	for i := range sc.plans {
		p := &sc.plans[i]
		if !all && !(p.over && !p.veto) {
			continue
		}
		for j := p.first; j < p.first+p.n; j++ {
			r := &results[j]
			if !r.Recorded {
				continue
			}
			sc.undoReq = append(sc.undoReq, sc.reqs[j])
			sc.undoRes = append(sc.undoRes, *r)
			// Report the quota as if the hits had not been recorded. The
			// reset stays an upper bound (the undone hits were the newest),
			// except that a window left empty has nothing to age out.
			r.Recorded = false
			r.Remaining = min(r.Remaining+sc.reqs[j].Hits, sc.reqs[j].Limit)
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
		case p.info != nil:
			if p.info.counters != nil {
				c = p.info.counters
			} else {
				c = p.info.detailed.get(p.info.rule.MetricKey(p.entries))
			}
		case p.kind == kindOverride:
			if c = st.overrides[domain]; c == nil {
				c = s.metrics.overrideCounters(domain)
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

// respond builds the descriptor statuses.
func (s *Service) respond(sc *scratch, results []window.Result) *rlsv3.RateLimitResponse {
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
		p := &sc.plans[i]
		b := &blocks[i]
		st := &b.status
		resp.Statuses[i] = st
		st.Code = rlsv3.RateLimitResponse_OK
		switch p.kind {
		case kindUnlimited:
			st.LimitRemaining = UnlimitedRemaining
		case kindLimited, kindOverride:
			li := &p.override
			if p.kind == kindLimited {
				li = &p.info.limits[p.best-p.first]
			}
			r := &results[p.best]
			b.limit.Name = li.name
			b.limit.RequestsPerUnit = uint32(min(li.limit, math.MaxUint32))
			b.limit.Unit = li.unit
			if li.mult > 1 {
				b.mult.Value = li.mult
				b.limit.UnitMultiplier = &b.mult
			}
			st.CurrentLimit = &b.limit
			st.LimitRemaining = uint32(min(r.Remaining, math.MaxUint32))
			setDuration(&b.reset, r.Reset)
			st.DurationUntilReset = &b.reset
			if p.over && !p.shadow {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
		}
		if p.breakerOff && !p.shadow {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			reset := p.retryAfter
			if p.over && p.best >= 0 {
				reset = max(reset, results[p.best].Reset)
			}
			setDuration(&b.reset, reset)
			st.DurationUntilReset = &b.reset
		}
	}
	return resp
}

func setDuration(d *durationpb.Duration, v time.Duration) {
	d.Seconds = int64(v / time.Second)
	d.Nanos = int32(v % time.Second)
}

func grow(s []descriptors.Entry, n int) []descriptors.Entry {
	if cap(s) < n {
		return make([]descriptors.Entry, 0, n)
	}
	return s[:0]
}

func growPlans(s []plan, n int) []plan {
	if cap(s) < n {
		return make([]plan, 0, n)
	}
	return s[:0]
}
