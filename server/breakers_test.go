package server_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
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

// backendCall returns a function asking the server about the descriptor
// destination_cluster=backend of domain breaker, answering the overall code.
func backendCall(t *testing.T, ts *testServer) func() rlsv3.RateLimitResponse_Code {
	client := ts.rls(t)
	return func() rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := client.ShouldRateLimit(context.Background(), request("breaker", []string{"destination_cluster", "backend"}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
}

// TestBreakerWiring checks the server feeds /report observations to the
// breaker registry that ShouldRateLimit consults, and lists it on /breakers.
func TestBreakerWiring(t *testing.T) {
	ts := start(t, map[string]string{"breaker.yaml": breakerRules}, nil)
	call := backendCall(t, ts)
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

// The debug listener's /breakers/override forces a breaker open through the
// real server, shows in /breakers, survives a reload, and auto lifts it.
func TestBreakerOverrideOnDebugPort(t *testing.T) {
	ts := start(t, map[string]string{"breaker.yaml": breakerRules}, nil)
	call := backendCall(t, ts)
	const rule = "breaker.destination_cluster_backend"
	override := func(mode string) (int, string) {
		resp, err := http.PostForm(ts.debugURL("/breakers/override"), url.Values{"rule": {rule}, "mode": {mode}})
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := override("force_open"); code != http.StatusOK || !strings.Contains(body, `"force_open"`) {
		t.Fatalf("POST override = %d %s", code, body)
	}
	if got := call(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("forced open: %v, want OVER_LIMIT", got)
	}
	if _, body := get(t, ts.debugURL("/breakers")); !strings.Contains(body, `"override": "force_open"`) {
		t.Errorf("/breakers does not show the override: %s", body)
	}
	writeRules(t, ts.ruleDir, "more.yaml", limitRules)
	waitRules(t, ts, "test.user")
	if got := call(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("after a reload: %v, want the override kept", got)
	}
	if code, _ := override("sideways"); code != http.StatusBadRequest {
		t.Errorf("unknown mode = %d, want 400", code)
	}
	override("auto")
	if got := call(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("after auto: %v, want OK", got)
	}
}
