package main

import (
	"context"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// inFlightRules: two uploads in flight, each request's slot leased for 2s
// and named by its request_id entry (the examples/concurrency rules with a
// short lease).
const inFlightRules = `domain: inflight
descriptors:
  - key: generic_key
    value: uploads
    concurrency_limit:
      max_in_flight: 2
      lease: 2s
      holder_key: request_id
`

// TestBinaryConcurrencyLimit plays Envoy's two calls per request (a hit
// when it starts, is_negative_hits when its stream ends) against the real
// binary, in memory and on a real redis-server shared by two replicas:
// admit, refuse at the cap, refund, a lease that ends without its refund
// (the refusal's reset says when), and a late refund that frees nothing.
func TestBinaryConcurrencyLimit(t *testing.T) {
	for n, backend := range []string{"memory", "redis, two replicas"} {
		t.Run(backend, func(t *testing.T) {
			clients := startReplicas(t, ruleRoot(t, inFlightRules), 2*n)
			n := 0
			call := func(id string, end bool) *rlsv3.RateLimitResponse_DescriptorStatus {
				t.Helper()
				c := clients[n%len(clients)] // the replicas in turn
				n++
				resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "inflight",
					Descriptors: []*rlcommonv3.RateLimitDescriptor{{
						Entries: []*rlcommonv3.RateLimitDescriptor_Entry{
							{Key: "generic_key", Value: "uploads"}, {Key: "request_id", Value: id}},
						IsNegativeHits: end,
					}}})
				if err != nil {
					t.Fatal(err)
				}
				return resp.GetStatuses()[0]
			}
			ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
			expect := func(what string, s *rlsv3.RateLimitResponse_DescriptorStatus, code rlsv3.RateLimitResponse_Code, remaining uint32) {
				t.Helper()
				if s.GetCode() != code || s.GetLimitRemaining() != remaining {
					t.Fatalf("%s: %v, want %v with %d remaining", what, s, code, remaining)
				}
			}
			expect("r1 starts", call("r1", false), ok, 1)
			expect("r2 starts", call("r2", false), ok, 0)
			expect("r3 refused at the cap", call("r3", false), over, 0)
			expect("r1 ends", call("r1", true), ok, 1)
			time.Sleep(500 * time.Millisecond) // r3's lease ends well after r2's
			expect("r3 starts", call("r3", false), ok, 0)
			// r2 never ends. The refusal's reset is when its lease does.
			refused := call("r4", false)
			expect("r4 refused", refused, over, 0)
			time.Sleep(refused.GetDurationUntilReset().AsDuration())
			expect("r4 starts once r2's lease ended", call("r4", false), ok, 0)
			expect("r2's late refund", call("r2", true), ok, 0)
			expect("r5 still refused: the late refund freed nothing", call("r5", false), over, 0)
			expect("r3 ends", call("r3", true), ok, 1)
			expect("r4 ends", call("r4", true), ok, 2)
		})
	}
}
