package rlqs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/leapgate/leapgate/rlqs/quota"
)

// recordingLedger divides each claim as one replica alone would, records
// every claim it is sent, and fails while down is set.
type recordingLedger struct {
	down   bool
	claims []quota.Claim
}

func (l *recordingLedger) Divide(_ context.Context, claims []quota.Claim) ([]quota.Division, error) {
	if l.down {
		return nil, errors.New("connection refused")
	}
	l.claims = append(l.claims, claims...)
	out := make([]quota.Division, len(claims))
	for i, c := range claims {
		out[i] = divideLocal(c)
	}
	return out, nil
}

// TestLedgerUnreachable: while the ledger fails, assignments are neither
// cut nor raised, each failure is counted, a newcomer gets a hold from the
// reserve (not ALLOW_ALL), and refreshing stops one TTL after the last
// division, so that Envoy falls back once its assignments expire; it
// resumes when the ledger answers again.
func TestLedgerUnreachable(t *testing.T) {
	ledger := &recordingLedger{}
	h := newHarness(t, Options{Ledger: ledger}, testRules)
	ttl := h.server.opts.AssignmentTTL
	a, b := h.open(), h.open()
	load := map[*client]map[string]float64{a: {"name=api": 300}, b: {"name=api": 300}}
	h.run(20*time.Second, time.Second, load)
	before := a.strategy(api)
	if a.rate(api) < 150 {
		t.Fatalf("a's assignment %q before the outage, want about half of 400/s", before)
	}

	ledger.down = true
	load[b] = map[string]float64{"name=api": 10} // b's demand falls: no raise for a while down
	h.run(ttl/2, time.Second, load)
	if got := a.strategy(api); got != before {
		t.Errorf("a's assignment changed to %q with the ledger down, want %q unchanged", got, before)
	}
	n := h.open()
	n.report("web", usage(map[string]string{"user": "u1"}, 0, 1, 0))
	if got := n.strategy(map[string]string{"user": "u1"}); got != "tb 3/60s burst 2 ttl 4s" {
		t.Errorf("a newcomer during the outage got %q, want a hold from the reserve", got)
	}
	h.run(2*ttl, time.Second, load)
	if end := a.expires[bucketKey(api)]; end > h.clock.Now() {
		t.Errorf("a's assignment still refreshed to %v, %v after the outage began; want refreshing stopped after a TTL", end, h.clock.Now())
	}
	if got := testutil.ToFloat64(h.server.metrics.ledgerErrors); got < float64(2*ttl/h.server.opts.Tick) {
		t.Errorf("ledger errors counted %v, want one per tick of the outage", got)
	}

	ledger.down = false
	h.run(3*time.Second, time.Second, load)
	if end := a.expires[bucketKey(api)]; end <= h.clock.Now() {
		t.Errorf("a's assignment not refreshed after the ledger came back")
	}
	if a.rate(api) < 300 {
		t.Errorf("a at %v per second after the ledger came back, want raised to its demand as b's fell", a.rate(api))
	}
}

// TestLedgerWithdrawal: when this replica's last bucket on a limit is gone
// (its stream closed and the assignment expired), the replica withdraws
// its claim at once, with a claim of no demand, so that the other
// replicas need not wait out the claim's hold; it is sent once.
func TestLedgerWithdrawal(t *testing.T) {
	ledger := &recordingLedger{}
	h := newHarness(t, Options{Ledger: ledger}, testRules)
	a := h.open()
	h.run(5*time.Second, time.Second, map[*client]map[string]float64{a: {"name=api": 100}})
	a.stream.Close()
	ledger.claims = nil
	h.run(h.server.opts.AssignmentTTL+5*time.Second, time.Second, nil)
	var withdrawals, claims int
	for _, c := range ledger.claims {
		if len(c.Demands) == 0 && c.Fixed == 0 && c.Committed == 0 && c.Want == 0 {
			withdrawals++
			if c.Limit != 400 || c.Hold <= 0 {
				t.Errorf("withdrawal %+v, want the limit's claim with a hold", c)
			}
			continue
		}
		claims++
		if c.Fixed == 0 {
			t.Errorf("claim %+v after the close, want only the closed stream's fixed cost until it expires", c)
		}
	}
	if withdrawals != 1 || claims == 0 {
		t.Errorf("%d claims then %d withdrawals, want claims while the assignment was in force, then one withdrawal", claims, withdrawals)
	}
}
