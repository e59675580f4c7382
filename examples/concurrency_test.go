package examples

import (
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/leapgate/leapgate/descriptors"
)

const (
	concurrencyConfigPath = "concurrency/envoy.yaml"
	concurrencyRulesDir   = "concurrency/config"
)

// TestConcurrencyExample validates examples/concurrency/envoy.yaml against
// Envoy's protos and PGV rules and its descriptors against the example's
// rules: a request-phase hit and a stream-done refund, both naming the
// request by its x-request-id, matched by the concurrency_limit rule.
func TestConcurrencyExample(t *testing.T) {
	set := loadRules(t, concurrencyRulesDir)
	f, err := checkBootstrap(readFile(t, concurrencyConfigPath), set)
	if err != nil {
		t.Fatalf("%s: %v", concurrencyConfigPath, err)
	}
	_, start, done := streamRateLimits(t, f, "upload")
	if start.GetHitsAddend().GetIsNegativeHits() || !done.GetHitsAddend().GetIsNegativeHits() {
		t.Fatalf("want a hit at the start and a refund at stream end, got %v and %v", start.GetHitsAddend(), done.GetHitsAddend())
	}
	rds, err := routeDescriptors(f, nil)
	if err != nil || len(rds) == 0 {
		t.Fatalf("route descriptors: %v, %v", rds, err)
	}
	for _, rd := range rds {
		r, depth, holder := set.MatchHolder(rd.Filter.Config.GetDomain(), rd.Entries)
		if r == nil || r.HolderKey == "" || holder == "" || depth != len(rd.Entries)-1 {
			t.Errorf("descriptor %v matches %v (holder %q): want the concurrency rule, named by the request", rd.Entries, r, holder)
		}
	}
}

// TestConcurrencyExampleCalls plays the example's calls against the real
// binary serving its rules: the cap's requests start, one more is refused
// (a 429), one ends, and the refused one then starts. Run with -v to see
// the calls.
func TestConcurrencyExampleCalls(t *testing.T) {
	set := loadRules(t, concurrencyRulesDir)
	f, err := checkBootstrap(readFile(t, concurrencyConfigPath), set)
	if err != nil {
		t.Fatal(err)
	}
	route, start, done := streamRateLimits(t, f, "upload")
	domain := f.RateLimits[0].Config.GetDomain()
	lg := startLeapgate(t, ".", "concurrency", "config")
	conn, err := grpc.NewClient(lg.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	e := &fakeEnvoy{t: t, facts: f, rls: rlsv3.NewRateLimitServiceClient(conn)}
	request := func(id string) downstream {
		return downstream{Route: "upload", Headers: map[string]string{"x-request-id": id}}
	}
	rs, _, _ := set.MatchHolder(domain, []descriptors.Entry{{Key: "generic_key", Value: "uploads"}, {Key: "request_id", Value: "x"}})
	limit := int(rs.Limits[0].RequestsPerUnit)
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	expect := func(resp *rlsv3.RateLimitResponse, code rlsv3.RateLimitResponse_Code) {
		t.Helper()
		if resp.GetOverallCode() != code {
			t.Fatalf("%v, want %v", resp, code)
		}
	}
	for i := range limit {
		id := fmt.Sprintf("req-%d", i+1)
		expect(e.streamCall(id+" starts", domain, route, start, request(id), nil), ok)
	}
	extra := fmt.Sprintf("req-%d", limit+1)
	expect(e.streamCall(extra+" starts (429)", domain, route, start, request(extra), nil), over)
	expect(e.streamCall("req-1 ends", domain, route, done, request("req-1"), nil), ok)
	expect(e.streamCall("req-1's refund again", domain, route, done, request("req-1"), nil), ok)
	expect(e.streamCall(extra+" starts", domain, route, start, request(extra), nil), ok)
	expect(e.streamCall("req-12 starts (429: req-1's second refund freed nothing)", domain, route, start, request("req-12"), nil), over)
}
