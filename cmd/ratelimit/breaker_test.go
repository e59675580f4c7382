package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// breakerRules: an error_count breaker that opens on the third 5xx, stays
// open 500 ms, then admits exactly two probes, each timing out after 1 s;
// and a p99 breaker with its threshold at 100 ms.
const breakerRules = `domain: bb
descriptors:
  - key: destination_cluster
    value: orders
    circuit_breaker:
      strategy: error_count
      threshold: 3
      window: 1m
      open_duration: 500ms
      half_open_probes: 2
      probe_timeout: 1s
  - key: destination_cluster
    value: tail
    circuit_breaker:
      strategy: latency_percentile
      threshold: 0.99
      max_response_time: 100ms
      min_requests: 100
      window: 1m
      open_duration: 1h
`

// TestBinaryBreakers runs the breakers black-box through the real binary:
// reports over POST /report, decisions over ShouldRateLimit.
func TestBinaryBreakers(t *testing.T) {
	rb := startBinary(t, nil, "RUNTIME_ROOT="+ruleRoot(t, breakerRules))
	client := rb.dial(t)
	ask := func(cluster string) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "bb",
			Descriptors: []*rlcommonv3.RateLimitDescriptor{{Entries: []*rlcommonv3.RateLimitDescriptor_Entry{{Key: "destination_cluster", Value: cluster}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	report := func(body string) {
		t.Helper()
		resp, err := http.Post("http://"+rb.reportAddr+"/report", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("report %s: %d", body, resp.StatusCode)
		}
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	code := func(cluster string, want rlsv3.RateLimitResponse_Code) *rlsv3.RateLimitResponse {
		t.Helper()
		resp := ask(cluster)
		if resp.GetOverallCode() != want {
			t.Fatalf("%s: %v, want %v", cluster, resp, want)
		}
		return resp
	}

	t.Run("opens on the report that crosses the threshold", func(t *testing.T) {
		for i := 1; i <= 3; i++ {
			report(`{"cluster":"orders","status":503}`)
			want := ok
			if i == 3 {
				want = over
			}
			code("orders", want)
		}
	})

	t.Run("half-open admits exactly half_open_probes; a lost probe keeps traffic out no longer than its hint", func(t *testing.T) {
		// The refusal says when a retry can pass: the open period's end.
		wait := code("orders", over).GetStatuses()[0].GetDurationUntilReset().AsDuration()
		if wait <= 0 || wait > 500*time.Millisecond {
			t.Fatalf("open breaker's retry hint %v, want within open_duration (500ms)", wait)
		}
		time.Sleep(wait + 20*time.Millisecond)
		code("orders", ok) // probe 1
		code("orders", ok) // probe 2
		// Both slots taken; neither probe reports. The hint is when the
		// oldest times out (1 s) and the reopened breaker half-opens again
		// (500 ms): a retry then passes, never later.
		hint := code("orders", over).GetStatuses()[0].GetDurationUntilReset().AsDuration()
		if hint <= 0 || hint > 1500*time.Millisecond {
			t.Fatalf("half-open, slots full: retry hint %v, want at most probe_timeout + open_duration (1.5s)", hint)
		}
		time.Sleep(hint + 20*time.Millisecond)
		resp := code("orders", ok) // a probe of the next half-open period
		probe := ""
		for _, h := range resp.GetRequestHeadersToAdd() {
			if h.GetKey() == "x-leapgate-probe" {
				probe = h.GetValue()
			}
		}
		if probe == "" {
			t.Fatalf("the probe's answer carries no x-leapgate-probe: %v", resp)
		}
		// Its tagged success, and the second probe's, close the breaker.
		report(fmt.Sprintf(`{"cluster":"orders","status":200,"headers":{"x-leapgate-probe":%q}}`, probe))
		second := code("orders", ok)
		report(fmt.Sprintf(`{"cluster":"orders","status":200,"headers":{"x-leapgate-probe":%q}}`, second.GetRequestHeadersToAdd()[0].GetValue()))
		for range 5 {
			code("orders", ok) // closed: no probe limit
		}
	})

	t.Run("p99 trips on a latency shift of the tail only", func(t *testing.T) {
		// 200 requests, the median at 10 ms, two (1%) at 150 ms: the p99
		// (nearest rank, the 198th of 200) stays at 10 ms, whatever the
		// point the breaker looks from...
		for i := range 200 {
			ms := 10
			if i == 150 || i == 199 {
				ms = 150
			}
			report(fmt.Sprintf(`{"cluster":"tail","status":200,"response_time_ms":%d}`, ms))
		}
		code("tail", ok)
		// ...then the tail alone shifts: 3 more slow requests put more than
		// 1% above 100 ms while the median stays at 10 ms.
		for range 3 {
			report(`{"cluster":"tail","status":200,"response_time_ms":150}`)
		}
		code("tail", over)
	})
	rb.stop(t)
}
