package service

import (
	"math"
	"testing"
	"time"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/ruletest"
	"github.com/leapgate/leapgate/window"
)

const chargeRules = `
domain: d
descriptors:
  - key: tokens
    rate_limit: {unit: minute, requests_per_unit: 100, charge: always}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 100, charge: always}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 100, charge: always}
  - key: calls
    rate_limit: {unit: minute, requests_per_unit: 5}
`

// TestChargeAlwaysAnswers plays charge: always through ShouldRateLimit under
// a fake clock: each row is one call at a time, with its answer. A charge
// that does not fit is recorded and answered OVER_LIMIT (OK in shadow mode,
// which never refuses; OVER_LIMIT in quota mode, the request's only quota
// descriptor, and recorded all the same), checks are refused until the debt
// has aged out, and a hostile hits_addend saturates instead of erroring.
func TestChargeAlwaysAnswers(t *testing.T) {
	h := newHarness(t, mustParse(t, chargeRules), nil)
	tokens := lim(100, minute, "")
	// Hits are stamped at times rounded up to the window's tick: rows at
	// multiples of T keep the resets round.
	T := 1000 * window.TickLength(time.Minute)
	W := time.Minute
	for i, s := range []struct {
		at   time.Duration
		key  string
		hits uint64
		want *dstatus
	}{
		{0, "tokens", 0, wantOK(tokens, 100, 0)},
		{T, "tokens", 150, wantOver(tokens, 0, W)},
		{2 * T, "tokens", 0, wantOver(tokens, 0, W-T)},
		// A charge in flight while in debt is counted too; the debt's hits
		// beyond the ring's 106 blocks then share its time.
		{2 * T, "tokens", 10, wantOver(tokens, 0, W-T)},
		{T + W, "tokens", 0, wantOK(tokens, 46, T)},
		{2*T + W, "tokens", 0, wantOK(tokens, 100, 0)},
		{100 * T, "tokens", math.MaxUint64, wantOver(tokens, 0, W)},
		{101 * T, "tokens", 0, wantOver(tokens, 0, W-T)},
		{0, "shadow", 150, wantOK(tokens, 0, W)},
		{T, "shadow", 0, wantOK(tokens, 0, W-T)},
		{0, "quota", 150, wantOver(tokens, 0, W)},
		{T, "quota", 0, wantOver(tokens, 0, W-T)},
	} {
		h.clock.Set(s.at)
		resp, err := h.call(req("d", with(desc(s.key, "alice"), hits(s.hits))))
		if err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
		checkStatuses(t, resp, []*dstatus{s.want})
	}

	// A debt refuses the other descriptors of its call (they record
	// nothing), and their refusal does not take the charge back.
	h.clock.Set(10 * time.Minute)
	resp, err := h.call(req("d", with(desc("tokens", "bob"), hits(150)), with(desc("calls", "bob"), hits(1))))
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != codeOver || resp.Statuses[1].LimitRemaining != 5 {
		t.Fatalf("charge into debt beside a call: %v", resp)
	}
	resp, err = h.call(req("d", with(desc("tokens", "bob"), hits(0))))
	if err != nil || resp.OverallCode != codeOver {
		t.Fatalf("check after the charge: %v, %v (want OVER_LIMIT: the charge stayed)", resp, err)
	}
}

// TestDefaultCharge: with descriptors.Options.ChargeAlways (from
// DEFAULT_CHARGE=always) a rule that does not set charge goes into debt;
// without it, a refused charge records nothing.
func TestDefaultCharge(t *testing.T) {
	for _, always := range []bool{false, true} {
		h := newHarness(t, ruletest.Parse(t, descriptors.Options{ChargeAlways: always}, defaultWindowRules), nil)
		resp, err := h.call(req("d", with(desc("small", "x"), hits(5))))
		if err != nil || resp.Statuses[0].Code != codeOver {
			t.Fatalf("charge always %v: 5 against 3: %v, %v", always, resp, err)
		}
		want := codeOK
		if always {
			want = codeOver
		}
		if resp, _ := h.call(req("d", with(desc("small", "x"), hits(0)))); resp.Statuses[0].Code != want {
			t.Fatalf("charge always %v: check after 5 against 3: %v, want %v", always, resp, want)
		}
	}
}
