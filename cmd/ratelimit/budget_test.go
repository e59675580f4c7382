package main

import (
	"context"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// budgetRules: 100 tokens per user per second, charged always (the
// examples/envoy/budget rules with a short window).
const budgetRules = `domain: llm
descriptors:
  - key: user
    rate_limit:
      requests_per_unit: 100
      window: 1s
      charge: always
`

// TestBinaryBudgetChargedAfterTheResponse plays Envoy's two calls for a
// usage budget against the real binary, in memory and on a real
// redis-server: the request-phase check (hits_addend 0) is OK, the
// stream-done charge of 150 tokens against 100 is recorded and answered
// OVER_LIMIT, the next check is OVER_LIMIT with a reset within the window,
// and once the window has passed the check is OK again.
func TestBinaryBudgetChargedAfterTheResponse(t *testing.T) {
	for n, backend := range []string{"memory", "redis"} {
		t.Run(backend, func(t *testing.T) {
			client := startReplicas(t, ruleRoot(t, budgetRules), n)[0]
			call := func(hits uint64) *rlsv3.RateLimitResponse_DescriptorStatus {
				t.Helper()
				resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "llm",
					Descriptors: []*rlcommonv3.RateLimitDescriptor{{
						Entries:    []*rlcommonv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}},
						HitsAddend: wrapperspb.UInt64(hits),
					}}})
				if err != nil {
					t.Fatal(err)
				}
				return resp.GetStatuses()[0]
			}
			ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
			if s := call(0); s.GetCode() != ok || s.GetLimitRemaining() != 100 {
				t.Fatalf("request-phase check: %v", s)
			}
			charged := time.Now()
			if s := call(150); s.GetCode() != over || s.GetLimitRemaining() != 0 {
				t.Fatalf("stream-done charge of 150: %v", s)
			}
			s := call(0)
			reset := s.GetDurationUntilReset().AsDuration()
			if s.GetCode() != over || s.GetLimitRemaining() != 0 || reset <= 0 || reset > time.Second+time.Millisecond {
				t.Fatalf("check in debt: %v, want OVER_LIMIT, 0 remaining, a reset within the window", s)
			}
			// Poll (no sleeping to an edge) until the debt has aged out.
			deadline := time.Now().Add(5 * time.Second)
			for call(0).GetCode() != ok {
				if time.Now().After(deadline) {
					t.Fatal("the check is still OVER_LIMIT 5s after the charge")
				}
				time.Sleep(20 * time.Millisecond)
			}
			if waited := time.Since(charged); waited < time.Second-50*time.Millisecond {
				t.Fatalf("the debt of a 1s window was paid after %v", waited)
			}
			if s := call(0); s.GetCode() != ok || s.GetLimitRemaining() != 100 {
				t.Fatalf("check after the window: %v", s)
			}
		})
	}
}

// fixedBudgetRules: 100 tokens per user per hour in fixed windows, charged
// always.
const fixedBudgetRules = `domain: llm
descriptors:
  - key: user
    rate_limit: {requests_per_unit: 100, unit: hour, algorithm: fixed_window, charge: always}
`

// TestBinaryFixedWindowChargeOnANewKey: the first charge of a fixed window
// on a key with no counter yet, over the budget, is recorded on every
// backend (on Redis it was answered OVER_LIMIT and recorded as 0, so a
// client whose every call exceeds its budget was never charged).
func TestBinaryFixedWindowChargeOnANewKey(t *testing.T) {
	for n, backend := range []string{"memory", "redis"} {
		t.Run(backend, func(t *testing.T) {
			client := startReplicas(t, ruleRoot(t, fixedBudgetRules), n)[0]
			call := func(user string, hits uint64) *rlsv3.RateLimitResponse_DescriptorStatus {
				t.Helper()
				resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "llm",
					Descriptors: []*rlcommonv3.RateLimitDescriptor{{
						Entries:    []*rlcommonv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}},
						HitsAddend: wrapperspb.UInt64(hits),
					}}})
				if err != nil {
					t.Fatal(err)
				}
				return resp.GetStatuses()[0]
			}
			for _, user := range []string{"alice", "bob"} { // bob: again, if alice's calls straddled an hour
				hour := time.Now().Truncate(time.Hour)
				over := rlsv3.RateLimitResponse_OVER_LIMIT
				if s := call(user, 150); s.GetCode() != over {
					t.Fatalf("a charge of 150 against 100: %v", s)
				}
				s := call(user, 0)
				if !time.Now().Truncate(time.Hour).Equal(hour) {
					continue
				}
				if s.GetCode() != over || s.GetLimitRemaining() != 0 {
					t.Fatalf("check after a charge of 150 against 100 on a new key: %v, want OVER_LIMIT (the charge recorded)", s)
				}
				return
			}
			t.Fatal("both tries straddled an hour edge")
		})
	}
}
