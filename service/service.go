// Package service answers Envoy's rate-limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) from the
// loaded descriptor rules, a window.Limiter and, optionally, circuit breakers.
//
// # Sliding-window answers
//
// Each descriptor status reports, for the most constraining limit of its
// rule (an over-limit one if any, else the one with the least quota left):
//
//   - limit_remaining: the quota left now, in any window of the limit's
//     length ending now, after this request's hits if they were recorded.
//   - duration_until_reset, when OVER_LIMIT: the time until enough old hits
//     have aged out of the sliding window that this same request would pass
//     (an honest Retry-After; for a circuit breaker, the time until it
//     half-opens).
//   - duration_until_reset, when OK: the time until every hit now counted has
//     aged out, i.e. until the full quota is available again (0 when nothing
//     is counted).
//
// For sliding_log limits (an exact log of the hits: no bucket granularity)
// the remaining quota and both resets are exact to the nanosecond.
// For token_bucket limits the remaining quota is the tokens left and the
// reset is the exact refill time; for fixed_window limits the reset is the
// end of the current window.
//
// # One batch per request
//
// All limits of all descriptors of a request go to the limiter in one
// Limiter.Do call, all-or-nothing: when an enforcing descriptor is over its
// limit no hit of the request is recorded. An OVER_LIMIT answer therefore
// consumes no quota: clients hammering a limit do not extend their own block
// and do not drain the other limits of their requests. Circuit breakers are
// asked only for requests the rate limits admit, and a breaker's refusal
// takes the recorded hits back.
package service

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/logthrottle"
	"github.com/leapgate/leapgate/window"
)

// DefaultNearLimitRatio is the fraction of a limit above which admitted hits
// are counted as near_limit, as NEAR_LIMIT_RATIO in envoyproxy/ratelimit.
const DefaultNearLimitRatio = 0.8

// DefaultMaxDescriptors is the default of Options.MaxDescriptors.
const DefaultMaxDescriptors = 64

// Options configure a Service.
type Options struct {
	// Limiter admits the hits of every request; required.
	Limiter window.Limiter
	// Checker says which requests the backend serves; CheckRules refuses
	// every limit whose requests it refuses. If nil,
	// window.CheckerOf(Limiter). (`check-config` sets it to the configured
	// backend's checker, which needs no connection.)
	Checker window.RequestChecker
	// Breakers are consulted for rules with a circuit breaker; nil means
	// no breakers.
	Breakers Breakers
	// Registry receives the service's metrics; required (there is no global
	// registry).
	Registry *prometheus.Registry
	// Logger logs configuration problems and limiter failures; nil discards.
	Logger *slog.Logger
	// Clock times the decision log's budget of lines a second; if nil,
	// window.NewMonotonicClock(). (Windows are timed by the Limiter's own
	// clock.)
	Clock window.Clock
	// ShadowMode (SHADOW_MODE) forces the overall code to OK; descriptor
	// statuses still say OVER_LIMIT where a limit is exceeded.
	ShadowMode bool
	// QuotaMode (QUOTA_MODE) puts every limited descriptor in quota mode,
	// as the rule option quota_mode does for one.
	QuotaMode bool
	// DefaultBuckets (WINDOW_BUCKETS) lays out the windows of the limits
	// that requests set themselves (a descriptor's limit override), in
	// their counter keys; window.DefaultBuckets if 0. It must divide one
	// second exactly so that every unit's window can be laid out. (Rule
	// limits come laid out by the loader: descriptors.Limit.Spec.)
	DefaultBuckets int
	// NearLimitRatio is the fraction of a limit above which admitted hits
	// count as near_limit (DefaultNearLimitRatio if 0).
	NearLimitRatio float64
	// ResponseHeaders (LIMIT_RESPONSE_HEADERS_ENABLED) selects the
	// rate-limit headers added to every answer with a limit: HeadersOff,
	// HeadersDraft03 or HeadersDraft11 (which adds Retry-After to
	// refusals).
	ResponseHeaders HeaderMode
	// RefusalHeaders (REFUSAL_HEADERS) adds envoyhdr.ReasonHeader and Retry-After to
	// every refusal. A circuit breaker's refusal carries both regardless.
	RefusalHeaders bool
	// LimitHeader, RemainingHeader and ResetHeader name the HeadersDraft03
	// headers (LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER,
	// LIMIT_RESET_HEADER); empty means DefaultLimitHeader and so on.
	LimitHeader, RemainingHeader, ResetHeader string
	// DynamicMetadata (RESPONSE_DYNAMIC_METADATA) fills the response's
	// dynamic_metadata as envoyproxy/ratelimit does, with the metadata of
	// the matched rules of the descriptors answered OK under "metadata"
	// (see dynamicMetadata).
	DynamicMetadata bool
	// MaxDescriptors is the most descriptors one request may carry
	// (MAX_DESCRIPTORS_PER_REQUEST; DefaultMaxDescriptors if 0): a request
	// with more is answered OVER_LIMIT for every descriptor.
	MaxDescriptors int
	// MaxDetailedKeys caps the distinct metric keys of one rule with
	// detailed_metric or value_to_metric (DefaultMaxDetailedKeys if 0);
	// further values are counted under OverflowLabel.
	MaxDetailedKeys int
}

// Service implements rlsv3.RateLimitServiceServer. It is safe for concurrent
// use; rules are swapped atomically with SetRules.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	limiter  window.Limiter
	checker  window.RequestChecker
	breakers Breakers
	log      *slog.Logger
	// backendWarn keeps a backend outage from logging once per request;
	// domainWarn and inputWarn do the same for unknown domains and for
	// input not taken as sent.
	backendWarn logthrottle.Throttle
	domainWarn  logthrottle.Throttle
	inputWarn   logthrottle.Throttle
	decisions   decisionLog // refused descriptors, at debug level
	// maxDescriptors bounds the descriptors of one request.
	maxDescriptors int
	shadow         bool
	quota          bool // QUOTA_MODE: every limited descriptor in quota mode
	buckets        int
	nearRatio      float64
	metrics        *metrics

	headers        HeaderMode
	headerNames    headerNames
	refusalHeaders bool // REFUSAL_HEADERS: reason and Retry-After on every refusal
	metadata       bool

	reload  sync.Mutex // serializes SetRules
	state   atomic.Pointer[ruleState]
	scratch sync.Pool // *scratch
}

// New returns a Service with no rules loaded (it answers Unavailable until
// SetRules is called).
func New(opts Options) (*Service, error) {
	if opts.Limiter == nil {
		return nil, errors.New("service: Options.Limiter is required")
	}
	if opts.Registry == nil {
		return nil, errors.New("service: Options.Registry is required")
	}
	buckets := opts.DefaultBuckets
	if buckets == 0 {
		buckets = window.DefaultBuckets
	}
	if _, err := window.NewSpec(time.Second, buckets); err != nil {
		return nil, fmt.Errorf("service: default bucket count: %w", err)
	}
	ratio := opts.NearLimitRatio
	if ratio == 0 {
		ratio = DefaultNearLimitRatio
	}
	if ratio < 0 || ratio > 1 {
		return nil, fmt.Errorf("service: near-limit ratio %v must be in (0, 1]", ratio)
	}
	maxDetailed := opts.MaxDetailedKeys
	if maxDetailed <= 0 {
		maxDetailed = DefaultMaxDetailedKeys
	}
	if !opts.ResponseHeaders.valid() {
		return nil, fmt.Errorf("service: response header mode %q is not one of %q, %q, %q",
			opts.ResponseHeaders, HeadersOff, HeadersDraft03, HeadersDraft11)
	}
	names := headerNames{
		limit:     cmp.Or(opts.LimitHeader, DefaultLimitHeader),
		remaining: cmp.Or(opts.RemainingHeader, DefaultRemainingHeader),
		reset:     cmp.Or(opts.ResetHeader, DefaultResetHeader),
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(opts.Registry, maxDetailed)
	if err != nil {
		return nil, fmt.Errorf("service: registering metrics: %w", err)
	}
	if opts.Checker == nil {
		opts.Checker = window.CheckerOf(opts.Limiter)
	}
	maxDescs := opts.MaxDescriptors
	if maxDescs <= 0 {
		maxDescs = DefaultMaxDescriptors
	}
	s := &Service{
		maxDescriptors: maxDescs,
		limiter:        opts.Limiter,
		checker:        opts.Checker,
		breakers:       opts.Breakers,
		log:            log,
		shadow:         opts.ShadowMode,
		quota:          opts.QuotaMode,
		buckets:        buckets,
		nearRatio:      ratio,
		metrics:        m,

		headers:        opts.ResponseHeaders,
		headerNames:    names,
		refusalHeaders: opts.RefusalHeaders,
		metadata:       opts.DynamicMetadata,
	}
	s.decisions.clock = opts.Clock
	if s.decisions.clock == nil {
		s.decisions.clock = window.NewMonotonicClock()
	}
	s.scratch.New = func() any { return new(scratch) }
	return s, nil
}

// SetRules atomically replaces the rule set; nil unloads every rule (the
// service then answers Unavailable). Rules that cannot be served (see
// CheckRules) are logged and answer OVER_LIMIT; validate with CheckRules
// first to keep the previous set instead.
func (s *Service) SetRules(set *descriptors.Set) {
	s.reload.Lock()
	defer s.reload.Unlock()
	if set == nil {
		s.state.Store(nil)
		return
	}
	st := s.prepare(set)
	for _, info := range st.rules {
		if info.err != nil {
			s.log.Error("rate limit rule cannot be served", "rule", info.rule.ID,
				"file", info.rule.File, "line", info.rule.Line, "err", info.err)
		}
		if info.metadataErr != nil {
			s.log.Warn("rate limit rule metadata is not representable in dynamic metadata; ignored",
				"rule", info.rule.ID, "file", info.rule.File, "line", info.rule.Line, "err", info.metadataErr)
		}
	}
	if old := s.state.Swap(st); old != nil {
		s.dropRemovedSeries(old, st)
	}
}

// dropRemovedSeries deletes the metric series of rules that a reload
// removed, so that the exported series follow the rules in use.
func (s *Service) dropRemovedSeries(old, cur *ruleState) {
	kept := make(map[[2]string]bool, len(cur.rules))
	for r := range cur.rules {
		kept[[2]string{r.Domain, r.ID}] = true
	}
	for r, info := range old.rules {
		if info.counters != nil && !kept[[2]string{r.Domain, r.ID}] {
			s.metrics.deleteSeries(r.Domain, r.ID)
		}
	}
}

// Rules returns the rule set in use, nil if none is loaded.
func (s *Service) Rules() *descriptors.Set {
	if st := s.state.Load(); st != nil {
		return st.set
	}
	return nil
}

// CheckRules reports every rule of set that this service cannot serve as
// written, as errors.Join of *descriptors.Error; nil when the whole set can
// be served: a limit whose requests the backend refuses (Options.Checker:
// an algorithm it does not serve, a bucket length it cannot represent), or
// (with DynamicMetadata) metadata that has no protobuf Struct form. Limits
// no window can lay out or no algorithm can enforce (window.CheckLimit)
// never reach a Set: the loader refuses them with their file and line.
func (s *Service) CheckRules(set *descriptors.Set) error {
	if set == nil {
		return nil
	}
	var errs []error
	for _, r := range set.Rules() {
		info := s.newRuleInfo(r)
		if info.err != nil {
			errs = append(errs, &descriptors.Error{File: r.File, Line: r.Line, Reason: info.err.Error()})
		}
		if s.metadata && info.metadataErr != nil {
			errs = append(errs, &descriptors.Error{File: r.File, Line: r.Line,
				Reason: fmt.Sprintf("metadata cannot be returned as dynamic metadata: %v", info.metadataErr)})
		}
	}
	return errors.Join(errs...)
}

// ruleState is a rule set with what the service precomputes per rule.
type ruleState struct {
	set       *descriptors.Set
	rules     map[*descriptors.Rule]*ruleInfo
	overrides map[string]*detailedCounters // by domain: descriptors limited by their own override
}

func (s *Service) prepare(set *descriptors.Set) *ruleState {
	rules := set.Rules()
	st := &ruleState{
		set:       set,
		rules:     make(map[*descriptors.Rule]*ruleInfo, len(rules)),
		overrides: make(map[string]*detailedCounters),
	}
	for _, r := range rules {
		st.rules[r] = s.newRuleInfo(r)
	}
	for _, d := range set.Domains() {
		st.overrides[d] = s.metrics.overrideCounters(d)
	}
	return st
}

// info returns the precomputed data of a matched rule (computed on the spot,
// uncached, for a rule the set did not list).
func (st *ruleState) info(s *Service, r *descriptors.Rule) *ruleInfo {
	if info, ok := st.rules[r]; ok {
		return info
	}
	return s.newRuleInfo(r)
}

// ruleInfo is what the service precomputes for one rule.
type ruleInfo struct {
	rule     *descriptors.Rule
	names    []string // names of the rule's limits, targets of replaces
	limits   []limitInfo
	err      error // the backend cannot serve a limit of the rule
	constKey bool  // the counter keys do not depend on request values
	counters *ruleCounters
	detailed *detailedCounters // non-nil for detailed_metric/value_to_metric

	metadata    *structpb.Struct // the rule's metadata, nil if none
	metadataErr error            // why the metadata could not be converted
}

// limitInfo is one limit of a rule, ready to be checked.
type limitInfo struct {
	spec   window.Spec
	limit  uint64
	index  int    // of the limit in its rule (descriptors.Rule.AppendCounterKey)
	key    string // the full counter key when the rule's key is constant
	name   string
	unit   rlsv3.RateLimitResponse_RateLimit_Unit
	mult   uint32 // unit multiplier reported in current_limit (0 or 1: not reported)
	alg    window.Algorithm
	charge bool // descriptors.Limit.ChargeAlways
}

func (s *Service) newRuleInfo(r *descriptors.Rule) *ruleInfo {
	info := &ruleInfo{rule: r, names: r.Names(), constKey: !r.Varies()}
	if r.MetricVaries() {
		info.detailed = s.metrics.detailedFor(r.Domain, r.ID)
	} else {
		info.counters = s.metrics.counters(r.Domain, r.ID)
	}
	if len(r.Metadata) > 0 {
		info.metadata, info.metadataErr = structpb.NewStruct(r.Metadata)
	}
	if r.Unlimited {
		return info
	}
	for i, l := range r.Limits {
		alg := l.Algorithm
		li := limitInfo{
			spec:   l.Spec,
			limit:  uint64(l.RequestsPerUnit),
			index:  i,
			name:   l.Name,
			unit:   rlsv3.RateLimitResponse_RateLimit_Unit(l.Unit),
			mult:   l.UnitMultiplier,
			alg:    alg,
			charge: l.ChargeAlways,
		}
		if err := s.checker.CheckRequest(&window.Request{Spec: l.Spec, Limit: li.limit, Algorithm: alg, ChargeAlways: li.charge}); err != nil {
			info.err = fmt.Errorf("rule %s, limit %d: the rate-limit backend cannot serve it: %w", r.ID, i+1, err)
			info.limits = nil
			return info
		}
		if info.constKey {
			li.key = string(r.AppendCounterKey(nil, r.Path, i))
		}
		info.limits = append(info.limits, li)
	}
	return info
}
