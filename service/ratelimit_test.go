package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/leapgate/leapgate/internal/envoyhdr"
	"github.com/leapgate/leapgate/window"

	"github.com/leapgate/leapgate/internal/testclock"
)

// step is one call at a fake instant and its expected answer.
type step struct {
	at       time.Duration
	req      *rlsv3.RateLimitRequest
	overall  rlsv3.RateLimitResponse_Code
	statuses []*dstatus
	reason   string // expected x-ratelimit-reason header; "" for none
}

func TestShouldRateLimit(t *testing.T) {
	const ms = time.Millisecond
	exact3 := lim(3, second, "exact3")
	tests := []struct {
		name   string
		opts   func(*Options)
		refuse map[string]time.Duration // breaker refusals by rule ID
		steps  []step
	}{
		{
			name: "exact rule counts and refuses, reset is the honest retry time",
			steps: []step{
				{at: 0, req: req("test", desc("k", "exact")), overall: codeOK, statuses: []*dstatus{wantOK(exact3, 2, 1100*ms)}},
				{at: 0, req: req("test", desc("k", "exact")), overall: codeOK, statuses: []*dstatus{wantOK(exact3, 1, 1100*ms)}},
				{at: 50 * ms, req: req("test", desc("k", "exact")), overall: codeOK, statuses: []*dstatus{wantOK(exact3, 0, 1050*ms)}},
				{at: 60 * ms, req: req("test", desc("k", "exact")), overall: codeOver, reason: envoyhdr.ReasonRateLimited,
					statuses: []*dstatus{wantOver(exact3, 0, 1040*ms)}},
				// No boundary burst: one bucket before the first hits age out it still refuses.
				{at: 1050 * ms, req: req("test", desc("k", "exact")), overall: codeOver, reason: envoyhdr.ReasonRateLimited,
					statuses: []*dstatus{wantOver(exact3, 0, 50*ms)}},
				// Refusals consumed nothing: the full quota is back when the hits age out.
				{at: 1100 * ms, req: req("test", desc("k", "exact")), overall: codeOK, statuses: []*dstatus{wantOK(exact3, 2, 1100*ms)}},
			},
		},
		{
			name: "token bucket: bursts of the limit, then the refill rate, exact retry time",
			steps: []step{
				{req: req("test", desc("bucket", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(2, second, ""), 1, 500*ms)}},
				{req: req("test", desc("bucket", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(2, second, ""), 0, time.Second)}},
				{req: req("test", desc("bucket", "x")), overall: codeOver, reason: envoyhdr.ReasonRateLimited, statuses: []*dstatus{wantOver(lim(2, second, ""), 0, 500*ms)}},
				{at: 500 * ms, req: req("test", desc("bucket", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(2, second, ""), 0, time.Second)}},
				{at: 600 * ms, req: req("test", desc("bucket", "x")), overall: codeOver, reason: envoyhdr.ReasonRateLimited, statuses: []*dstatus{wantOver(lim(2, second, ""), 0, 400*ms)}},
			},
		},
		{
			name: "fixed window: resets at the window edge (envoyproxy/ratelimit's behaviour)",
			steps: []step{
				{at: 900 * ms, req: req("test", desc("fixed", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(2, second, ""), 1, 100*ms)}},
				{at: 900 * ms, req: req("test", desc("fixed", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(2, second, ""), 0, 100*ms)}},
				{at: 950 * ms, req: req("test", desc("fixed", "x")), overall: codeOver, reason: envoyhdr.ReasonRateLimited, statuses: []*dstatus{wantOver(lim(2, second, ""), 0, 50*ms)}},
				{at: 1000 * ms, req: req("test", desc("fixed", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(2, second, ""), 1, time.Second)}},
			},
		},
		{
			name: "sliding log: exact to the nanosecond, no bucket granularity",
			steps: []step{
				{req: req("test", desc("log", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(2, second, ""), 1, time.Second)}},
				{at: 300 * ms, req: req("test", desc("log", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(2, second, ""), 0, time.Second)}},
				{at: 999 * ms, req: req("test", desc("log", "x")), overall: codeOver, reason: envoyhdr.ReasonRateLimited, statuses: []*dstatus{wantOver(lim(2, second, ""), 0, ms)}},
				// The hit of 0 leaves at 1s exactly: one more passes, the next waits for the hit of 300ms.
				{at: 1000 * ms, req: req("test", desc("log", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(2, second, ""), 0, time.Second)}},
				{at: 1000 * ms, req: req("test", desc("log", "x")), overall: codeOver, reason: envoyhdr.ReasonRateLimited, statuses: []*dstatus{wantOver(lim(2, second, ""), 0, 300*ms)}},
				{at: 1300 * ms, req: req("test", desc("log", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(2, second, ""), 0, time.Second)}},
			},
		},
		{
			name: "is_negative_hits refunds, is never refused, and is not applied to a refused request",
			steps: []step{
				{req: reqHits("test", 3, desc("k", "exact")), overall: codeOK, statuses: []*dstatus{wantOK(exact3, 0, 1100*ms)}},
				{req: req("test", with(desc("k", "exact"), hits(2), refund())), overall: codeOK, statuses: []*dstatus{wantOK(exact3, 2, anyReset)}},
				{req: reqHits("test", 2, desc("k", "exact")), overall: codeOK, statuses: []*dstatus{wantOK(exact3, 0, 1100*ms)}},
				// Refused by another descriptor: the refund is only a check; a
				// full counter does not make the refund itself OVER_LIMIT.
				{req: req("test", desc("ban", "x"), with(desc("k", "exact"), hits(3), refund())), overall: codeOver, reason: envoyhdr.ReasonRateLimited,
					statuses: []*dstatus{wantOver(lim(0, second, ""), 0, time.Second), wantOK(exact3, 0, anyReset)}},
				{req: req("test", desc("k", "exact")), overall: codeOver, reason: envoyhdr.ReasonRateLimited, statuses: []*dstatus{wantOver(exact3, 0, 1100*ms)}},
				// More than was counted: floored at zero.
				{req: req("test", with(desc("k", "exact"), hits(100), refund())), overall: codeOK, statuses: []*dstatus{wantOK(exact3, 3, anyReset)}},
			},
		},
		{
			name: "value-less key counts each value separately",
			steps: []step{
				{req: req("test", desc("user", "a")), overall: codeOK, statuses: []*dstatus{wantOK(lim(2, minute, ""), 1, 66*time.Second)}},
				{req: req("test", desc("user", "a")), overall: codeOK, statuses: []*dstatus{wantOK(lim(2, minute, ""), 0, 66*time.Second)}},
				{req: req("test", desc("user", "a")), overall: codeOver, reason: envoyhdr.ReasonRateLimited, statuses: []*dstatus{wantOver(lim(2, minute, ""), 0, 66*time.Second)}},
				{req: req("test", desc("user", "b")), overall: codeOK, statuses: []*dstatus{wantOK(lim(2, minute, ""), 1, 66*time.Second)}},
			},
		},
		{
			name: "several limits: most constraining reported, a refusal consumes none",
			steps: []step{
				{req: req("test", desc("multi", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(3, second, "per-second"), 2, 1100*ms)}},
				{req: req("test", desc("multi", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(3, second, "per-second"), 1, 1100*ms)}},
				{req: req("test", desc("multi", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(3, second, "per-second"), 0, 1100*ms)}},
				{req: req("test", desc("multi", "x")), overall: codeOver, reason: envoyhdr.ReasonRateLimited, statuses: []*dstatus{wantOver(lim(3, second, "per-second"), 0, 1100*ms)}},
				// The refused fourth hit was not recorded by the per-minute limit either: 5-3-1 = 1 left.
				{at: 1100 * ms, req: req("test", desc("multi", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(5, minute, "per-minute"), 1, 66*time.Second-1100*ms)}},
			},
		},
		{
			name: "unlimited is never counted",
			steps: []step{
				{req: reqHits("test", 1000, desc("free", "x")), overall: codeOK, statuses: []*dstatus{wantUnlimited()}},
				{req: reqHits("test", 1000, desc("free", "x")), overall: codeOK, statuses: []*dstatus{wantUnlimited()}},
			},
		},
		{
			name: "unknown domain and unmatched descriptors have no limit",
			steps: []step{
				{req: req("nope", desc("k", "exact"), desc("x", "y")), overall: codeOK, statuses: []*dstatus{wantPlain(), wantPlain()}},
				{req: req("test", desc("k", "other"), desc("nested", "a"), desc("nested", "a", "sub", "x", "extra", "1")), overall: codeOK,
					statuses: []*dstatus{wantPlain(), wantPlain(), wantPlain()}},
				// Unknown domain: even an override is not applied.
				{req: req("nope", with(desc("x", "y"), override(0, typev3.RateLimitUnit_SECOND, 0))), overall: codeOK, statuses: []*dstatus{wantPlain()}},
			},
		},
		{
			name: "nested rule",
			steps: []step{
				{req: req("test", desc("nested", "a", "sub", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(1, hour, ""), 0, 3960*time.Second)}},
				{req: req("test", desc("nested", "a", "sub", "x")), overall: codeOver, reason: envoyhdr.ReasonRateLimited, statuses: []*dstatus{wantOver(lim(1, hour, ""), 0, 3960*time.Second)}},
				{req: req("test", desc("nested", "a", "sub", "y")), overall: codeOK, statuses: []*dstatus{wantOK(lim(1, hour, ""), 0, 3960*time.Second)}},
			},
		},
		{
			name: "requests_per_unit 0 bans; retry after a full window",
			steps: []step{
				{req: req("test", desc("ban", "x")), overall: codeOver, reason: envoyhdr.ReasonRateLimited, statuses: []*dstatus{wantOver(lim(0, second, ""), 0, time.Second)}},
			},
		},
		{
			name: "explicit window reports unit and multiplier",
			steps: []step{
				{req: req("test", desc("win", "x")), overall: codeOK, statuses: []*dstatus{wantOK(limMult(2, second, "", 30), 1, 33*time.Second)}},
			},
		},
		{
			name: "overall is the OR of descriptors, statuses in request order",
			steps: []step{
				{req: req("test", desc("ban", "x"), desc("k", "exact"), desc("x", "y")), overall: codeOver, reason: envoyhdr.ReasonRateLimited,
					// k=exact's hit was taken back: remaining counts it as not recorded.
					statuses: []*dstatus{wantOver(lim(0, second, ""), 0, time.Second), wantOK(exact3, 3, anyReset), wantPlain()}},
				// The refused request recorded nothing on k=exact.
				{req: req("test", desc("x", "y"), desc("k", "exact")), overall: codeOK,
					statuses: []*dstatus{wantPlain(), wantOK(exact3, 2, 1100*ms)}},
			},
		},
		{
			name: "request-level and per-descriptor hits_addend",
			steps: []step{
				{req: reqHits("test", 2, desc("k", "exact")), overall: codeOK, statuses: []*dstatus{wantOK(exact3, 1, 1100*ms)}},
				{req: reqHits("test", 2, desc("k", "exact")), overall: codeOver, reason: envoyhdr.ReasonRateLimited, statuses: []*dstatus{wantOver(exact3, 1, 1100*ms)}},
				// Per-descriptor 0: check without counting.
				{req: reqHits("test", 5, with(desc("k", "exact"), hits(0))), overall: codeOK, statuses: []*dstatus{wantOK(exact3, 1, 1100*ms)}},
				{req: reqHits("test", 5, with(desc("k", "exact"), hits(0))), overall: codeOK, statuses: []*dstatus{wantOK(exact3, 1, 1100*ms)}},
				// Per-descriptor value overrides the request's.
				{req: reqHits("test", 5, with(desc("k", "exact"), hits(1))), overall: codeOK, statuses: []*dstatus{wantOK(exact3, 0, 1100*ms)}},
				// A check on a full window says whether one more hit would fit.
				{req: req("test", with(desc("k", "exact"), hits(0))), overall: codeOver, reason: envoyhdr.ReasonRateLimited, statuses: []*dstatus{wantOver(exact3, 0, 1100*ms)}},
			},
		},
		{
			name: "descriptor limit override",
			steps: []step{
				// No rule matches: the override still applies in a known domain,
				// with the default sliding window (hits age out after exactly W).
				{req: req("test", with(desc("x", "y"), override(2, typev3.RateLimitUnit_SECOND, 0))), overall: codeOK,
					statuses: []*dstatus{wantOK(lim(2, second, ""), 1, time.Second)}},
				{req: req("test", with(desc("x", "y"), override(2, typev3.RateLimitUnit_SECOND, 0))), overall: codeOK,
					statuses: []*dstatus{wantOK(lim(2, second, ""), 0, time.Second)}},
				{req: req("test", with(desc("x", "y"), override(2, typev3.RateLimitUnit_SECOND, 0))), overall: codeOver, reason: envoyhdr.ReasonRateLimited,
					statuses: []*dstatus{wantOver(lim(2, second, ""), 0, time.Second)}},
				// Another value is another counter.
				{req: req("test", with(desc("x", "z"), override(2, typev3.RateLimitUnit_SECOND, 0))), overall: codeOK,
					statuses: []*dstatus{wantOK(lim(2, second, ""), 1, time.Second)}},
				// On a matched rule the override wins and the rule's counter is untouched.
				{req: req("test", with(desc("k", "exact"), override(1, typev3.RateLimitUnit_MINUTE, 0))), overall: codeOK,
					statuses: []*dstatus{wantOK(lim(1, minute, ""), 0, time.Minute)}},
				{req: req("test", desc("k", "exact")), overall: codeOK, statuses: []*dstatus{wantOK(exact3, 2, 1100*ms)}},
				// unit_multiplier.
				{req: req("test", with(desc("x", "m"), override(4, typev3.RateLimitUnit_SECOND, 30))), overall: codeOK,
					statuses: []*dstatus{wantOK(limMult(4, second, "", 30), 3, 30*time.Second)}},
				// Shadow mode of the matched rule does not apply to an override.
				{req: req("test", with(desc("shadow", "s"), override(0, typev3.RateLimitUnit_SECOND, 0))), overall: codeOver, reason: envoyhdr.ReasonRateLimited,
					statuses: []*dstatus{wantOver(lim(0, second, ""), 0, time.Second)}},
			},
		},
		{
			name: "replaces drops the replaced rule entirely",
			steps: []step{
				{req: req("test", desc("old", "x"), desc("new", "x")), overall: codeOK,
					statuses: []*dstatus{wantPlain(), wantOK(lim(5, second, ""), 4, time.Second)}},
				{req: req("test", desc("old", "x"), desc("new", "x")), overall: codeOK,
					statuses: []*dstatus{wantPlain(), wantOK(lim(5, second, ""), 3, time.Second)}},
				// The replaced rule's counter was never touched.
				{req: req("test", desc("old", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(1, second, "legacy"), 0, 1100*ms)}},
			},
		},
		{
			name: "per-rule shadow mode forces the status to OK",
			steps: []step{
				{req: req("test", desc("shadow", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(1, second, ""), 0, 1100*ms)}},
				{req: req("test", desc("shadow", "x")), overall: codeOK, statuses: []*dstatus{wantOK(lim(1, second, ""), 0, 1100*ms)}},
				// A shadow rule over its limit does not veto the others' hits.
				{req: req("test", desc("shadow", "x"), desc("k", "exact")), overall: codeOK,
					statuses: []*dstatus{wantOK(lim(1, second, ""), 0, 1100*ms), wantOK(exact3, 2, 1100*ms)}},
			},
		},
		{
			name: "global shadow mode forces only the overall code",
			opts: func(o *Options) { o.ShadowMode = true },
			steps: []step{
				{req: req("test", desc("ban", "x"), desc("k", "exact")), overall: codeOK,
					statuses: []*dstatus{wantOver(lim(0, second, ""), 0, time.Second), wantOK(exact3, 2, 1100*ms)}},
				// The request went through, so k=exact was charged.
				{req: req("test", desc("k", "exact")), overall: codeOK, statuses: []*dstatus{wantOK(exact3, 1, 1100*ms)}},
			},
		},
		{
			// envoyproxy/ratelimit's TestServiceQuotaModeOnly and
			// TestServicePerDescriptorQuotaMode: a quota descriptor over its
			// limit is answered OK with its limit and remaining quota, and
			// never refuses the request by itself.
			// As envoyproxy/ratelimit answers since its #1059 (its
			// TestServiceQuotaModeOnlySomeOverTheLimit,
			// TestServiceQuotaModeOnlyAllOverTheLimit,
			// TestServicePerDescriptorQuotaMode): a quota descriptor over is
			// OVER_LIMIT in its status; the request is refused when a regular
			// descriptor is over, or when every quota descriptor is.
			name: "quota mode: refused only when every quota descriptor is over",
			steps: []step{
				{req: req("test", desc("quota", "a"), desc("quota", "b")), overall: codeOK,
					statuses: []*dstatus{wantOK(lim(1, second, ""), 0, 1100*ms), wantOK(lim(2, second, ""), 1, 1100*ms)}},
				// One of two over: the request passes, and b's hit counts.
				{req: req("test", desc("quota", "a"), desc("quota", "b")), overall: codeOK,
					statuses: []*dstatus{wantOver(lim(1, second, ""), 0, 1100*ms), wantOK(lim(2, second, ""), 0, 1100*ms)}},
				// Both over: refused, nothing recorded.
				{req: req("test", desc("quota", "a"), desc("quota", "b")), overall: codeOver, reason: envoyhdr.ReasonRateLimited,
					statuses: []*dstatus{wantOver(lim(1, second, ""), 0, 1100*ms), wantOver(lim(2, second, ""), 0, 1100*ms)}},
				// A regular descriptor over refuses, whatever the quota ones say.
				{req: req("test", desc("ban", "x"), desc("quota", "a")), overall: codeOver, reason: envoyhdr.ReasonRateLimited,
					statuses: []*dstatus{wantOver(lim(0, second, ""), 0, time.Second), wantOver(lim(1, second, ""), 0, 1100*ms)}},
				// A regular descriptor within its limit does not save a request
				// whose quota descriptors are all over; the regular hit is not
				// kept (the request was refused).
				{req: req("test", desc("k", "exact"), desc("quota", "a")), overall: codeOver, reason: envoyhdr.ReasonRateLimited,
					statuses: []*dstatus{wantOK(exact3, 3, 0), wantOver(lim(1, second, ""), 0, 1100*ms)}},
				{req: req("test", desc("k", "exact")), overall: codeOK, statuses: []*dstatus{wantOK(exact3, 2, 1100*ms)}},
			},
		},
		{
			// envoyproxy/ratelimit's TestServiceGlobalQuotaMode: with
			// QUOTA_MODE every descriptor is in quota mode, one that matches
			// no rule too (it is never over), but not an unlimited one.
			name: "global quota mode: every descriptor in quota mode",
			opts: func(o *Options) { o.QuotaMode = true },
			steps: []step{
				{req: req("test", desc("ban", "x"), desc("k", "exact")), overall: codeOK,
					statuses: []*dstatus{wantOver(lim(0, second, ""), 0, time.Second), wantOK(exact3, 2, 1100*ms)}},
				{req: req("test", desc("ban", "x")), overall: codeOver, reason: envoyhdr.ReasonRateLimited,
					statuses: []*dstatus{wantOver(lim(0, second, ""), 0, time.Second)}},
				{req: req("test", desc("ban", "x"), desc("nothing", "matches")), overall: codeOK,
					statuses: []*dstatus{wantOver(lim(0, second, ""), 0, time.Second), wantPlain()}},
				// A limit override is in quota mode too.
				{req: req("test", with(desc("x", "y"), override(0, typev3.RateLimitUnit_SECOND, 0))), overall: codeOver, reason: envoyhdr.ReasonRateLimited,
					statuses: []*dstatus{wantOver(lim(0, second, ""), 0, time.Second)}},
			},
		},
		{
			name:   "circuit breakers refuse without consuming quota",
			refuse: map[string]time.Duration{"test.backend_api": 5 * time.Second, "test.backend_limited": 2 * time.Second, "test.backend_shadowed": time.Second},
			steps: []step{
				{req: req("test", desc("backend", "api")), overall: codeOver, reason: envoyhdr.ReasonCircuitOpen,
					statuses: []*dstatus{{Code: codeOver, DurationUntilReset: durationpb.New(5 * time.Second)}}},
				// Rate limit and breaker on one descriptor: the breaker refuses
				// and the hits the rate limits recorded are taken back.
				{req: req("test", desc("backend", "limited"), desc("k", "exact")), overall: codeOver, reason: envoyhdr.ReasonCircuitOpen,
					statuses: []*dstatus{wantOver(lim(1, second, ""), 1, 2*time.Second), wantOK(exact3, 3, 0)}},
				{req: req("test", desc("k", "exact")), overall: codeOK, statuses: []*dstatus{wantOK(exact3, 2, 1100*ms)}},
				{req: req("test", desc("backend", "limited")), overall: codeOver, reason: envoyhdr.ReasonCircuitOpen,
					statuses: []*dstatus{wantOver(lim(1, second, ""), 1, 2*time.Second)}},
				// A request the rate limits refuse does not reach the breakers
				// (no half-open probe is spent on it): the reason is the rate limit.
				{req: req("test", desc("backend", "api"), desc("ban", "b")), overall: codeOver, reason: envoyhdr.ReasonRateLimited,
					statuses: []*dstatus{wantPlain(), wantOver(lim(0, second, ""), 0, time.Second)}},
				// A shadow-mode rule's breaker does not refuse.
				{req: req("test", desc("backend", "shadowed")), overall: codeOK, statuses: []*dstatus{wantPlain()}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var brk *fakeBreakers
			h := newHarness(t, mustParse(t, testRules), func(o *Options) {
				o.RefusalHeaders = true // the steps check the reason
				if tt.refuse != nil {
					brk = &fakeBreakers{refuse: tt.refuse}
					o.Breakers = brk
				}
				if tt.opts != nil {
					tt.opts(o)
				}
			})
			for i, s := range tt.steps {
				h.clock.Set(s.at)
				resp, err := h.call(s.req)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if resp.OverallCode != s.overall {
					t.Errorf("step %d: overall %v, want %v\n%s", i, resp.OverallCode, s.overall, prototext.Format(resp))
				}
				checkStatuses(t, resp, s.statuses)
				checkReason(t, resp, s.reason)
				if t.Failed() {
					t.Fatalf("step %d failed", i)
				}
			}
		})
	}
}

func checkReason(t testing.TB, resp *rlsv3.RateLimitResponse, want string) {
	t.Helper()
	var got []string
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == envoyhdr.ReasonHeader {
			got = append(got, h.GetValue())
		}
	}
	switch {
	case want == "" && len(got) > 0:
		t.Errorf("unexpected %s: %v", envoyhdr.ReasonHeader, got)
	case want != "" && (len(got) != 1 || got[0] != want):
		t.Errorf("%s = %v, want %q", envoyhdr.ReasonHeader, got, want)
	}
}

// TestOddDescriptorsAreAnsweredAlone sends, next to a descriptor over its
// limit, a descriptor that is odd in one way: each is answered on its own
// and the request stays OVER_LIMIT (an error would let Envoy pass it).
func TestOddDescriptorsAreAnsweredAlone(t *testing.T) {
	ban := desc("ban", "x") // limit 0: always over
	long := strings.Repeat("u", 64<<10)
	tests := []struct {
		name string
		odd  *rlcommonv3.RateLimitDescriptor
		want *dstatus
	}{
		{"nil descriptor", nil, wantPlain()},
		{"descriptor without entries", desc(), wantPlain()},
		{"nil entry", &rlcommonv3.RateLimitDescriptor{Entries: []*rlcommonv3.RateLimitDescriptor_Entry{nil}}, wantPlain()},
		{"empty key", desc("k", "exact", "", "v"), wantPlain()},
		{"more entries than any rule is deep", desc(strings.Split(strings.Repeat("user,x,", 40), ",")[:80]...), wantPlain()},
		{"invalid UTF-8 value is limited", desc("user", "\xff\xfe"), wantOK(lim(2, minute, ""), 1, 66*time.Second)},
		{"64 KiB value is limited", desc("user", long), wantOK(lim(2, minute, ""), 1, 66*time.Second)},
		{"override with unknown unit: the rule answers", with(desc("user", "o1"), override(1, typev3.RateLimitUnit_UNKNOWN, 0)), wantOK(lim(2, minute, ""), 1, 66*time.Second)},
		{"override with multiplier 0: the rule answers", with(desc("user", "o2"), override(1, typev3.RateLimitUnit_SECOND, 0),
			func(d *rlcommonv3.RateLimitDescriptor) { d.Limit.UnitMultiplier = wrapperspb.UInt32(0) }), wantOK(lim(2, minute, ""), 1, 66*time.Second)},
		{"override window overflows: the rule answers", with(desc("user", "o3"), override(1, typev3.RateLimitUnit_YEAR, math.MaxUint32)), wantOK(lim(2, minute, ""), 1, 66*time.Second)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, mustParse(t, testRules), nil)
			resp, err := h.call(req("test", ban, tt.odd))
			if err != nil {
				t.Fatalf("error %v: Envoy would let the request through", err)
			}
			if resp.OverallCode != codeOver {
				t.Errorf("overall %v, want OVER_LIMIT", resp.OverallCode)
			}
			if len(resp.Statuses) != 2 {
				t.Fatalf("%d statuses, want 2", len(resp.Statuses))
			}
			checkStatuses(t, &rlsv3.RateLimitResponse{Statuses: resp.Statuses[:1]}, []*dstatus{wantOver(lim(0, second, ""), 0, time.Second)})
			if got := resp.Statuses[1]; got.Code != tt.want.Code || (got.CurrentLimit == nil) != (tt.want.CurrentLimit == nil) {
				t.Errorf("odd descriptor next to an over-limit one: %v, want code %v with limit %v", got, tt.want.Code, tt.want.CurrentLimit)
			}
			// Alone, the odd descriptor is answered as it says (its
			// over-limit neighbour recorded nothing).
			resp, err = h.call(req("test", tt.odd))
			if err != nil {
				t.Fatal(err)
			}
			checkStatuses(t, resp, []*dstatus{tt.want})
		})
	}
}

// TestOddRequests covers what is odd about a whole request.
func TestOddRequests(t *testing.T) {
	tests := []struct {
		name    string
		req     *rlsv3.RateLimitRequest
		mod     func(*Options)
		noRules bool
		code    codes.Code // error code; OK for an answer
		overall rlsv3.RateLimitResponse_Code
		n       int     // statuses
		refused float64 // leapgate_requests_refused_total{too_many_descriptors}
	}{
		{name: "nil request", req: nil, overall: codeOK},
		{name: "empty domain", req: req("", desc("k", "v")), overall: codeOK, n: 1},
		{name: "unknown domain", req: req("\xffnope", desc("k", "v")), overall: codeOK, n: 1},
		{name: "no descriptors", req: req("test"), overall: codeOK},
		{name: "descriptors at the bound", req: req("test", descs(DefaultMaxDescriptors)...), overall: codeOK, n: DefaultMaxDescriptors},
		{name: "too many descriptors", req: req("test", descs(DefaultMaxDescriptors+1)...), overall: codeOver, n: DefaultMaxDescriptors + 1, refused: 1},
		{name: "too many descriptors, set bound", req: req("test", descs(3)...), mod: func(o *Options) { o.MaxDescriptors = 2 }, overall: codeOver, n: 3, refused: 1},
		{name: "too many descriptors in global shadow mode", req: req("test", descs(3)...),
			mod: func(o *Options) { o.MaxDescriptors = 2; o.ShadowMode = true }, overall: codeOK, n: 3, refused: 1},
		{name: "no rules loaded", req: req("test", desc("k", "exact")), noRules: true, code: codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set := mustParse(t, testRules)
			if tt.noRules {
				set = nil
			}
			h := newHarness(t, set, tt.mod)
			resp, err := h.call(tt.req)
			if code := grpcstatus.Code(err); code != tt.code {
				t.Fatalf("code %v (%v), want %v", code, err, tt.code)
			}
			if err != nil {
				return
			}
			if resp.OverallCode != tt.overall || len(resp.Statuses) != tt.n {
				t.Errorf("overall %v with %d statuses, want %v with %d", resp.OverallCode, len(resp.Statuses), tt.overall, tt.n)
			}
			if tt.refused > 0 {
				for i, st := range resp.Statuses {
					if st.Code != codeOver {
						t.Errorf("status %d: %v, want OVER_LIMIT", i, st.Code)
					}
				}
			}
			if got := testutil.ToFloat64(h.svc.metrics.refused.WithLabelValues(refusedTooManyDescriptors)); got != tt.refused {
				t.Errorf("requests_refused_total{too_many_descriptors} = %v, want %v", got, tt.refused)
			}
		})
	}
}

// descs returns n distinct descriptors of the value-less user rule.
func descs(n int) []*rlcommonv3.RateLimitDescriptor {
	out := make([]*rlcommonv3.RateLimitDescriptor, n)
	for i := range out {
		out[i] = desc("user", fmt.Sprint("u", i))
	}
	return out
}

func TestSetRules(t *testing.T) {
	h := newHarness(t, nil, nil)
	if h.svc.Rules() != nil {
		t.Fatal("Rules() before SetRules is not nil")
	}
	if _, err := h.call(req("test", desc("k", "exact"))); grpcstatus.Code(err) != codes.Unavailable {
		t.Fatalf("before SetRules: %v, want Unavailable", err)
	}
	set := mustParse(t, testRules)
	h.svc.SetRules(set)
	if h.svc.Rules() != set {
		t.Fatal("Rules() does not return the set")
	}
	resp, err := h.call(req("test", desc("k", "exact")))
	if err != nil || resp.OverallCode != codeOK {
		t.Fatalf("after SetRules: %v %v", resp, err)
	}
	// A new set with a lower limit applies at once to the same counter.
	h.svc.SetRules(mustParse(t, strings.Replace(testRules, "requests_per_unit: 3, name: exact3", "requests_per_unit: 1, name: exact3", 1)))
	resp, err = h.call(req("test", desc("k", "exact")))
	if err != nil {
		t.Fatal(err)
	}
	checkStatuses(t, resp, []*dstatus{wantOver(lim(1, second, "exact3"), 0, 1100*time.Millisecond)})
	h.svc.SetRules(nil)
	if _, err := h.call(req("test", desc("k", "exact"))); grpcstatus.Code(err) != codes.Unavailable {
		t.Fatalf("after SetRules(nil): %v, want Unavailable", err)
	}
}

func TestCheckRules(t *testing.T) {
	// A backend that cannot serve a rule's limit (here: none of its
	// sliding logs) gets the rule refused, with its file and line.
	set := mustParse(t, `
domain: d
descriptors:
  - key: w
    rate_limit: {window: 1100ns, requests_per_unit: 1, algorithm: sliding_log}
`)
	if _, err := New(Options{Limiter: window.NewStore(window.StoreOptions{Clock: &testclock.Clock{}}), Registry: prometheus.NewRegistry(), DefaultBuckets: 7}); err == nil {
		t.Fatal("New accepted a default bucket count that does not divide one second")
	}
	h := newHarness(t, nil, func(o *Options) { o.Limiter = noLogLimiter{o.Limiter} })
	err := h.svc.CheckRules(set)
	if err == nil || !strings.Contains(err.Error(), "rulesa.yaml:4: rule d.w, limit 1: the rate-limit backend cannot serve it") {
		t.Fatalf("CheckRules = %v, want the backend's refusal with file and line", err)
	}
	h.svc.SetRules(set)
	// Served anyway, the rule answers OVER_LIMIT: it lifts no limit, and
	// leaves the other descriptors their own answers.
	resp, err := h.call(req("d", desc("w", "x"), desc("other", "y")))
	if err != nil || resp.OverallCode != codeOver {
		t.Fatalf("request on an unservable rule: %v %v, want OVER_LIMIT", resp, err)
	}
	checkStatuses(t, resp, []*dstatus{wantOver(nil, 0, 0), wantPlain()})
	if got := testutil.ToFloat64(h.svc.metrics.refused.WithLabelValues(refusedBrokenRule)); got != 1 {
		t.Errorf("requests_refused_total{rule_not_servable} = %v, want 1", got)
	}
	// The other algorithms have no buckets: any window length fits.
	algo := mustParse(t, `
domain: d
descriptors:
  - key: sw
    rate_limit: {window: 1100ns, requests_per_unit: 1}
  - key: tb
    rate_limit: {window: 1100ns, requests_per_unit: 1, algorithm: token_bucket}
  - key: fw
    rate_limit: {window: 1100ns, requests_per_unit: 1, algorithm: fixed_window}
`)
	if err := h.svc.CheckRules(algo); err != nil {
		t.Fatalf("CheckRules(sliding window, token bucket, fixed window) = %v", err)
	}
	if err := newHarness(t, nil, nil).svc.CheckRules(mustParse(t, testRules)); err != nil {
		t.Fatalf("CheckRules(testRules) = %v", err)
	}
	// A backend that does not serve an algorithm (window.RequestChecker)
	// gets the rules that ask for it rejected, with rule, file and line.
	logRules := mustParse(t, `
domain: d
descriptors:
  - key: sw
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: lg
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_log}
`)
	if err := newHarness(t, nil, nil).svc.CheckRules(logRules); err != nil {
		t.Fatalf("CheckRules(sliding_log) on the in-memory store = %v", err)
	}
	noLog := newHarness(t, nil, func(o *Options) { o.Limiter = noLogLimiter{o.Limiter} })
	err = noLog.svc.CheckRules(logRules)
	if err == nil || err.Error() != "rulesa.yaml:6: rule d.lg, limit 1: the rate-limit backend cannot serve it: sliding_log is not served" {
		t.Fatalf("CheckRules(sliding_log) on a backend without it = %v", err)
	}
}

// noLogLimiter is a Limiter that does not serve window.SlidingLog.
type noLogLimiter struct{ window.Limiter }

func (noLogLimiter) CheckRequest(req *window.Request) error {
	if req.Algorithm == window.SlidingLog {
		return errors.New("sliding_log is not served")
	}
	return window.CheckRequest(req)
}

// failingLimiter fails every call with err.
type failingLimiter struct{ err error }

func (f failingLimiter) Do(context.Context, []window.Request) ([]window.Result, error) {
	return nil, f.err
}
func (f failingLimiter) Undo(context.Context, []window.Request, []window.Result) error { return f.err }

func TestLimiterError(t *testing.T) {
	cause := errors.New("redis: connection refused")
	dialTimeout := fmt.Errorf("redis: dial tcp: i/o timeout: %w", context.DeadlineExceeded)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel2()
	tests := []struct {
		name string
		ctx  context.Context
		err  error
		code codes.Code
	}{
		{"backend down", context.Background(), cause, codes.Unavailable},
		// A backend timeout is not the caller's deadline: the caller still
		// waits and should be told the backend is unavailable.
		{"backend dial timeout", context.Background(), dialTimeout, codes.Unavailable},
		{"caller gave up", canceled, context.Canceled, codes.Canceled},
		{"caller deadline passed", expired, dialTimeout, codes.DeadlineExceeded},
	}
	for _, tt := range tests {
		h := newHarness(t, mustParse(t, testRules), func(o *Options) { o.Limiter = failingLimiter{err: tt.err} })
		_, err := h.svc.ShouldRateLimit(tt.ctx, req("test", desc("k", "exact")))
		if grpcstatus.Code(err) != tt.code || !errors.Is(err, tt.err) {
			t.Errorf("%s: got %v (code %v), want code %v wrapping the cause", tt.name, err, grpcstatus.Code(err), tt.code)
		}
		var le *LimiterError
		if !errors.As(err, &le) {
			t.Errorf("%s: error %T is not a *LimiterError", tt.name, err)
		}
		// Descriptors that need no counter do not reach the limiter.
		resp, err := h.call(req("test", desc("free", "x"), desc("x", "y")))
		if err != nil || resp.OverallCode != codeOK {
			t.Errorf("%s: unlimited/unmatched request with a failing limiter: %v %v", tt.name, resp, err)
		}
		if got := testutil.ToFloat64(h.svc.metrics.errors.WithLabelValues(errTypeLimiter)); got != 1 {
			t.Errorf("%s: should_rate_limit_error{limiter} = %v, want 1", tt.name, got)
		}
	}
}

func TestBackendFailuresLogThrottled(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	h := newHarness(t, mustParse(t, testRules), func(o *Options) {
		o.Limiter = failingLimiter{err: errors.New("redis: connection refused")}
		o.Logger = logger
	})
	for range 1000 {
		if _, err := h.call(req("test", desc("k", "exact"))); err == nil {
			t.Fatal("a failing limiter answered without error")
		}
	}
	if lines := strings.Count(buf.String(), "rate limit backend failed"); lines != 1 {
		t.Fatalf("1000 failures in a burst logged %d lines, want 1:\n%s", lines, buf.String())
	}
}

// recordingLimiter records the batches passed to an inner Limiter.
type recordingLimiter struct {
	inner window.Limiter
	dos   [][]window.Request
	undos [][]window.Request
}

func (r *recordingLimiter) Do(ctx context.Context, reqs []window.Request) ([]window.Result, error) {
	r.dos = append(r.dos, append([]window.Request(nil), reqs...))
	return r.inner.Do(ctx, reqs)
}

func (r *recordingLimiter) Undo(ctx context.Context, reqs []window.Request, res []window.Result) error {
	r.undos = append(r.undos, append([]window.Request(nil), reqs...))
	return r.inner.Undo(ctx, reqs, res)
}

func TestOneLimiterCallPerRequest(t *testing.T) {
	tests := []struct {
		name     string
		shadow   bool
		req      *rlsv3.RateLimitRequest
		veto     []bool
		hits     []uint64
		negative []bool
		undos    int
	}{
		{name: "enforcing, shadow and quota rules, several limits",
			req:  reqHits("test", 2, desc("k", "exact"), desc("shadow", "s"), with(desc("quota", "b"), hits(1)), with(desc("multi", "m"), hits(0)), desc("free", "x"), desc("x", "y")),
			veto: []bool{true, false, false, true, true}, hits: []uint64{2, 2, 1, 0, 0}},
		{name: "global shadow mode vetoes nothing", shadow: true,
			req:  req("test", desc("k", "exact"), desc("user", "u")),
			veto: []bool{false, false}, hits: []uint64{1, 1}},
		{name: "refunds never veto and carry Negative",
			req:  req("test", with(desc("k", "exact"), refund()), desc("user", "u")),
			veto: []bool{false, true}, hits: []uint64{1, 1}, negative: []bool{true, false}},
		{name: "one quota descriptor of two over: no Undo, the request passes", req: req("test", desc("k", "exact"), with(desc("quota", "a"), hits(2)), desc("quota", "b")),
			veto: []bool{true, false, false}, hits: []uint64{1, 2, 1}},
		{name: "the only quota descriptor over: refused, the recorded hits taken back", req: req("test", desc("k", "exact"), with(desc("quota", "a"), hits(2))),
			veto: []bool{true, false}, hits: []uint64{1, 2}, undos: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recordingLimiter{}
			h := newHarness(t, mustParse(t, testRules), func(o *Options) {
				rec.inner = o.Limiter
				o.Limiter = rec
				o.ShadowMode = tt.shadow
			})
			if _, err := h.call(tt.req); err != nil {
				t.Fatal(err)
			}
			if len(rec.dos) != 1 {
				t.Fatalf("%d Do calls, want 1", len(rec.dos))
			}
			reqs := rec.dos[0]
			if len(reqs) != len(tt.veto) {
				t.Fatalf("%d window requests, want %d: %+v", len(reqs), len(tt.veto), reqs)
			}
			keys := map[string]bool{}
			for i, r := range reqs {
				if want := i < len(tt.negative) && tt.negative[i]; r.Negative != want {
					t.Errorf("request %d: Negative %v, want %v", i, r.Negative, want)
				}
				if r.Veto != tt.veto[i] || r.Hits != tt.hits[i] {
					t.Errorf("request %d: veto %v hits %d, want veto %v hits %d", i, r.Veto, r.Hits, tt.veto[i], tt.hits[i])
				}
				if keys[r.Key] {
					t.Errorf("request %d: duplicate key %q", i, r.Key)
				}
				keys[r.Key] = true
			}
			if len(rec.undos) != tt.undos {
				t.Errorf("%d Undo calls, want %d", len(rec.undos), tt.undos)
			}
		})
	}
}

func TestBreakersSeeMatchedRuleAndEntries(t *testing.T) {
	brk := &fakeBreakers{}
	h := newHarness(t, mustParse(t, testRules), func(o *Options) { o.Breakers = brk })
	first, err := h.call(req("test", desc("backend", "api"), desc("k", "exact"), desc("old", "x"), desc("new", "y")))
	if err != nil {
		t.Fatal(err)
	}
	if hs := first.GetRequestHeadersToAdd(); len(hs) != 0 {
		t.Errorf("request headers %v added without a probe, want none", hs)
	}
	if len(brk.asked) != 1 || brk.asked[0] != "test.backend_api" {
		t.Fatalf("breakers asked for %v, want [test.backend_api]", brk.asked)
	}
	if e := brk.entries[0]; len(e) != 1 || e[0].Key != "backend" || e[0].Value != "api" {
		t.Fatalf("breaker got entries %v", e)
	}

	// A request refused by a rate limit never reaches the breakers.
	if _, err := h.call(req("test", desc("backend", "api"), desc("ban", "x"))); err != nil {
		t.Fatal(err)
	}
	if len(brk.asked) != 1 {
		t.Fatalf("breakers asked %v for a rate-limited request", brk.asked[1:])
	}

	// Under global shadow mode the request passes whatever the limits say,
	// so its breakers are asked; an open one is reported but not enforced.
	brk = &fakeBreakers{refuse: map[string]time.Duration{"test.backend_api": time.Second}}
	h = newHarness(t, mustParse(t, testRules), func(o *Options) { o.Breakers = brk; o.ShadowMode = true })
	resp, err := h.call(req("test", desc("backend", "api"), desc("ban", "x")))
	if err != nil {
		t.Fatal(err)
	}
	if len(brk.asked) != 1 || resp.OverallCode != codeOK || resp.Statuses[0].Code != codeOver {
		t.Fatalf("global shadow: asked %v, response %v", brk.asked, resp)
	}
}

func TestMalformedRequestsNeverPanic(t *testing.T) {
	h := newHarness(t, mustParse(t, testRules), func(o *Options) { o.Breakers = &fakeBreakers{} })
	reqs := []*rlsv3.RateLimitRequest{
		nil,
		{},
		{Domain: "test"},
		{Domain: "test", Descriptors: []*rlcommonv3.RateLimitDescriptor{nil, nil}},
		{Domain: "test", Descriptors: []*rlcommonv3.RateLimitDescriptor{{Entries: []*rlcommonv3.RateLimitDescriptor_Entry{nil, {Key: "k"}}}}},
		{Domain: "test", Descriptors: []*rlcommonv3.RateLimitDescriptor{{Entries: []*rlcommonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "exact"}}, Limit: &rlcommonv3.RateLimitDescriptor_RateLimitOverride{}}}},
		{Domain: "test", HitsAddend: math.MaxUint32, Descriptors: []*rlcommonv3.RateLimitDescriptor{desc("k", "exact"), with(desc("user", "u"), hits(math.MaxUint64))}},
		{Domain: "test", Descriptors: []*rlcommonv3.RateLimitDescriptor{with(desc("x", "y"), override(math.MaxUint32, typev3.RateLimitUnit_YEAR, math.MaxUint32))}},
		{Domain: "test", Descriptors: []*rlcommonv3.RateLimitDescriptor{with(desc("x", "y"), override(1, typev3.RateLimitUnit(99), 0))}},
	}
	for i, r := range reqs {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("request %d panicked: %v", i, p)
				}
			}()
			resp, err := h.call(r)
			if err == nil && len(resp.Statuses) != len(r.GetDescriptors()) {
				t.Errorf("request %d: %d statuses for %d descriptors", i, len(resp.Statuses), len(r.GetDescriptors()))
			}
		}()
	}
}

// TestBreakerRefusalOfAnOverQuotaDescriptor: a quota-mode descriptor over
// its limit does not refuse the request, so its breaker is asked; when the
// breaker refuses, the reset is the longer of the breaker's retry time and
// the rate limit's reset.
func TestBreakerRefusalOfAnOverQuotaDescriptor(t *testing.T) {
	const rules = `
domain: test
descriptors:
  - key: q
    value: a
    quota_mode: true
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: time_buckets}
    circuit_breaker: {strategy: error_ratio, threshold: 0.5}
  - key: q
    value: b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: time_buckets}
`
	for _, tt := range []struct {
		name  string
		retry time.Duration
		reset time.Duration
	}{
		{"the rate limit's reset is longer", 100 * time.Millisecond, 1100 * time.Millisecond},
		{"the breaker's retry is longer", 5 * time.Second, 5 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			brk := &fakeBreakers{}
			h := newHarness(t, mustParse(t, rules), func(o *Options) { o.Breakers = brk })
			if resp, err := h.call(req("test", desc("q", "a"), desc("q", "b"))); err != nil || resp.OverallCode != codeOK {
				t.Fatalf("first request: %v, %v", resp, err)
			}
			brk.mu.Lock()
			brk.refuse = map[string]time.Duration{"test.q_a": tt.retry}
			brk.mu.Unlock()
			resp, err := h.call(req("test", desc("q", "a"), desc("q", "b")))
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode != codeOver || resp.Statuses[0].Code != codeOver {
				t.Fatalf("a refused breaker on an over quota descriptor: %v", prototext.Format(resp))
			}
			if got := resp.Statuses[0].DurationUntilReset.AsDuration(); got != tt.reset {
				t.Errorf("reset %v, want %v", got, tt.reset)
			}
		})
	}
}

// TestNearLimitRatioBounds: New takes a near-limit ratio in (0, 1] (0 is
// the default) and refuses any other.
func TestNearLimitRatioBounds(t *testing.T) {
	for _, tt := range []struct {
		ratio float64
		ok    bool
	}{{0, true}, {0.01, true}, {1, true}, {1.0001, false}, {-0.1, false}} {
		_, err := New(Options{Limiter: window.NewStore(window.StoreOptions{}), Registry: prometheus.NewRegistry(), NearLimitRatio: tt.ratio})
		if (err == nil) != tt.ok {
			t.Errorf("ratio %v: %v, want accepted %v", tt.ratio, err, tt.ok)
		}
	}
}

// TestReplacesAmongReplacingRules: a rule replaced by another is dropped
// even when every rule of the request replaces something.
func TestReplacesAmongReplacingRules(t *testing.T) {
	const rules = `
domain: test
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 5, name: la, replaces: [{name: lb}]}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 1, name: lb, replaces: [{name: elsewhere}]}
`
	h := newHarness(t, mustParse(t, rules), nil)
	for i := range 3 {
		resp, err := h.call(req("test", desc("a", "x"), desc("b", "y")))
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != codeOK || resp.Statuses[1].CurrentLimit != nil {
			t.Fatalf("call %d: b (replaced by a) still limits: %v", i, prototext.Format(resp))
		}
	}
}

// TestOverrideWindowEdge: a limit override's window may be as long as a
// time.Duration holds, in whole units, and not one unit more (then the
// rule answers).
func TestOverrideWindowEdge(t *testing.T) {
	const year = 365 * 24 * time.Hour
	most := uint32(math.MaxInt64 / int64(year))
	h := newHarness(t, mustParse(t, testRules), nil)
	for _, tt := range []struct {
		mult  uint32
		limit uint32
	}{{most, 7}, {most + 1, 2}} {
		resp, err := h.call(req("test", with(desc("user", fmt.Sprint("u", tt.mult)), override(7, typev3.RateLimitUnit_YEAR, tt.mult))))
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit(); got != tt.limit {
			t.Errorf("override of %d years: limit %d, want %d", tt.mult, got, tt.limit)
		}
	}
}

// TestCallReusesItsBuffers: a call's working buffers (plans, window
// requests, results) come back from a pool, so a call allocates little
// more than its response: 9 objects for this request today, 17 without the
// pool. The bound leaves room for a dependency's change, not for the pool's
// loss.
func TestCallReusesItsBuffers(t *testing.T) {
	if raceDetector {
		t.Skip("sync.Pool drops items at random under -race")
	}
	h := newHarness(t, mustParse(t, testRules), nil)
	r := req("test", desc("detailed", "d"), desc("multi", "m"))
	if n := testing.AllocsPerRun(200, func() { _, _ = h.call(r) }); n > 12 {
		t.Errorf("%v allocations a call, want at most 12", n)
	}
}

// TestReportedUnitMultiplier: current_limit carries the rule's
// unit_multiplier, or for a window the multiple of the unit it is, when
// that is whole, above 1 and fits in 32 bits.
func TestReportedUnitMultiplier(t *testing.T) {
	const rules = `
domain: test
descriptors:
  - key: m5
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 9}
  - key: w30
    rate_limit: {window: 30s, requests_per_unit: 9}
  - key: w2h
    rate_limit: {window: 2h, requests_per_unit: 9}
  - key: w1
    rate_limit: {window: 1s, requests_per_unit: 9}
  - key: w1500
    rate_limit: {window: 1500ms, requests_per_unit: 9}
  - key: wmax
    rate_limit: {window: 4294967295s, requests_per_unit: 9}
  - key: wlong
    rate_limit: {window: 4294967298s, requests_per_unit: 9}
`
	h := newHarness(t, mustParse(t, rules), nil)
	for _, tt := range []struct {
		key  string
		unit rlsv3.RateLimitResponse_RateLimit_Unit
		mult uint32 // 0: not reported
	}{
		{"m5", minute, 5}, {"w30", second, 30}, {"w2h", rlsv3.RateLimitResponse_RateLimit_HOUR, 2},
		{"w1", second, 0}, {"w1500", second, 0}, {"wmax", second, math.MaxUint32}, {"wlong", second, 0},
	} {
		resp, err := h.call(req("test", desc(tt.key, "x")))
		if err != nil {
			t.Fatal(err)
		}
		l := resp.Statuses[0].GetCurrentLimit()
		if l.GetUnit() != tt.unit || l.GetUnitMultiplier().GetValue() != tt.mult || (tt.mult == 0) != (l.GetUnitMultiplier() == nil) {
			t.Errorf("%s: current_limit %v, want unit %v, multiplier %d", tt.key, l, tt.unit, tt.mult)
		}
	}
}
