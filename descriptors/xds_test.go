package descriptors

import (
	"reflect"
	"testing"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
)

func TestFromProto(t *testing.T) {
	cfgs := []*rlsconfv3.RateLimitConfig{{
		Name:   "rls-web",
		Domain: "web",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{
				Key: "user",
				RateLimit: &rlsconfv3.RateLimitPolicy{
					Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 10, Name: "per_user",
					Replaces: []*rlsconfv3.RateLimitReplace{{Name: "global"}},
				},
				ShadowMode:     true,
				DetailedMetric: true,
			},
			{Key: "svc", Value: "api", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
				Key: "path", Value: "/v1/*",
				RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 5},
			}}},
			{Key: "free", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true, Name: "global"}},
			nil,
		},
	}, nil}
	s, err := FromProto(cfgs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	user := s.Match("web", entries("user", "alice"))
	if user == nil {
		t.Fatal("no rule for user")
	}
	wantLimits := []Limit{{Name: "per_user", RequestsPerUnit: 10, Unit: UnitMinute, UnitMultiplier: 1}}
	if !reflect.DeepEqual(layoutless(user.Limits), wantLimits) || !user.ShadowMode || !user.DetailedMetric ||
		!reflect.DeepEqual(user.Replaces, []string{"global"}) || user.File != "xds:rls-web" {
		t.Errorf("user rule = %+v", user)
	}
	if r := s.Match("web", entries("svc", "api", "path", "/v1/x")); r == nil || r.ID != "web.svc_api.path_/v1/*" {
		t.Errorf("wildcard rule = %+v", r)
	}
	if r := s.Match("web", entries("free", "x")); r == nil || !r.Unlimited {
		t.Errorf("unlimited rule = %+v", r)
	}
}

func TestFromProtoErrors(t *testing.T) {
	limit := func(u rlsconfv3.RateLimitUnit) *rlsconfv3.RateLimitPolicy {
		return &rlsconfv3.RateLimitPolicy{Unit: u, RequestsPerUnit: 1}
	}
	tests := []struct {
		name string
		cfgs []*rlsconfv3.RateLimitConfig
		want []string
	}{
		{"empty domain", []*rlsconfv3.RateLimitConfig{{Name: "a"}},
			[]string{"xds:a: config file cannot have empty domain"}},
		{"duplicate domain", []*rlsconfv3.RateLimitConfig{{Name: "a", Domain: "d"}, {Name: "b", Domain: "d"}},
			[]string{"xds:b: duplicate domain 'd' in config file (first defined at xds:a)"}},
		{"empty key and unset unit", []*rlsconfv3.RateLimitConfig{{Name: "a", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Value: "x"},
			{Key: "k", RateLimit: limit(rlsconfv3.RateLimitUnit_UNKNOWN)},
			{Key: "u", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true, Unit: rlsconfv3.RateLimitUnit_SECOND}},
			{Key: "n", RateLimit: limit(42)},
		}}}, []string{
			"xds:a: descriptor has empty key",
			"xds:a: invalid rate limit unit 'UNKNOWN'",
			"xds:a: should not specify rate limit unit when unlimited",
			"xds:a: invalid rate limit unit '42'",
		}},
		{"duplicate key and replaces", []*rlsconfv3.RateLimitConfig{{Name: "a", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "k", Value: "v"},
			{Key: "k", Value: "v"},
			{Key: "r", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_DAY, Name: "me",
				Replaces: []*rlsconfv3.RateLimitReplace{{Name: "me"}, {}}}},
		}}}, []string{
			"xds:a: duplicate descriptor composite key 'd.k_v'",
			"xds:a: should not have an empty replaces entry",
			"xds:a: replaces should not contain name of same descriptor",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := FromProto(tt.cfgs, Options{})
			if s != nil {
				t.Error("a Set was returned with errors")
			}
			var got []string
			for _, e := range unwrapErrors(t, err) {
				got = append(got, e.Error())
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("errors:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}
