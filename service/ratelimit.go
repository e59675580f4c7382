package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/envoyhdr"
	"github.com/leapgate/leapgate/window"
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
	probes  []uint64 // ids of the probes half-open breakers admitted
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
	sc.probes = sc.probes[:0]
}

// ShouldRateLimit answers whether the request's descriptors are within their
// limits. Statuses are in request order; a descriptor over a limit is
// OVER_LIMIT, in quota mode (quota_mode, QUOTA_MODE) too, but not in shadow
// mode. The overall code is OVER_LIMIT, as envoyproxy/ratelimit answers it,
// if a descriptor neither in shadow nor in quota mode is over its limit or
// refused by a circuit breaker, or if the request has descriptors in quota
// mode and every one of them is over (a soft limit: quota-aware routing
// sends the request where some quota is left); global shadow mode then
// forces it to OK. Hits are recorded only for an admitted request
// (all-or-nothing): an OVER_LIMIT answer consumes no quota. An admitted request that is a half-open
// breaker's probe carries the probe ids to the upstream in
// request_headers_to_add (envoyhdr.ProbeHeader), so that its reported
// outcome is matched to the probe.
//
// Every descriptor is answered on its own terms, so that no descriptor can
// turn the others' answers into an error (which Envoy, by default, lets
// through):
//   - an unknown or empty domain, a descriptor with no entries, an entry
//     with an empty key, or more entries than any rule is deep matches no
//     rule: OK with no limit (a limit override still applies);
//   - a value of any length or bytes (invalid UTF-8 included) is matched and
//     keyed like any other (descriptors.Rule.AppendKey keys long values by
//     their digest);
//   - a limit override that cannot be laid out (unknown unit, multiplier 0,
//     a window too long) is ignored: the descriptor is answered by its rule;
//   - a matched rule that cannot be served (see CheckRules) answers
//     OVER_LIMIT, so a broken rule lifts no limit.
//
// A request with more than Options.MaxDescriptors descriptors is answered
// OVER_LIMIT for every descriptor without being counted, and counted in
// leapgate_requests_refused_total. A nil request is an empty one.
//
// Errors: Unavailable when no rules are loaded, a *LimiterError when the
// limiter fails.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	st := s.state.Load()
	if st == nil {
		s.metrics.error(errTypeNoConfig)
		return nil, errNoConfig
	}
	domain := req.GetDomain()
	descs := req.GetDescriptors()
	if len(descs) > s.maxDescriptors {
		return s.refuseOversized(req), nil
	}
	if !st.set.HasDomain(domain) {
		s.metrics.domainNotFound.inc(domain)
		s.domainWarn.Warn(s.log, "request for a domain no rule file defines; answered OK",
			"domain", loggable(domain), "descriptors", len(descs))
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

	s.plan(sc, st, req)
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
			s.backendWarn.Warn(s.log, "rate limit backend failed", "domain", domain, "err", err)
			return nil, newLimiterError(ctx, err)
		}
	}

	over, reason := s.decide(sc, results)
	// Breakers are asked only for a request that will pass the rate limits,
	// so a half-open breaker never spends its probe on a request refused
	// anyway; a breaker's refusal then takes back the recorded hits.
	if (!over || s.shadow) && s.consultBreakers(sc) {
		over, reason = true, envoyhdr.ReasonCircuitOpen
	}
	if err := s.undo(ctx, sc, results, over); err != nil {
		s.metrics.error(errTypeLimiter)
		s.backendWarn.Warn(s.log, "rate limit backend failed to undo hits", "domain", domain, "err", err)
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
	if !refused && len(sc.probes) > 0 {
		resp.RequestHeadersToAdd = append(resp.RequestHeadersToAdd,
			&corev3.HeaderValue{Key: envoyhdr.ProbeHeader, Value: envoyhdr.FormatProbes(sc.probes)})
	}
	if refused && s.log.Enabled(ctx, slog.LevelDebug) {
		s.decisions.refused(ctx, s.log, domain, sc, reason)
	}
	if s.metadata {
		resp.DynamicMetadata = dynamicMetadata(req, sc.plans)
	}
	return resp, nil
}

// refuseOversized answers a request with more descriptors than the service
// takes: every descriptor OVER_LIMIT (OK overall in global shadow mode),
// nothing counted.
func (s *Service) refuseOversized(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	n := len(req.GetDescriptors())
	s.metrics.refused.WithLabelValues(refusedTooManyDescriptors).Inc()
	s.inputWarn.Warn(s.log, "request with too many descriptors answered OVER_LIMIT",
		"domain", loggable(req.GetDomain()), "descriptors", n, "max", s.maxDescriptors)
	resp := allOK(n)
	for _, st := range resp.Statuses {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if s.shadow {
		s.metrics.globalShadow.Inc()
	} else {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return resp
}

// maxLoggedBytes caps a caller-chosen string in a log line.
const maxLoggedBytes = 256

// loggable is a caller-chosen string as it may appear in a log line: valid
// UTF-8, at most maxLoggedBytes long.
func loggable(v string) string {
	if len(v) > maxLoggedBytes {
		v = v[:maxLoggedBytes] + "…"
	}
	return strings.ToValidUTF8(v, "\uFFFD")
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
