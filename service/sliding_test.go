package service

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

const defaultWindowRules = `
domain: d
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: small
    rate_limit: {unit: second, requests_per_unit: 3}
`

// TestDefaultSlidingWindowAnswers: the default sliding_window's answers
// through ShouldRateLimit: exact remaining quota and reset for a small
// limit, and the whole quota for a client that sends it at one instant a
// little over a window apart (a cron job), which time buckets refuse
// about every other time.
func TestDefaultSlidingWindowAnswers(t *testing.T) {
	const ms = time.Millisecond
	h := newHarness(t, mustParse(t, defaultWindowRules), nil)
	small := lim(3, second, "")
	steps := []struct {
		at        time.Duration
		code      rlsv3.RateLimitResponse_Code
		remaining uint32
		reset     time.Duration
	}{
		{100 * ms, codeOK, 2, time.Second},
		{400 * ms, codeOK, 1, time.Second},
		{700 * ms, codeOK, 0, time.Second},
		{800 * ms, codeOver, 0, 300 * ms},   // the 100ms hit leaves at 1.1s
		{1100 * ms, codeOK, 0, time.Second}, // exactly then
		{1200 * ms, codeOver, 0, 200 * ms},  // the 400ms hit leaves at 1.4s
		{1400 * ms, codeOK, 0, time.Second},
	}
	for i, s := range steps {
		h.clock.Set(s.at)
		resp, err := h.call(req("d", desc("small", "x")))
		if err != nil {
			t.Fatal(err)
		}
		st := resp.Statuses[0]
		if st.Code != s.code || st.LimitRemaining != s.remaining || st.DurationUntilReset.AsDuration() != s.reset ||
			st.CurrentLimit.RequestsPerUnit != small.RequestsPerUnit {
			t.Fatalf("step %d at %v: %v, want %v remaining %d reset %v", i, s.at, st, s.code, s.remaining, s.reset)
		}
	}

	// The cron client: 100 requests at one instant every 1.03 s.
	admitted, sent := 0, 0
	for k := range 50 {
		h.clock.Set(10*time.Second + time.Duration(k)*1030*ms)
		for range 100 {
			sent++
			resp, err := h.call(req("d", desc("user", "cron")))
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode == codeOK {
				admitted++
			}
		}
	}
	if admitted != sent {
		t.Fatalf("cron client: %d of %d admitted, want all (an exact sliding log admits all)", admitted, sent)
	}
}
