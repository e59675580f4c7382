package service

import (
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"testing"
	"time"
)

const inFlightRules = `
domain: d
descriptors:
  - key: uploads
    concurrency_limit: {max_in_flight: 2, lease: 10s, holder_key: request_id}
`

// TestConcurrencyLimitAnswers plays a limit of 2 uploads in flight with 10s
// leases through ShouldRateLimit under a fake clock, as Envoy sends it: the
// request-phase call takes a slot for its x-request-id, the stream-done
// call (is_negative_hits) gives it back. Admit, refuse at the cap, refund,
// a lease that ends without its refund, and a late refund that frees
// nothing.
func TestConcurrencyLimitAnswers(t *testing.T) {
	h := newHarness(t, mustParse(t, inFlightRules), nil)
	two := limMult(2, second, "", 10)
	const start, end = false, true
	for i, s := range []struct {
		at   time.Duration
		id   string
		end  bool // the stream-done call (is_negative_hits)
		want *dstatus
	}{
		{0, "r1", start, wantOK(two, 1, 10*time.Second)},
		{time.Second, "r2", start, wantOK(two, 0, 10*time.Second)},
		{2 * time.Second, "r3", start, wantOver(two, 0, 8*time.Second)},
		{3 * time.Second, "r1", end, wantOK(two, 1, 8*time.Second)},
		{4 * time.Second, "r3", start, wantOK(two, 0, 10*time.Second)},
		// r2 never ends: its lease does, at 11s.
		{11 * time.Second, "r4", start, wantOK(two, 0, 10*time.Second)},
		// r2's refund after its lease ended frees nothing.
		{12 * time.Second, "r2", end, wantOK(two, 0, 2*time.Second)}, // a refund is never refused
		{12 * time.Second, "r5", start, wantOver(two, 0, 2*time.Second)},
		{14 * time.Second, "r5", start, wantOK(two, 0, 10*time.Second)},
	} {
		h.clock.Set(s.at)
		d := desc("uploads", "api", "request_id", s.id)
		if s.end {
			d = with(d, refund())
		}
		resp, err := h.call(req("d", d))
		if err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
		checkStatuses(t, resp, []*dstatus{s.want})
	}
}

// TestLimitOverrideKeepsTheConcurrencyLimit: a descriptor with its own
// limit override replaces its rule's rate limits, not the cap on requests
// in flight: the third upload in flight is refused, by the cap, whatever
// the override allows.
func TestLimitOverrideKeepsTheConcurrencyLimit(t *testing.T) {
	h := newHarness(t, mustParse(t, inFlightRules), nil)
	two := limMult(2, second, "", 10)
	for i, s := range []struct {
		id   string
		want *dstatus
	}{
		{"r1", wantOK(two, 1, 10*time.Second)},
		{"r2", wantOK(two, 0, 10*time.Second)},
		{"r3", wantOver(two, 0, 10*time.Second)},
	} {
		d := with(desc("uploads", "api", "request_id", s.id), override(100, typev3.RateLimitUnit_SECOND, 0))
		resp, err := h.call(req("d", d))
		if err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
		checkStatuses(t, resp, []*dstatus{s.want})
	}
}
