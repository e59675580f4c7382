package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

const breakerRules = `domain: breaker
descriptors:
  - key: destination_cluster
    value: backend
    circuit_breaker:
      strategy: error_count
      threshold: 3
      min_requests: 1
      window: 1h
      buckets: 10
      open_duration: 1h
      half_open_probes: 1
      probe_timeout: 1h
`

// TestBreakerWiring checks the server feeds /report observations to the
// breaker registry that ShouldRateLimit consults, and lists it on /breakers.
func TestBreakerWiring(t *testing.T) {
	ts := start(t, map[string]string{"breaker.yaml": breakerRules}, nil)
	client := ts.rls(t)
	call := func() rlsv3.RateLimitResponse_Code {
		resp, err := client.ShouldRateLimit(context.Background(), request("breaker", []string{"destination_cluster", "backend"}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
	if got := call(); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("closed breaker: %v", got)
	}
	for range 3 {
		if code, body := post(t, ts.reportURL(), `{"cluster":"backend","status":503}`); code != http.StatusNoContent {
			t.Fatalf("/report = %d %q", code, body)
		}
	}
	if got := call(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("after 3 errors with threshold 3: %v, want OVER_LIMIT (breaker open)", got)
	}
	if code, body := get(t, ts.debugURL("/breakers")); code != http.StatusOK || !strings.Contains(body, "backend") || !strings.Contains(strings.ToLower(body), "open") {
		t.Errorf("/breakers = %d %s", code, body)
	}
	// A reload that leaves the breaker rule unchanged keeps its state.
	writeRules(t, ts.ruleDir, "more.yaml", limitRules)
	waitRules(t, ts, "test.user")
	if got := call(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("after a reload: %v, want the breaker still open", got)
	}
}
