package examples

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"

	"github.com/leapgate/leapgate/descriptors"
)

const (
	envoyConfigPath = "envoy/envoy.yaml"
	envoyRulesDir   = "envoy/config"
)

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.FromSlash(path))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func loadRules(t *testing.T, dir string) *descriptors.Set {
	t.Helper()
	set, err := descriptors.Load(filepath.FromSlash(dir), descriptors.Options{})
	if err != nil {
		t.Fatalf("rules in %s: %v", dir, err)
	}
	return set
}

// TestEnvoyExample validates examples/envoy/envoy.yaml against Envoy's
// schema and PGV rules (inside every Any), its cluster references, and the
// rules in examples/envoy/config.
func TestEnvoyExample(t *testing.T) {
	set := loadRules(t, envoyRulesDir)
	f, err := checkBootstrap(readFile(t, envoyConfigPath), set)
	if err != nil {
		t.Fatalf("%s: %v", envoyConfigPath, err)
	}
	// The demo's promises, so the checks above cannot pass vacuously.
	if len(f.RateLimits) != 2 {
		t.Errorf("want 2 ratelimit filters (rate limits, breakers), got %d", len(f.RateLimits))
	}
	for _, flt := range f.RateLimits {
		c := flt.Config
		if c.GetFailureModeDeny() {
			t.Errorf("filter %s: failure_mode_deny must be false (fail open)", flt.Name)
		}
		if c.GetTimeout().AsDuration() <= 0 {
			t.Errorf("filter %s: no timeout", flt.Name)
		}
		switch c.GetStage() {
		case 0:
			if c.GetEnableXRatelimitHeaders().String() != "DRAFT_VERSION_03" {
				t.Errorf("filter %s: enable_x_ratelimit_headers = %v", flt.Name, c.GetEnableXRatelimitHeaders())
			}
			if code := c.GetRateLimitedStatus().GetCode(); code != 0 && code != 429 {
				t.Errorf("filter %s: rate-limited status %d, want 429", flt.Name, code)
			}
		case 1:
			if code := c.GetRateLimitedStatus().GetCode(); code != 503 {
				t.Errorf("filter %s: breaker stage answers %d, want 503", flt.Name, code)
			}
		}
	}
	rds, err := routeDescriptors(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	var breakerDescriptors, limitDescriptors int
	for _, rd := range rds {
		rule := set.Match(rd.Filter.Config.GetDomain(), rd.Entries)
		if rule.Breaker != nil {
			breakerDescriptors++
		}
		if len(rule.Limits) > 0 {
			limitDescriptors++
		}
	}
	if breakerDescriptors == 0 || limitDescriptors == 0 {
		t.Errorf("descriptors with breakers: %d, with limits: %d; want both > 0", breakerDescriptors, limitDescriptors)
	}
	if c := f.Clusters["ratelimit"]; c == nil || c.GetCircuitBreakers().GetThresholds()[0].GetMaxRequests().GetValue() <= 1024 {
		t.Errorf("ratelimit cluster must raise max_requests above Envoy's default 1024 (one ext_proc stream per in-flight request)")
	}
}

// TestEnvoyValidatorCatchesBreakage mutates the real example and checks the
// validator reports each breakage: the negative proof that the checks above
// can fail.
func TestEnvoyValidatorCatchesBreakage(t *testing.T) {
	good := string(readFile(t, envoyConfigPath))
	set := loadRules(t, envoyRulesDir)
	tests := []struct {
		name      string
		old, new  string
		wantError string
		// shallowPasses: Bootstrap.ValidateAll alone accepts the broken
		// config (the error is only found inside an Any or by cross-ref).
		shallowPasses bool
	}{
		{name: "typo in a filter field", old: "failure_mode_deny: false         # fail open", new: "failure_mode_denny: false", wantError: `unknown field "failure_mode_denny"`},
		{name: "unknown @type", old: "ratelimit.v3.RateLimit\n              domain: edge", new: "ratelimit.v3.RateLimits\n              domain: edge", wantError: "unable to resolve"},
		{name: "bad enum", old: "DRAFT_VERSION_03", new: "DRAFT_VERSION_04", wantError: "DRAFT_VERSION_04"},
		{name: "bad duration", old: "timeout: 0.05s                  #", new: "timeout: 50ms #", wantError: "Duration"},
		{name: "stage out of range inside Any", old: "stage: 1\n              timeout", new: "stage: 11\n              timeout", wantError: "Stage", shallowPasses: true},
		{name: "empty domain inside Any", old: "domain: edge", new: `domain: ""`, wantError: "Domain", shallowPasses: true},
		{name: "request_headers without header_name", old: "header_name: x-user-id, ", new: "", wantError: "HeaderName", shallowPasses: true},
		{name: "ext_proc to unknown cluster", old: "grpc_service:\n                envoy_grpc: { cluster_name: ratelimit }", new: "grpc_service:\n                envoy_grpc: { cluster_name: leapgate }", wantError: `unknown cluster "leapgate"`, shallowPasses: true},
		{name: "route to unknown cluster", old: "route: { cluster: backend }", new: "route: { cluster: backnd }", wantError: `unknown cluster "backnd"`, shallowPasses: true},
		{name: "gRPC cluster without HTTP/2", old: "http2_protocol_options: {}   # gRPC needs HTTP/2", new: "http_protocol_options: {}", wantError: "does not enable HTTP/2", shallowPasses: true},
		{name: "port out of range", old: "port_value: 8081", new: "port_value: 80810", wantError: "PortValue"},
		{name: "descriptor no rule matches", old: "descriptor_value: checkout }\n                    - remote_address", new: "descriptor_value: checkout2 }\n                    - remote_address", wantError: "matches no rule", shallowPasses: true},
		{name: "stage no filter evaluates", old: "- stage: 1\n                    actions:\n                    - destination_cluster: {}\n              # /checkout", new: "- stage: 2\n                    actions:\n                    - destination_cluster: {}\n              # /checkout", wantError: "evaluated by no ratelimit filter", shallowPasses: true},
		{name: "domain without rules", old: "domain: breaker", new: "domain: breakers", wantError: `no rules for domain "breakers"`, shallowPasses: true},
		{name: "ext_proc without the route attribute", old: "- xds.route_name\n", new: "", wantError: "xds.route_name", shallowPasses: true},
		{name: "ext_proc blocking", old: "observability_mode: true", new: "observability_mode: false", wantError: "observability_mode", shallowPasses: true},
		{name: "remote_address without trusted address", old: "use_remote_address: true", new: "use_remote_address: false", wantError: "remote_address", shallowPasses: true},
		{name: "unnamed route", old: "- name: checkout\n                match:", new: "- match:", wantError: "no name", shallowPasses: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if strings.Count(good, tt.old) != 1 {
				t.Fatalf("mutation anchor %q found %d times in %s; fix the test", tt.old, strings.Count(good, tt.old), envoyConfigPath)
			}
			broken := []byte(strings.Replace(good, tt.old, tt.new, 1))
			_, err := checkBootstrap(broken, set)
			if err == nil || !strings.Contains(err.Error(), tt.wantError) {
				t.Fatalf("validator error = %v; want one containing %q", err, tt.wantError)
			}
			var bs bootstrapv3.Bootstrap
			shallowErr := parseYAML(broken, &bs)
			if shallowErr == nil {
				shallowErr = bs.ValidateAll()
			}
			if (shallowErr == nil) != tt.shallowPasses {
				t.Errorf("plain parse+ValidateAll error = %v; shallowPasses = %v", shallowErr, tt.shallowPasses)
			}
		})
	}
}

// TestRulesBreakageCaught mutates the example rules and checks the
// validator reports each mismatch with the Envoy config.
func TestRulesBreakageCaught(t *testing.T) {
	edge := string(readFile(t, envoyRulesDir+"/edge.yaml"))
	breaker := string(readFile(t, envoyRulesDir+"/breaker.yaml"))
	tests := []struct {
		name      string
		file      *string // which file to mutate
		old, new  string
		wantError string
	}{
		{name: "breaker on a route Envoy does not have", file: &breaker, old: "value: checkout", new: "value: checkot", wantError: `route="checkot"`},
		{name: "breaker on a cluster Envoy does not have", file: &breaker, old: "value: backend", new: "value: orders", wantError: `destination_cluster="orders"`},
		{name: "breaker descriptor hits a rule without breaker", file: &breaker,
			old: "circuit_breaker:\n      strategy: slow_request_ratio\n      max_response_time: 500ms\n      threshold: 0.5\n      min_requests: 5\n      window: 10s\n      buckets: 10\n      open_duration: 10s\n      half_open_probes: 2\n      probe_timeout: 5s",
			new: "rate_limit: {unit: second, requests_per_unit: 100}", wantError: "no circuit_breaker"},
		{name: "per-user rule renamed", file: &edge, old: "- key: user", new: "- key: user_id", wantError: `{user alice}] in domain "edge" matches no rule`},
		{name: "per-IP rule pinned to one address", file: &edge, old: "- key: remote_address\n        rate_limit:\n          name: api-per-ip", new: "- key: remote_address\n        value: 192.0.2.1\n        rate_limit:\n          name: api-per-ip", wantError: "198.51.100.7"},
		{name: "domain renamed", file: &edge, old: "domain: edge", new: "domain: gateway", wantError: `no rules for domain "edge"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig := *tt.file
			defer func() { *tt.file = orig }()
			if strings.Count(orig, tt.old) != 1 {
				t.Fatalf("mutation anchor %q found %d times; fix the test", tt.old, strings.Count(orig, tt.old))
			}
			*tt.file = strings.Replace(orig, tt.old, tt.new, 1)
			set, err := descriptors.Parse([]descriptors.File{{Name: "edge.yaml", Data: []byte(edge)}, {Name: "breaker.yaml", Data: []byte(breaker)}}, descriptors.Options{})
			if err != nil {
				t.Fatalf("mutated rules do not load: %v", err)
			}
			_, err = checkBootstrap(readFile(t, envoyConfigPath), set)
			if err == nil || !strings.Contains(err.Error(), tt.wantError) {
				t.Fatalf("validator error = %v; want one containing %q", err, tt.wantError)
			}
		})
	}
}
