package service

import (
	"os"
	"path/filepath"
	"testing"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/ruletest"
)

// The tests in this file play the quota-mode tests of envoyproxy/ratelimit's
// test/service/ratelimit_test.go (commit f2fb157, Apache-2.0, copyright the
// Envoy Project Authors) against Leapgate: each row names the upstream
// test, sends its request, and requires its codes (every status and the
// overall code), its global_shadow_mode count and its dynamic metadata.
// Upstream mocks its cache's answers; here a descriptor is made OVER_LIMIT
// as a client would: with a hits_addend above its limit. The remaining
// quota and resets are Leapgate's own (sliding windows, refused hits not
// counted; see docs/migrating.md), so they are not compared.

// upstreamQuotaRules reads testdata/upstream_quota.yaml.
func upstreamQuotaRules(t *testing.T) *descriptors.Set {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "upstream_quota.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return ruletest.ParseFiles(t, descriptors.Options{}, descriptors.File{Name: "upstream_quota.yaml", Data: data})
}

func TestUpstreamQuotaMode(t *testing.T) {
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	// d is a descriptor key=value with hits; over makes it exceed any limit
	// of the fixture (all are at most 10).
	type d struct {
		key, value string
		over       bool
	}
	for _, tt := range []struct {
		test                 string // envoyproxy/ratelimit's test
		quota, shadow, meta  bool   // QUOTA_MODE, SHADOW_MODE, RESPONSE_DYNAMIC_METADATA
		descs                []d
		codes                []rlsv3.RateLimitResponse_Code
		overall              rlsv3.RateLimitResponse_Code
		globalShadow         float64
		metadata             map[string]any // the "metadata" field; nil: absent
		metadataFieldsAbsent []string
	}{
		{test: "TestServiceGlobalQuotaMode", quota: true,
			descs: []d{{"foo", "bar", true}, {"hello", "world", true}},
			codes: []rlsv3.RateLimitResponse_Code{over, over}, overall: over},
		{test: "TestServiceGlobalQuotaMode (one of two over)", quota: true,
			descs: []d{{"foo", "bar", true}, {"hello", "world", false}},
			codes: []rlsv3.RateLimitResponse_Code{over, ok}, overall: ok},
		{test: "TestMetadataReturnedForPassedDescriptors", quota: true, meta: true,
			descs: []d{{"regular", "limit", false}, {"quota", "limit", true}},
			codes: []rlsv3.RateLimitResponse_Code{ok, over}, overall: ok,
			metadata: map[string]any{"name": "service_1"}, metadataFieldsAbsent: []string{"quotaModeViolations", "quotaModeEnabled"}},
		{test: "TestMetadataReturnedForAllPassedDescriptors", quota: true, meta: true,
			descs: []d{{"first", "limit", false}, {"second", "distinct", false}},
			codes: []rlsv3.RateLimitResponse_Code{ok, ok}, overall: ok,
			metadata: map[string]any{"name": "service_1", "some_other_name": "service_2"}},
		{test: "TestOverlappingMetadataReturnsTheFirstValue", quota: true, meta: true,
			descs: []d{{"first", "limit", false}, {"second", "clashing", false}},
			codes: []rlsv3.RateLimitResponse_Code{ok, ok}, overall: ok,
			metadata: map[string]any{"name": "service_1"}},
		{test: "TestServicePerDescriptorQuotaMode",
			descs: []d{{"regular", "limit", true}, {"quota", "limit", false}},
			codes: []rlsv3.RateLimitResponse_Code{over, ok}, overall: over},
		{test: "TestServiceMixedPerDescriptorModes",
			descs: []d{{"regular", "limit", false}, {"quota", "limit", true}},
			codes: []rlsv3.RateLimitResponse_Code{ok, over}, overall: over},
		{test: "TestServiceMixedPerDescriptorModesUnderLimit",
			descs: []d{{"regular", "limit", false}, {"quota", "limit", false}},
			codes: []rlsv3.RateLimitResponse_Code{ok, ok}, overall: ok},
		{test: "TestServiceQuotaModeOnlyAllOverTheLimit",
			descs: []d{{"quota1", "limit", true}, {"quota2", "limit", true}},
			codes: []rlsv3.RateLimitResponse_Code{over, over}, overall: over},
		{test: "TestServiceQuotaModeOnlySomeOverTheLimit",
			descs: []d{{"quota1", "limit", true}, {"quota2", "limit", false}},
			codes: []rlsv3.RateLimitResponse_Code{over, ok}, overall: ok},
		{test: "TestServiceQuotaModeWithShadowMode", shadow: true,
			descs: []d{{"quota1", "limit", true}, {"quota2", "limit", true}},
			codes: []rlsv3.RateLimitResponse_Code{over, over}, overall: ok, globalShadow: 1},
		{test: "TestServiceMixedModeWithShadowMode", shadow: true,
			descs: []d{{"regular", "limit", true}, {"quota", "limit", true}},
			codes: []rlsv3.RateLimitResponse_Code{over, over}, overall: ok, globalShadow: 1},
	} {
		t.Run(tt.test, func(t *testing.T) {
			h := newHarness(t, upstreamQuotaRules(t), func(o *Options) {
				o.QuotaMode, o.ShadowMode, o.DynamicMetadata = tt.quota, tt.shadow, tt.meta
			})
			var ds []*rlcommonv3.RateLimitDescriptor
			for _, x := range tt.descs {
				n := uint64(1)
				if x.over {
					n = 100
				}
				ds = append(ds, with(desc(x.key, x.value), hits(n)))
			}
			resp, err := h.call(req("quota-domain", ds...))
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetOverallCode() != tt.overall {
				t.Errorf("overall %v, want %v", resp.GetOverallCode(), tt.overall)
			}
			for i, st := range resp.GetStatuses() {
				if st.GetCode() != tt.codes[i] {
					t.Errorf("status %d: %v, want %v", i, st.GetCode(), tt.codes[i])
				}
			}
			if got := testutil.ToFloat64(h.svc.metrics.globalShadow); got != tt.globalShadow {
				t.Errorf("global_shadow_mode = %v, want %v", got, tt.globalShadow)
			}
			if !tt.meta {
				return
			}
			fields := resp.GetDynamicMetadata().GetFields()
			if tt.metadata == nil {
				if _, has := fields["metadata"]; has {
					t.Errorf("metadata %v, want none", fields["metadata"])
				}
			} else if want, _ := structpb.NewStruct(tt.metadata); !proto.Equal(fields["metadata"].GetStructValue(), want) {
				t.Errorf("metadata %v, want %v", fields["metadata"], tt.metadata)
			}
			for _, f := range tt.metadataFieldsAbsent {
				if _, has := fields[f]; has {
					t.Errorf("dynamic metadata has %s, which envoyproxy/ratelimit no longer sends", f)
				}
			}
		})
	}
}

// TestUpstreamDomainNotFound is envoyproxy/ratelimit's TestBasicConfig on
// its basic_config.yaml: a request for foo_domain, which no file defines,
// counts domain_not_found for foo_domain and not for test-domain.
func TestUpstreamDomainNotFound(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "descriptors", "testdata", "upstream", "basic_config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, ruletest.ParseFiles(t, descriptors.Options{}, descriptors.File{Name: "basic_config.yaml", Data: data}), nil)
	vec := h.svc.metrics.domainNotFound.vec
	if got := testutil.ToFloat64(vec.WithLabelValues("foo_domain")); got != 0 {
		t.Fatalf("before: %v", got)
	}
	if _, err := h.call(req("foo_domain", desc("key1", "x"))); err != nil {
		t.Fatal(err)
	}
	if _, err := h.call(req("test-domain", desc("key1", "something"))); err != nil {
		t.Fatal(err)
	}
	if a, b := testutil.ToFloat64(vec.WithLabelValues("foo_domain")), testutil.ToFloat64(vec.WithLabelValues("test-domain")); a != 1 || b != 0 {
		t.Fatalf("domain_not_found: foo_domain %v, test-domain %v; want 1 and 0", a, b)
	}
}
