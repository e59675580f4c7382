package service

import (
	"context"
	"errors"
	"fmt"
	"math"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
			resp.DynamicMetadata = dynamicMetadata(req, nil)
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

	s.conclude(sc, results)
	resp := s.respond(sc)
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	refused := over && !s.shadow
	if refused {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	} else if over {
		s.metrics.globalShadow.Inc()
	}
	s.addHeaders(sc, resp, refused, reason)
	if s.metadata {
		resp.DynamicMetadata = dynamicMetadata(req, sc.plans)
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
