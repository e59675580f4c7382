package service

import (
	"cmp"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestRuleMetrics(t *testing.T) {
	type counts struct{ total, over, near, within, shadow, circuit float64 }
	tests := []struct {
		name   string
		rules  string // testRules when empty
		opts   func(*Options)
		refuse map[string]time.Duration
		reqs   []*rlsv3.RateLimitRequest
		want   map[[2]string]counts // by (domain, key)
	}{
		{
			name: "within, near and over limit",
			reqs: repeat(4, req("test", desc("k", "exact"))),
			// limit 3, near threshold floor(3*0.8)=2: the third hit is near.
			want: map[[2]string]counts{{"test", "test.k_exact"}: {total: 4, within: 3, near: 1, over: 1}},
		},
		{
			name: "hits are counted in units of hits_addend",
			reqs: []*rlsv3.RateLimitRequest{reqHits("test", 2, desc("k", "exact")), reqHits("test", 2, desc("k", "exact"))},
			// First: used 2, not above 2. Second: refused.
			want: map[[2]string]counts{{"test", "test.k_exact"}: {total: 4, within: 2, over: 2}},
		},
		{
			name: "near limit with a custom ratio",
			opts: func(o *Options) { o.NearLimitRatio = 0.5 },
			reqs: []*rlsv3.RateLimitRequest{reqHits("test", 3, desc("k", "exact"))},
			// threshold floor(1.5)=1, used 3: two of the three hits are near.
			want: map[[2]string]counts{{"test", "test.k_exact"}: {total: 3, within: 3, near: 2}},
		},
		{
			name: "value-less rule aggregates values under the rule",
			reqs: []*rlsv3.RateLimitRequest{req("test", desc("user", "a")), req("test", desc("user", "b")), req("test", desc("user", "c"))},
			want: map[[2]string]counts{{"test", "test.user"}: {total: 3, within: 3}},
		},
		{
			name: "shadow mode",
			reqs: repeat(3, req("test", desc("shadow", "x"))),
			want: map[[2]string]counts{{"test", "test.shadow"}: {total: 3, within: 1, near: 1, over: 2, shadow: 2}},
		},
		{
			name: "unlimited",
			reqs: repeat(2, req("test", desc("free", "x"))),
			want: map[[2]string]counts{{"test", "test.free"}: {total: 2, within: 2}},
		},
		{
			name:   "circuit breaker refusals",
			refuse: map[string]time.Duration{"test.backend_api": time.Second},
			reqs:   repeat(2, req("test", desc("backend", "api"))),
			want:   map[[2]string]counts{{"test", "test.backend_api"}: {total: 2, circuit: 2}},
		},
		{
			name: "override without a rule: named after the request's keys, its values hidden",
			reqs: repeat(2, req("test", with(desc("x", "y"), override(1, typev3.RateLimitUnit_SECOND, 0)))),
			want: map[[2]string]counts{{"test", "test.x_*"}: {total: 2, within: 1, near: 1, over: 1}},
		},
		{
			name: "override of a rule: named after the request's keys, not the rule; values only with detailed_metric",
			reqs: []*rlsv3.RateLimitRequest{
				req("test", with(desc("user", "alice"), override(1, typev3.RateLimitUnit_SECOND, 0))),
				req("test", with(desc("nested", "a", "sub", ""), override(1, typev3.RateLimitUnit_SECOND, 0))),
				req("test", with(desc("detailed", "vip"), override(1, typev3.RateLimitUnit_SECOND, 0))),
			},
			want: map[[2]string]counts{
				{"test", "test.user_*"}:         {total: 1, within: 1, near: 1},
				{"test", "test.nested_*.sub"}:   {total: 1, within: 1, near: 1},
				{"test", "test.detailed_vip"}:   {total: 1, within: 1, near: 1},
				{"test", "test.user"}:           {},
				{"test", "test.user_alice"}:     {},
				{"test", "test.nested_a.sub_x"}: {},
			},
		},
		{
			// near_limit counts the admitted hits above 80 % of the limit:
			// of 10, the 9th and the 10th, not the 8th.
			name:  "near_limit from just above the ratio",
			rules: tenRule,
			reqs:  repeat(8, req("test", desc("ten", "x"))),
			want:  map[[2]string]counts{{"test", "test.ten"}: {total: 8, within: 8}},
		},
		{
			name:  "near_limit of the 9th and 10th hits",
			rules: tenRule,
			reqs:  repeat(10, req("test", desc("ten", "x"))),
			want:  map[[2]string]counts{{"test", "test.ten"}: {total: 10, within: 10, near: 2}},
		},
		{
			name:  "near_limit of a request crossing the ratio: its hits above it",
			rules: tenRule,
			reqs:  []*rlsv3.RateLimitRequest{req("test", with(desc("ten", "x"), hits(7))), req("test", with(desc("ten", "x"), hits(3)))},
			want:  map[[2]string]counts{{"test", "test.ten"}: {total: 10, within: 10, near: 2}},
		},
		{
			// envoyproxy/ratelimit's config_test.go, TestValueToMetric*:
			// value_to_metric on a parent level puts the request's value at
			// that level into the key of the rule limited below it.
			name: "value_to_metric on a parent level",
			rules: `
domain: test
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: tenant
    descriptors:
      - key: user
        value_to_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
`,
			reqs: []*rlsv3.RateLimitRequest{
				req("test", desc("route", "draw", "http_method", "GET")),
				req("test", desc("route", "erase", "http_method", "GET")),
				req("test", desc("tenant", "t1", "user", "bob")),
			},
			want: map[[2]string]counts{
				{"test", "test.route_draw.http_method_GET"}:  {total: 1, within: 1},
				{"test", "test.route_erase.http_method_GET"}: {total: 1, within: 1},
				{"test", "test.tenant.user_bob"}:             {total: 1, within: 1},
			},
		},
		{
			name: "detailed metric keys capped",
			opts: func(o *Options) { o.MaxDetailedKeys = 2 },
			reqs: []*rlsv3.RateLimitRequest{
				req("test", desc("detailed", "a")), req("test", desc("detailed", "b")),
				req("test", desc("detailed", "c")), req("test", desc("detailed", "d")), req("test", desc("detailed", "a")),
			},
			want: map[[2]string]counts{
				{"test", "test.detailed_a"}: {total: 2, within: 2},
				{"test", "test.detailed_b"}: {total: 1, within: 1},
				{"test", OverflowLabel}:     {total: 2, within: 2},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, mustParse(t, cmp.Or(tt.rules, testRules)), func(o *Options) {
				if tt.refuse != nil {
					o.Breakers = &fakeBreakers{refuse: tt.refuse}
				}
				if tt.opts != nil {
					tt.opts(o)
				}
			})
			for _, r := range tt.reqs {
				if _, err := h.call(r); err != nil {
					t.Fatal(err)
				}
			}
			for k, w := range tt.want {
				got := counts{
					total:   h.counter("total_hits", k[0], k[1]),
					over:    h.counter("over_limit", k[0], k[1]),
					near:    h.counter("near_limit", k[0], k[1]),
					within:  h.counter("within_limit", k[0], k[1]),
					shadow:  h.counter("shadow_mode", k[0], k[1]),
					circuit: h.counter("circuit_open", k[0], k[1]),
				}
				if got != w {
					t.Errorf("%v: got %+v, want %+v", k, got, w)
				}
			}
			// Every rule has its series (at 0 until used); no other key label
			// exists: request values never leak into labels.
			allowed := map[string]bool{}
			for _, r := range h.svc.Rules().Rules() {
				if !r.MetricVaries() {
					allowed[r.ID] = true
				}
			}
			for k := range tt.want {
				allowed[k[1]] = true
			}
			mfs, err := h.reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, mf := range mfs {
				if mf.GetName() != "ratelimit_service_rate_limit_total_hits" {
					continue
				}
				for _, m := range mf.GetMetric() {
					for _, l := range m.GetLabel() {
						if l.GetName() == "key" && !allowed[l.GetValue()] {
							t.Errorf("unexpected key label %q", l.GetValue())
						}
					}
				}
			}
		})
	}
}

func TestReloadDropsSeriesOfRemovedRules(t *testing.T) {
	h := newHarness(t, mustParse(t, testRules), nil)
	series := func() map[string]bool {
		out := map[string]bool{}
		mfs, err := h.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "ratelimit_service_rate_limit_total_hits" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "key" {
						out[l.GetValue()] = true
					}
				}
			}
		}
		return out
	}
	if s := series(); !s["test.k_exact"] || !s["test.user"] {
		t.Fatalf("series before reload: %v", s)
	}
	h.svc.SetRules(mustParse(t, `
domain: test
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
`))
	if s := series(); s["test.k_exact"] || !s["test.user"] {
		t.Fatalf("series after a reload without test.k_exact: %v", s)
	}
}

func repeat(n int, r *rlsv3.RateLimitRequest) []*rlsv3.RateLimitRequest {
	out := make([]*rlsv3.RateLimitRequest, n)
	for i := range out {
		out[i] = r
	}
	return out
}

// TestUnknownDomainsAreCapped: a caller choosing domains at will gets at
// most MaxUnknownDomains label values of domain_not_found, then the overflow
// value; every request is counted; a long or invalid domain becomes a short,
// valid label.
func TestUnknownDomainsAreCapped(t *testing.T) {
	h := newHarness(t, mustParse(t, testRules), nil)
	for i := range MaxUnknownDomains + 50 {
		h.call(req(fmt.Sprintf("junk-%d", i), desc("k", "v")))
	}
	h.call(req("junk-0", desc("k", "v")))
	vec := h.svc.metrics.domainNotFound.vec
	if n := testutil.CollectAndCount(vec); n != MaxUnknownDomains+1 {
		t.Fatalf("%d series, want %d and the overflow", n, MaxUnknownDomains)
	}
	if got := testutil.ToFloat64(vec.WithLabelValues("junk-0")); got != 2 {
		t.Errorf("junk-0 = %v, want 2 (a known value keeps its series)", got)
	}
	if got := testutil.ToFloat64(vec.WithLabelValues(OverflowLabel)); got != 50 {
		t.Errorf("overflow = %v, want 50", got)
	}
	h2 := newHarness(t, mustParse(t, testRules), nil)
	h2.call(req(strings.Repeat("\xff", 10_000), desc("k", "v")))
	mfs, err := h2.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ratelimit_service_domain_not_found" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if v := m.GetLabel()[0].GetValue(); len(v) > 300 || !utf8.ValidString(v) {
				t.Errorf("label of %d bytes, valid UTF-8 %v", len(v), utf8.ValidString(v))
			}
		}
	}
}

func TestServiceMetrics(t *testing.T) {
	h := newHarness(t, mustParse(t, testRules, otherRules), func(o *Options) { o.ShadowMode = true })
	calls := []*rlsv3.RateLimitRequest{
		req("test", desc("ban", "x")),   // over, forced OK by global shadow
		req("test", desc("k", "exact")), // OK: no global shadow count
		req("nope", desc("k", "v")),
		req("", desc("k", "v")),
		req("test"),
	}
	for _, c := range calls {
		h.call(c)
	}
	for i := 0; i < 5; i++ {
		h.call(req(fmt.Sprintf("unknown-%d", i), desc("k", "v")))
	}
	if got := testutil.ToFloat64(h.svc.metrics.globalShadow); got != 1 {
		t.Errorf("global_shadow_mode = %v, want 1", got)
	}
	// Unknown domains are counted by domain, as envoyproxy/ratelimit's
	// per-domain stat (its TestBasicConfig): "nope", "", unknown-0..4.
	for domain, want := range map[string]float64{"nope": 1, "": 1, "unknown-0": 1, "unknown-4": 1, "test": 0} {
		if got := testutil.ToFloat64(h.svc.metrics.domainNotFound.vec.WithLabelValues(domain)); got != want {
			t.Errorf("domain_not_found{domain=%q} = %v, want %v", domain, got, want)
		}
	}

	// The exported names mirror envoyproxy/ratelimit's Prometheus mapping.
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	got := strings.Join(names, " ")
	for _, want := range []string{
		"ratelimit_service_rate_limit_total_hits", "ratelimit_service_rate_limit_over_limit",
		"ratelimit_service_rate_limit_near_limit", "ratelimit_service_rate_limit_within_limit",
		"ratelimit_service_rate_limit_shadow_mode", "leapgate_rate_limit_circuit_open_total",
		"ratelimit_service_global_shadow_mode", "ratelimit_service_domain_not_found",
		"ratelimit_service_should_rate_limit_error",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("metric %s not registered (have %s)", want, got)
		}
	}
	// A second service cannot register on the same registry: no silent sharing.
	if _, err := New(Options{Limiter: h.store, Registry: h.reg}); err == nil {
		t.Error("New registered its metrics twice on one registry")
	}
	if _, err := New(Options{Limiter: h.store, Registry: prometheus.NewRegistry()}); err != nil {
		t.Errorf("New on a fresh registry: %v", err)
	}
}

// tenRule is one limit of 10 a minute, for the near_limit edges.
const tenRule = `
domain: test
descriptors:
  - key: ten
    rate_limit: {unit: minute, requests_per_unit: 10}
`

// TestUnknownDomainLabelLength: an unknown domain of maxLoggedBytes is its
// own label; a longer one is cut to maxLoggedBytes and marked with "…".
func TestUnknownDomainLabelLength(t *testing.T) {
	h := newHarness(t, mustParse(t, testRules), nil)
	exact, long := strings.Repeat("a", maxLoggedBytes), strings.Repeat("b", maxLoggedBytes+1)
	h.call(req(exact, desc("k", "v")))
	h.call(req(long, desc("k", "v")))
	vec := h.svc.metrics.domainNotFound.vec
	for label, want := range map[string]float64{exact: 1, long[:maxLoggedBytes] + "…": 1, long: 0} {
		if got := testutil.ToFloat64(vec.WithLabelValues(label)); got != want {
			t.Errorf("domain_not_found{domain of %d bytes} = %v, want %v", len(label), got, want)
		}
	}
}
