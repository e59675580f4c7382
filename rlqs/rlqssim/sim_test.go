package rlqssim

import (
	"strings"
	"testing"
	"time"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/rlqs"
)

// TestScenarios holds the server to the targets in every standard
// scenario, at 1 s and 5 s reports: never more than the limit plus the
// bursts in force, at most 1.05 × once settled; no protocol error; the
// fleet within 5 % of the max-min shares at the end; a change followed
// within one report interval, two ticks (take before give) and a window
// (a leave within the assignment TTL, a tick and a window: a closed
// stream's share is freed only when its assignment expires); and in the no-waste scenario at
// least 95 % of the limit used, the heavy client at least 320 per second.
func TestScenarios(t *testing.T) {
	runScenarios(t, true, 2, func(t *testing.T, set *descriptors.Set, opts rlqs.Options) (Transport, error) {
		return NewInProcess(set, opts)
	})
}

// runScenarios runs every standard scenario (but the restarts, unless
// restarts is set) at 1 s and 5 s reports, each on a new transport, and
// holds it to checkTargets with the given number of ticks to follow a
// change.
func runScenarios(t *testing.T, restarts bool, ticks int, newTransport func(*testing.T, *descriptors.Set, rlqs.Options) (Transport, error)) {
	set, err := RuleSet()
	if err != nil {
		t.Fatal(err)
	}
	opts := rlqs.Options{Tick: 500 * time.Millisecond, AssignmentTTL: 4 * time.Second}
	for _, report := range []time.Duration{time.Second, 5 * time.Second} {
		for _, sc := range Scenarios(report) {
			if !restarts && len(sc.Restarts) > 0 {
				continue
			}
			t.Run(sc.Name, func(t *testing.T) {
				tr, err := newTransport(t, set, opts)
				if err != nil {
					t.Fatal(err)
				}
				checkTargets(t, sc, Run(sc, tr), opts, report, ticks)
			})
		}
	}
}

// checkTargets holds r, the result of sc at the given report interval on a
// server with opts, to the targets TestScenarios states, a change followed
// within the report interval, the given number of ticks and a window.
func checkTargets(t *testing.T, sc Scenario, r Result, opts rlqs.Options, report time.Duration, ticks int) {
	t.Helper()
	t.Log(r)
	if len(r.Errors) > 0 {
		t.Errorf("protocol errors: %v", r.Errors)
	}
	if r.Peak > 1.02 || r.PeakSettled > 1.0 {
		t.Errorf("peak %.3f × the limit (settled %.3f ×), want at most the limit plus the bursts", r.Peak, r.PeakSettled)
	}
	if r.FairnessError > 0.05 {
		t.Errorf("fairness error %.1f %%, want at most 5 %%", 100*r.FairnessError)
	}
	// The cuts go out on the tick after the report, the raises
	// they pay for one tick later (take before give).
	bound := report + time.Duration(ticks)*opts.Tick + sc.Window
	if strings.HasPrefix(sc.Name, "leave") {
		bound = opts.AssignmentTTL + opts.Tick + sc.Window
	}
	for i, c := range r.Converged {
		if c < 0 || c > bound {
			t.Errorf("change %d: converged after %v, want within %v", i, c, bound)
		}
	}
	if strings.HasPrefix(sc.Name, "no waste") {
		if r.UsedLast < 0.95 || r.Rates[3] < 320 {
			t.Errorf("used %.1f %% of the limit, the heavy client %.0f per second; want at least 95 %% and 320", 100*r.UsedLast, r.Rates[3])
		}
	}
}
