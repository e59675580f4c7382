package examples

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leapgate/leapgate/descriptors"
)

const (
	budgetConfigPath = "budget/envoy.yaml"
	budgetRulesDir   = "budget/config"
)

// TestBudgetExample validates examples/budget/envoy.yaml against Envoy's
// protos and PGV rules, its descriptors against the example's rules, and
// the shape of a budget: a check that charges nothing, a charge at stream
// end from the response, and a rule that charges always.
func TestBudgetExample(t *testing.T) {
	set := loadRules(t, budgetRulesDir)
	f, err := checkBootstrap(readFile(t, budgetConfigPath), set)
	if err != nil {
		t.Fatalf("%s: %v", budgetConfigPath, err)
	}
	_, check, charge := streamRateLimits(t, f, "llm")
	if h := check.GetHitsAddend(); h.GetNumber() == nil || h.GetNumber().GetValue() != 0 || h.GetFormat() != "" {
		t.Errorf("the request-phase check must send hits_addend 0, got %v", h)
	}
	if got := charge.GetHitsAddend().GetFormat(); got != "%RESP(x-usage-tokens)%" {
		t.Errorf("the stream-done charge must take its hits from the response, got %q", got)
	}
	rds, err := routeDescriptors(f, nil)
	if err != nil || len(rds) == 0 {
		t.Fatalf("route descriptors: %v, %v", rds, err)
	}
	for _, rd := range rds {
		r := set.Match(rd.Filter.Config.GetDomain(), rd.Entries)
		if r == nil || len(r.Limits) == 0 || !r.Limits[0].ChargeAlways {
			t.Errorf("descriptor %v matches %v, want a rule with charge: always", rd.Entries, r)
		}
	}
}

// TestBudgetExampleCalls plays the budget example's two calls per request,
// as its Envoy makes them, against the real binary serving the example's
// rules with the window shortened to 1s: a check (OK), a charge of 150% of
// the budget from the response's x-usage-tokens (recorded, OVER_LIMIT, which
// Envoy ignores), the next request's check (OVER_LIMIT: a 429), and, once the
// window has passed (after the refusal's duration_until_reset), a check that
// is OK again. Run with -v to see the calls.
func TestBudgetExampleCalls(t *testing.T) {
	rules := strings.Replace(string(readFile(t, budgetRulesDir+"/budget.yaml")), "unit: hour", "window: 1s", 1)
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "budget", "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "budget", "config", "budget.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := checkBootstrap(readFile(t, budgetConfigPath), loadRules(t, budgetRulesDir))
	if err != nil {
		t.Fatal(err)
	}
	route, check, charge := streamRateLimits(t, f, "llm")
	domain := f.RateLimits[0].Config.GetDomain()
	lg := startLeapgate(t, root, "budget", "config")
	conn, err := grpc.NewClient(lg.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	e := &fakeEnvoy{t: t, facts: f, rls: rlsv3.NewRateLimitServiceClient(conn)}
	req := downstream{Route: "llm", Headers: map[string]string{"x-user-id": "alice"}}
	budget := uint64(loadRules(t, budgetRulesDir).Match(domain, []descriptors.Entry{{Key: "user", Value: "alice"}}).Limits[0].RequestsPerUnit)

	call := func(what string, rl *routev3.RateLimit, response map[string]string) *rlsv3.RateLimitResponse {
		t.Helper()
		return e.streamCall(what, domain, route, rl, req, response)
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	expect := func(resp *rlsv3.RateLimitResponse, code rlsv3.RateLimitResponse_Code, remaining uint64) {
		t.Helper()
		if s := resp.GetStatuses()[0]; resp.GetOverallCode() != code || uint64(s.GetLimitRemaining()) != remaining {
			t.Fatalf("%v, want %v with %d remaining", resp, code, remaining)
		}
	}
	usage := map[string]string{"x-usage-tokens": strconv.FormatUint(budget*3/2, 10)}

	expect(call("request 1: check", check, nil), ok, budget)
	charged := time.Now()
	expect(call("request 1: charge at stream end", charge, usage), over, 0)
	refused := call("request 2: check", check, nil)
	expect(refused, over, 0)
	reset := refused.GetStatuses()[0].GetDurationUntilReset().AsDuration()
	if reset <= 0 || reset > time.Second+time.Millisecond {
		t.Fatalf("request 2: reset %v, want within the 1s window", reset)
	}
	// The reset is an honest Retry-After: a check once it has passed is OK.
	time.Sleep(reset)
	if waited := time.Since(charged); waited < time.Second-50*time.Millisecond {
		t.Fatalf("a debt in a 1s window was said to be paid after %v", waited)
	}
	expect(call("request 3: check", check, nil), ok, budget)
}
