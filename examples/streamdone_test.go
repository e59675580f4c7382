package examples

import (
	"context"
	"strconv"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// streamRateLimits returns the named route and the two rate_limits of its
// RateLimitPerRoute config: the one sent when the request starts and the
// one sent when its stream is done (apply_on_stream_done).
func streamRateLimits(t *testing.T, f *envoyFacts, name string) (route *routev3.Route, start, done *routev3.RateLimit) {
	t.Helper()
	for _, r := range f.Routes {
		if r.GetName() != name {
			continue
		}
		per := new(ratelimitv3.RateLimitPerRoute)
		if err := r.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"].UnmarshalTo(per); err != nil {
			t.Fatalf("route %s: RateLimitPerRoute: %v", name, err)
		}
		for _, rl := range per.GetRateLimits() {
			if rl.GetApplyOnStreamDone() {
				done = rl
			} else {
				start = rl
			}
		}
		if start == nil || done == nil {
			t.Fatalf("route %s: want a request-phase and a stream-done rate limit, got %v", name, per.GetRateLimits())
		}
		return r, start, done
	}
	t.Fatalf("the example has no route %q", name)
	return nil, nil, nil
}

// streamCall sends rl's descriptor for req as Envoy does: hits_addend from
// its number or, for a format %RESP(header)%, from response's header, and
// its is_negative_hits. It logs the call and its answer (go test -v).
func (e *fakeEnvoy) streamCall(what, domain string, route *routev3.Route, rl *routev3.RateLimit, req downstream, response map[string]string) *rlsv3.RateLimitResponse {
	e.t.Helper()
	d := e.descriptor(rl, route.GetRoute().GetCluster(), req)
	if d == nil {
		e.t.Fatalf("%s: the request produces no descriptor", what)
	}
	ha := rl.GetHitsAddend()
	hits := uint64(1)
	if ha.GetNumber() != nil {
		hits = ha.GetNumber().GetValue()
	}
	if format := ha.GetFormat(); format != "" {
		header := strings.TrimSuffix(strings.TrimPrefix(format, "%RESP("), ")%")
		n, err := strconv.ParseUint(response[header], 10, 64)
		if err != nil {
			e.t.Fatalf("%s: hits_addend %q from %v: %v", what, format, response, err)
		}
		hits = n
	}
	d.HitsAddend = wrapperspb.UInt64(hits)
	d.IsNegativeHits = ha.GetIsNegativeHits()
	resp, err := e.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{d}})
	if err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
	s := resp.GetStatuses()[0]
	sign := ""
	if d.IsNegativeHits {
		sign = "-"
	}
	e.t.Logf("%-34s hits_addend %s%-7d -> %v, limit_remaining %d, duration_until_reset %v",
		what, sign, hits, resp.GetOverallCode(), s.GetLimitRemaining(), s.GetDurationUntilReset().AsDuration())
	return resp
}
