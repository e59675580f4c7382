package service

import (
	"cmp"
	"slices"
	"strings"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/leapgate/leapgate/window"

	"github.com/leapgate/leapgate/internal/testclock"
)

func headerList(resp *rlsv3.RateLimitResponse) []string {
	var out []string
	for _, h := range resp.GetResponseHeadersToAdd() {
		out = append(out, h.GetKey()+": "+h.GetValue())
	}
	return out
}

func TestResponseHeaders(t *testing.T) {
	const ms = time.Millisecond
	draft03 := func(o *Options) { o.ResponseHeaders = HeadersDraft03 }
	draft11 := func(o *Options) { o.ResponseHeaders = HeadersDraft11 }
	type call struct {
		at      time.Duration
		req     *rlsv3.RateLimitRequest
		headers []string // exactly these, in order
	}
	tests := []struct {
		name   string
		opts   func(*Options)
		refuse map[string]time.Duration
		calls  []call
	}{
		{
			name: "off: no headers at all, as upstream",
			calls: []call{
				{req: req("test", desc("ban", "x"))},
				{req: req("test", desc("k", "exact"))},
			},
		},
		{
			name: "refusal headers: the reason and Retry-After on every refusal",
			opts: func(o *Options) { o.RefusalHeaders = true },
			calls: []call{
				{req: req("test", desc("ban", "x")), headers: []string{"x-ratelimit-reason: rate-limited", "Retry-After: 1"}},
				{req: req("test", desc("k", "exact"))},
			},
		},
		{
			name: "draft03 on OK and over, reset rounded up, as upstream",
			opts: draft03,
			calls: []call{
				{req: req("test", desc("k", "exact")), headers: []string{"RateLimit-Limit: 3", "RateLimit-Remaining: 2", "RateLimit-Reset: 2"}},
				{req: reqHits("test", 2, desc("k", "exact")), headers: []string{"RateLimit-Limit: 3", "RateLimit-Remaining: 0", "RateLimit-Reset: 2"}},
				{at: 1050 * ms, req: req("test", desc("k", "exact")), headers: []string{
					"RateLimit-Limit: 3", "RateLimit-Remaining: 0", "RateLimit-Reset: 1"}},
				// No descriptor with a limit: no rate-limit headers.
				{req: req("test", desc("x", "y"), desc("free", "z"))},
			},
		},
		{
			name: "draft03 with configured names",
			opts: func(o *Options) {
				o.ResponseHeaders = HeadersDraft03
				o.LimitHeader, o.RemainingHeader, o.ResetHeader = "X-Limit", "X-Remaining", "X-Reset"
			},
			calls: []call{
				{req: req("test", desc("k", "exact")), headers: []string{"X-Limit: 3", "X-Remaining: 2", "X-Reset: 2"}},
			},
		},
		{
			name: "most constraining descriptor: least remaining, else an over one",
			opts: draft03,
			calls: []call{
				{req: req("test", desc("k", "exact"), desc("user", "a")), headers: []string{"RateLimit-Limit: 2", "RateLimit-Remaining: 1", "RateLimit-Reset: 66"}},
				{req: req("test", desc("user", "a"), desc("ban", "x"), desc("k", "exact")), headers: []string{
					"RateLimit-Limit: 0", "RateLimit-Remaining: 0", "RateLimit-Reset: 1"}},
				// Shadow-mode rules are not enforced, so not reported.
				{req: req("test", desc("shadow", "s"), desc("k", "exact")), headers: []string{"RateLimit-Limit: 3", "RateLimit-Remaining: 1", "RateLimit-Reset: 2"}},
			},
		},
		{
			name: "draft11 structured fields",
			opts: draft11,
			calls: []call{
				{req: req("test", desc("k", "exact")), headers: []string{`RateLimit-Policy: "exact3";q=3;w=1`, `RateLimit: "exact3";r=2;t=2`}},
				{req: req("test", desc("user", "u")), headers: []string{`RateLimit-Policy: "test.user";q=2;w=60`, `RateLimit: "test.user";r=1;t=66`}},
				{req: req("test", desc("win", "w")), headers: []string{`RateLimit-Policy: "test.win";q=2;w=30`, `RateLimit: "test.win";r=1;t=33`}},
				// draft11 (not upstream's) adds Retry-After to a refusal.
				{req: req("test", desc("user", "u"), desc("user", "u")), headers: []string{
					`RateLimit-Policy: "test.user";q=2;w=60`, `RateLimit: "test.user";r=0;t=66`, "Retry-After: 66"}},
			},
		},
		{
			// The policy names show which descriptor is reported.
			name: "draft11: of refusals the longest wait, the first of equal ones",
			opts: draft11,
			calls: []call{
				{req: req("test", desc("user", "v"), desc("user", "v")), headers: []string{
					`RateLimit-Policy: "test.user";q=2;w=60`, `RateLimit: "test.user";r=0;t=66`}},
				{req: req("test", desc("ban", "x"), desc("user", "v")), headers: []string{
					`RateLimit-Policy: "test.user";q=2;w=60`, `RateLimit: "test.user";r=0;t=66`, "Retry-After: 66"}},
				{req: req("test", desc("user", "v"), desc("ban", "x")), headers: []string{
					`RateLimit-Policy: "test.user";q=2;w=60`, `RateLimit: "test.user";r=0;t=66`, "Retry-After: 66"}},
				{req: req("test", desc("ban", "x"), desc("ban2", "x")), headers: []string{
					`RateLimit-Policy: "test.ban";q=0;w=1`, `RateLimit: "test.ban";r=0;t=1`, "Retry-After: 1"}},
				{req: req("test", desc("ban2", "x"), desc("ban", "x")), headers: []string{
					`RateLimit-Policy: "test.ban2";q=0;w=1`, `RateLimit: "test.ban2";r=0;t=1`, "Retry-After: 1"}},
				// A named limit of a later descriptor is named.
				{req: req("test", desc("detailed", "d"), desc("multi", "m")), headers: []string{
					`RateLimit-Policy: "per-second";q=3;w=1`, `RateLimit: "per-second";r=2;t=2`}},
			},
		},
		{
			name:   "circuit breaker: Retry-After is the time until half-open",
			opts:   draft03,
			refuse: map[string]time.Duration{"test.backend_api": 4500 * ms},
			calls: []call{
				{req: req("test", desc("backend", "api")), headers: []string{"x-ratelimit-reason: circuit-open", "Retry-After: 5"}},
				{req: req("test", desc("backend", "api"), desc("user", "u")), headers: []string{
					"x-ratelimit-reason: circuit-open", "RateLimit-Limit: 2", "RateLimit-Remaining: 2", "RateLimit-Reset: 0", "Retry-After: 5"}},
			},
		},
		{
			name: "quota descriptors over: answered OK, no refusal headers",
			opts: func(o *Options) { o.ResponseHeaders = HeadersDraft03; o.RefusalHeaders = true },
			calls: []call{
				{req: reqHits("test", 2, desc("quota", "b")), headers: []string{"RateLimit-Limit: 2", "RateLimit-Remaining: 0", "RateLimit-Reset: 2"}},
				{at: 900 * ms, req: req("test", desc("quota", "a"), desc("quota", "b")), headers: []string{
					"RateLimit-Limit: 1", "RateLimit-Remaining: 0", "RateLimit-Reset: 2"}},
			},
		},
		{
			name: "global shadow mode: no refusal headers",
			opts: func(o *Options) { o.ResponseHeaders = HeadersDraft03; o.ShadowMode = true },
			calls: []call{
				{req: req("test", desc("ban", "x")), headers: []string{"RateLimit-Limit: 0", "RateLimit-Remaining: 0", "RateLimit-Reset: 1"}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, mustParse(t, testRules), func(o *Options) {
				if tt.refuse != nil {
					o.Breakers = &fakeBreakers{refuse: tt.refuse}
				}
				if tt.opts != nil {
					tt.opts(o)
				}
			})
			for i, c := range tt.calls {
				h.clock.Set(c.at)
				resp, err := h.call(c.req)
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				if got := headerList(resp); !slices.Equal(got, c.headers) {
					t.Errorf("call %d: headers\n got %q\nwant %q", i, got, c.headers)
				}
			}
		})
	}
}

func TestResponseHeaderModeValidated(t *testing.T) {
	_, err := New(Options{Limiter: window.NewStore(window.StoreOptions{Clock: &testclock.Clock{}}), Registry: prometheus.NewRegistry(), ResponseHeaders: "draft04"})
	if err == nil {
		t.Fatal("New accepted an unknown header mode")
	}
}

func TestSFString(t *testing.T) {
	for in, want := range map[string]string{
		"plain":     `"plain"`,
		`a"b\c`:     `"a\"b\\c"`,
		"tab\there": `"tab_here"`,
		"é":         `"__"`,
	} {
		if got := sfString(in); got != want {
			t.Errorf("sfString(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestCheckRulesMetadata(t *testing.T) {
	set := mustParse(t, `
domain: d
descriptors:
  - key: k
    metadata: {when: 2024-01-02T03:04:05Z}
    rate_limit: {unit: second, requests_per_unit: 1}
`)
	if err := newHarness(t, nil, nil).svc.CheckRules(set); err != nil {
		t.Fatalf("without dynamic metadata: CheckRules = %v", err)
	}
	h := newHarness(t, nil, func(o *Options) { o.DynamicMetadata = true })
	// YAML decodes the timestamp as a time.Time, which a Struct cannot hold.
	if err := h.svc.CheckRules(set); err == nil || !strings.Contains(err.Error(), "metadata") {
		t.Fatalf("CheckRules = %v, want a metadata error", err)
	}
}

func TestDynamicMetadata(t *testing.T) {
	mustStruct := func(m map[string]any) *structpb.Struct {
		s, err := structpb.NewStruct(m)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	tests := []struct {
		name  string
		off   bool
		rules string // testRules when empty
		reqs  []*rlsv3.RateLimitRequest
		want  *structpb.Struct // for the last request
	}{
		{
			name: "off",
			off:  true,
			reqs: []*rlsv3.RateLimitRequest{req("test", desc("meta", "x"))},
		},
		{
			name: "domain, descriptors, hits and the metadata of passed rules",
			reqs: []*rlsv3.RateLimitRequest{reqHits("test", 1, desc("meta", "x"), with(desc("k", "exact"), hits(2)))},
			want: mustStruct(map[string]any{
				"domain": "test",
				"descriptors": []any{
					map[string]any{"entries": []any{"meta=x"}},
					map[string]any{"entries": []any{"k=exact"}, "hitsAddend": 2},
				},
				"hitsAddend": 1,
				"metadata":   map[string]any{"tier": "gold", "route": "primary"},
			}),
		},
		{
			name: "a descriptor over its limit contributes no metadata",
			reqs: []*rlsv3.RateLimitRequest{req("test", desc("meta", "x")), reqHits("test", 3, desc("meta", "x"), desc("nested", "a", "sub", "b"))},
			want: mustStruct(map[string]any{
				"domain": "test",
				"descriptors": []any{
					map[string]any{"entries": []any{"meta=x"}},
					map[string]any{"entries": []any{"nested=a", "sub=b"}},
				},
				"hitsAddend": 3,
			}),
		},
		{
			// envoyproxy/ratelimit's TestServiceQuotaModeWithMetadata.
			// envoyproxy/ratelimit no longer names quota violations (its
			// #1112): the statuses say which descriptor is over.
			name: "quota mode: no quota fields",
			reqs: []*rlsv3.RateLimitRequest{
				req("test", desc("quota", "a")),
				req("test", desc("k", "exact"), desc("quota", "a"), desc("quota", "b")),
			},
			want: mustStruct(map[string]any{
				"domain": "test",
				"descriptors": []any{
					map[string]any{"entries": []any{"k=exact"}},
					map[string]any{"entries": []any{"quota=a"}},
					map[string]any{"entries": []any{"quota=b"}},
				},
			}),
		},
		{
			name: "rule metadata: the first descriptor wins a clash, maps are merged",
			rules: `
domain: test
descriptors:
  - key: a
    metadata: {tier: gold, limits: {burst: 10, region: eu}}
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: b
    metadata: {tier: silver, owner: team-b, limits: {burst: 99, zone: 2}}
    rate_limit: {unit: second, requests_per_unit: 5}
`,
			reqs: []*rlsv3.RateLimitRequest{req("test", desc("a", "1"), desc("b", "2"))},
			want: mustStruct(map[string]any{
				"domain": "test",
				"descriptors": []any{
					map[string]any{"entries": []any{"a=1"}},
					map[string]any{"entries": []any{"b=2"}},
				},
				"metadata": map[string]any{
					"tier": "gold", "owner": "team-b",
					"limits": map[string]any{"burst": 10, "region": "eu", "zone": 2},
				},
			}),
		},
		{
			name: "a limit override in protobuf text form",
			reqs: []*rlsv3.RateLimitRequest{req("test", with(desc("x", "y"), override(7, typev3.RateLimitUnit_MINUTE, 0)))},
			want: mustStruct(map[string]any{
				"domain": "test",
				"descriptors": []any{map[string]any{"entries": []any{"x=y"},
					"limit": (&rlcommonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_MINUTE}).String()}},
			}),
		},
		{
			name: "unknown domain",
			reqs: []*rlsv3.RateLimitRequest{req("nope", desc("a", "b"))},
			want: mustStruct(map[string]any{
				"domain":      "nope",
				"descriptors": []any{map[string]any{"entries": []any{"a=b"}}},
			}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, mustParse(t, cmp.Or(tt.rules, testRules)), func(o *Options) { o.DynamicMetadata = !tt.off })
			var resp *rlsv3.RateLimitResponse
			for _, r := range tt.reqs {
				var err error
				if resp, err = h.call(r); err != nil {
					t.Fatal(err)
				}
			}
			if tt.want == nil {
				if resp.DynamicMetadata != nil {
					t.Fatalf("dynamic metadata %v, want none", resp.DynamicMetadata)
				}
				return
			}
			if !proto.Equal(resp.DynamicMetadata, tt.want) {
				got, _ := protojson.Marshal(resp.DynamicMetadata)
				want, _ := protojson.Marshal(tt.want)
				t.Errorf("dynamic metadata\n got %s\nwant %s", got, want)
			}
		})
	}
}

// TestProbeHeader: a request a half-open breaker admits as its probe
// carries the probe ids upstream in request_headers_to_add; a refused one
// (another breaker open, or global shadow mode off) carries none.
func TestProbeHeader(t *testing.T) {
	for _, tt := range []struct {
		name   string
		probes map[string]uint64
		refuse map[string]time.Duration
		reqs   *rlsv3.RateLimitRequest
		want   string
	}{
		{"a probe", map[string]uint64{"test.backend_api": 0xabc}, nil, req("test", desc("backend", "api")), "abc"},
		{"two probes", map[string]uint64{"test.backend_api": 0xabc, "test.backend_limited": 0x12}, nil,
			req("test", desc("backend", "api"), desc("backend", "limited")), "abc,12"},
		{"no probe", nil, nil, req("test", desc("backend", "api")), ""},
		{"a probe, but another breaker refuses", map[string]uint64{"test.backend_api": 0xabc}, map[string]time.Duration{"test.backend_limited": time.Second},
			req("test", desc("backend", "api"), desc("backend", "limited")), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, mustParse(t, testRules), func(o *Options) {
				o.Breakers = &fakeBreakers{probes: tt.probes, refuse: tt.refuse}
			})
			resp, err := h.call(tt.reqs)
			if err != nil {
				t.Fatal(err)
			}
			var got string
			for _, hv := range resp.GetRequestHeadersToAdd() {
				if hv.GetKey() == "x-leapgate-probe" {
					got = hv.GetValue()
				}
			}
			if got != tt.want {
				t.Errorf("x-leapgate-probe = %q, want %q (%v)", got, tt.want, resp)
			}
		})
	}
}
