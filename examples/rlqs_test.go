package examples

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	rlqfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/rlqs/rlqssim"
)

const (
	rlqsConfigPath = "rlqs/envoy.yaml"
	rlqsRulesDir   = "rlqs/config"
)

// Named so that protojson resolves their "@type" URLs.
var _ = []proto.Message{&rlqfilterv3.RateLimitQuotaFilterConfig{}, &rlqfilterv3.RateLimitQuotaBucketSettings{}, &matcherv3.HttpRequestHeaderMatchInput{}}

// rlqsFacts are what the RLQS example configures.
type rlqsFacts struct {
	filters  []*rlqfilterv3.RateLimitQuotaFilterConfig
	settings []*rlqfilterv3.RateLimitQuotaBucketSettings
	token    string // the bearer token of the rlqs_server's initial_metadata
}

// checkRLQSExample validates an Envoy bootstrap with a rate_limit_quota
// filter: Envoy's protos and PGV rules, cluster references, and what
// Envoy's filter really does (docs/rlqs.md): every bucket id it can build
// (sample header values for custom values) matches a limiting rule of its
// domain, no_assignment_behavior is not a token bucket (Envoy's code says
// it would crash), expired_assignment_behavior has a fallback and does not
// rely on reuse_last_assignment (not implemented), and the reporting
// interval is set.
func checkRLQSExample(data []byte, set *descriptors.Set) (*rlqsFacts, error) {
	var bs bootstrapv3.Bootstrap
	if err := parseYAML(data, &bs); err != nil {
		return nil, err
	}
	f, err := collectFacts(&bs)
	if err != nil {
		return nil, err
	}
	var rf rlqsFacts
	_ = validateDeep(&bs, func(m proto.Message) {
		switch m := m.(type) {
		case *rlqfilterv3.RateLimitQuotaFilterConfig:
			rf.filters = append(rf.filters, m)
			for _, kv := range m.GetRlqsServer().GetInitialMetadata() {
				if kv.GetKey() == "authorization" {
					rf.token = kv.GetValue()[len("Bearer "):]
				}
			}
		case *rlqfilterv3.RateLimitQuotaBucketSettings:
			rf.settings = append(rf.settings, m)
		}
	})
	errs := []error{checkClusterRefs(f)}
	if len(rf.filters) == 0 || len(rf.settings) == 0 {
		errs = append(errs, errors.New("no rate_limit_quota filter with bucket settings"))
	}
	for _, flt := range rf.filters {
		if !set.HasDomain(flt.GetDomain()) {
			errs = append(errs, errors.New("the filter's domain "+flt.GetDomain()+" has no rules"))
		}
		for _, s := range rf.settings {
			for _, sample := range []string{"acme", "free-7"} {
				id := map[string]string{}
				for k, v := range s.GetBucketIdBuilder().GetBucketIdBuilder() {
					if v.GetCustomValue() != nil {
						id[k] = sample
					} else {
						id[k] = v.GetStringValue()
					}
				}
				if r, _ := set.MatchUnordered(flt.GetDomain(), id); r == nil || len(r.Limits) == 0 {
					errs = append(errs, errors.New("a bucket id the filter builds matches no limiting rule"))
				}
			}
			if s.GetNoAssignmentBehavior().GetFallbackRateLimit().GetTokenBucket() != nil {
				errs = append(errs, errors.New("no_assignment_behavior is a token bucket: Envoy's filter would crash"))
			}
			exp := s.GetExpiredAssignmentBehavior()
			if exp.GetReuseLastAssignment() != nil || exp.GetFallbackRateLimit() == nil {
				errs = append(errs, errors.New("expired_assignment_behavior needs a fallback_rate_limit (reuse_last_assignment is not implemented by Envoy)"))
			}
			if s.GetReportingInterval().AsDuration() < time.Second {
				errs = append(errs, errors.New("reporting_interval is not set to a second or more"))
			}
		}
	}
	return &rf, errors.Join(errs...)
}

// TestRLQSExample validates examples/rlqs/envoy.yaml offline, and that its
// token is the compose demo's FEED_TOKEN.
func TestRLQSExample(t *testing.T) {
	rf, err := checkRLQSExample(readFile(t, rlqsConfigPath), loadRules(t, rlqsRulesDir))
	if err != nil {
		t.Fatalf("%s: %v", rlqsConfigPath, err)
	}
	if want := env(loadCompose(t).Services["ratelimit"], "FEED_TOKEN"); rf.token != want {
		t.Errorf("the RLQS example sends token %q, the compose demo's FEED_TOKEN is %q", rf.token, want)
	}
}

// TestRLQSExampleCatchesBreakage: each broken variant of the example is
// refused.
func TestRLQSExampleCatchesBreakage(t *testing.T) {
	good := string(readFile(t, rlqsConfigPath))
	for name, edit := range map[string][2]string{
		"unknown domain":                  {"domain: rlqs-demo", "domain: nope"},
		"token bucket on no assignment":   {"fallback_rate_limit: { blanket_rule: ALLOW_ALL }", "fallback_rate_limit: { token_bucket: { max_tokens: 1, tokens_per_fill: 1, fill_interval: 1s } }"},
		"bucket id no rule matches":       {"name: { string_value: api }", "name: { string_value: web }"},
		"no reporting interval":           {"reporting_interval: 5s", ""},
		"an unknown cluster":              {"envoy_grpc: { cluster_name: ratelimit }", "envoy_grpc: { cluster_name: rl }"},
		"a misspelt field Envoy refuses":  {"bucket_matchers:", "bucket_matcher:"},
		"reuse_last_assignment on expiry": {"expired_assignment_behavior_timeout: 60s", "expired_assignment_behavior_timeout: 60s\n                            reuse_last_assignment: {}"},
	} {
		t.Run(name, func(t *testing.T) {
			if !strings.Contains(good, edit[0]) {
				t.Fatalf("the example no longer contains %q", edit[0])
			}
			bad := strings.Replace(good, edit[0], edit[1], 1)
			if _, err := checkRLQSExample([]byte(bad), loadRules(t, rlqsRulesDir)); err == nil {
				t.Errorf("the broken example was accepted")
			}
		})
	}
}

// TestRLQSExampleFleet runs the example's rules in the real binary, open
// to the network as in a cluster: a stream from another host without the
// example's token is UNAUTHENTICATED before it claims any share; three
// simulated Envoys with the token, offering 80, 80 and 10 requests per
// second for tenant acme (100 per second), share the limit by demand.
func TestRLQSExampleFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the real binary")
	}
	rf, err := checkRLQSExample(readFile(t, rlqsConfigPath), loadRules(t, rlqsRulesDir))
	if err != nil {
		t.Fatal(err)
	}
	lg := startLeapgate(t, ".", "rlqs", "config", "GRPC_HOST=0.0.0.0", "FEED_TOKEN="+rf.token)
	addr := lg.GRPCAddr
	if host := hostAddress(); host != "" {
		_, port, _ := net.SplitHostPort(lg.GRPCAddr)
		addr = net.JoinHostPort(host, port)
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = s.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "rlqs-demo", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId: &rlqspb.BucketId{Bucket: map[string]string{"name": "api", "tenant": "acme"}}, TimeElapsed: &durationpb.Duration{}, NumRequestsAllowed: 1}}})
		if _, err := s.Recv(); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("an RLQS stream from %s without the token: %v, want UNAUTHENTICATED", host, err)
		}
	}
	tr, err := rlqssim.DialGRPC(addr, rf.token)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	bucket := map[string]string{"name": "api", "tenant": "acme"}
	sc := rlqssim.Scenario{Name: "example", Domain: "rlqs-demo", Limit: 100, Window: time.Second, Duration: 10 * time.Second,
		Clients: []rlqssim.Client{
			{Name: "envoy-1", Bucket: bucket, Load: []rlqssim.Phase{{Rate: 80}}, Report: time.Second},
			{Name: "envoy-2", Bucket: bucket, Load: []rlqssim.Phase{{Rate: 80}}, Report: time.Second},
			{Name: "envoy-3", Bucket: bucket, Load: []rlqssim.Phase{{Rate: 10}}, Report: time.Second},
		}}
	r := rlqssim.Run(sc, tr)
	t.Log(r)
	if len(r.Errors) > 0 || r.PeakSettled > 1.05 || r.UsedLast < 0.85 {
		t.Errorf("the fleet: %v; want no protocol error, a settled peak ≤ 1.05 × the limit and ≥ 85 %% of it used", r)
	}
}
