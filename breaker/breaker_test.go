package breaker

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/ruletest"
)

const (
	ms = time.Millisecond
	s  = time.Second
)

// mustConfig returns the Config of a circuit_breaker block written as the
// fields of a YAML flow mapping, read by the rule loader (which validates it
// and applies the defaults).
func mustConfig(t testing.TB, block string) Config {
	t.Helper()
	set := ruletest.Parse(t, descriptors.Options{}, "domain: b\ndescriptors:\n  - key: k\n    circuit_breaker: {"+block+"}\n")
	return Config{Breaker: *set.Rule("b.k").Breaker}
}

// slowBreaker: slow_request_ratio 0.5 over 10s/10 buckets, min 4 requests,
// max 100ms, open 5s, 2 probes, probe timeout 1s.
func slowConfig(t testing.TB) Config {
	return mustConfig(t, "strategy: slow_request_ratio, threshold: 0.5, max_response_time: 100ms, min_requests: 4, window: 10s, buckets: 10, open_duration: 5s, half_open_probes: 2, probe_timeout: 1s")
}

type recorder struct{ got []Transition }

func (r *recorder) hook(t Transition) { r.got = append(r.got, t) }

func (r *recorder) last() Transition {
	if len(r.got) == 0 {
		return Transition{}
	}
	return r.got[len(r.got)-1]
}

var (
	fast = Outcome{ResponseTime: 10 * ms, Status: 200}
	slow = Outcome{ResponseTime: 101 * ms, Status: 200}
)

func TestFailed(t *testing.T) {
	slowC := mustConfig(t, "strategy: slow_request_ratio, threshold: 0.5, max_response_time: 100ms")
	errC := mustConfig(t, "strategy: error_ratio, threshold: 0.5")
	listC := mustConfig(t, "strategy: error_count, threshold: 1, error_statuses: [503, 429]")
	tests := []struct {
		name string
		c    Config
		o    Outcome
		want bool
	}{
		{"slow: at max is not slow", slowC, Outcome{ResponseTime: 100 * ms, Status: 200}, false},
		{"slow: above max", slowC, Outcome{ResponseTime: 100*ms + 1, Status: 200}, true},
		{"slow: 500 fast is not slow", slowC, Outcome{ResponseTime: ms, Status: 500}, false},
		{"slow: aborted", slowC, Outcome{ResponseTime: ms, Aborted: true}, true},
		{"slow: in flight past max", slowC, Outcome{ResponseTime: 101 * ms, InFlight: true}, true},
		{"error: 499", errC, Outcome{Status: 499}, false},
		{"error: 500", errC, Outcome{Status: 500}, true},
		{"error: 503", errC, Outcome{Status: 503}, true},
		{"error: slow 200", errC, Outcome{Status: 200, ResponseTime: time.Hour}, false},
		{"error: aborted", errC, Outcome{Aborted: true}, true},
		{"error: declared", errC, Outcome{Error: true}, true},
		{"list: 429", listC, Outcome{Status: 429}, true},
		{"list: 503", listC, Outcome{Status: 503}, true},
		{"list: 500 not listed", listC, Outcome{Status: 500}, false},
		{"list: aborted", listC, Outcome{Aborted: true}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.c.Failed(tt.o); got != tt.want {
				t.Errorf("Failed(%+v) = %v, want %v", tt.o, got, tt.want)
			}
		})
	}
}

// TestThresholds feeds a fresh breaker a sequence of outcomes at one instant
// and checks whether it opened, at the boundary of each strategy.
func TestThresholds(t *testing.T) {
	bad := Outcome{Status: 500, ResponseTime: time.Hour}
	good := Outcome{Status: 200, ResponseTime: ms}
	seq := func(nBad, nGood int) []Outcome {
		var out []Outcome
		for range nGood {
			out = append(out, good)
		}
		for range nBad {
			out = append(out, bad)
		}
		return out
	}
	tests := []struct {
		name string
		b    string // the circuit_breaker block
		obs  []Outcome
		open bool
	}{
		{"ratio 0.3: 3 of 10 opens", "strategy: error_ratio, threshold: 0.3, min_requests: 10", seq(3, 7), true},
		{"ratio 0.3: 2 of 10 stays", "strategy: error_ratio, threshold: 0.3, min_requests: 10", seq(2, 8), false},
		{"ratio 1: all bad opens", "strategy: error_ratio, threshold: 1, min_requests: 3", seq(3, 0), true},
		{"ratio 1: one good stays", "strategy: error_ratio, threshold: 1, min_requests: 3", seq(3, 1), false},
		{"slow ratio 0.5: 2 of 4 opens", "strategy: slow_request_ratio, threshold: 0.5, max_response_time: 1s, min_requests: 4", seq(2, 2), true},
		{"slow ratio 0.5: 1 of 4 stays", "strategy: slow_request_ratio, threshold: 0.5, max_response_time: 1s, min_requests: 4", seq(1, 3), false},
		{"min requests: 4 bad of min 5 stays", "strategy: error_ratio, threshold: 0.5, min_requests: 5", seq(4, 0), false},
		{"min requests: 5th observation opens", "strategy: error_ratio, threshold: 0.5, min_requests: 5", seq(3, 2), true},
		{"count 3: 2 errors stay", "strategy: error_count, threshold: 3", seq(2, 50), false},
		{"count 3: 3 errors open", "strategy: error_count, threshold: 3", seq(3, 50), true},
		{"count 3 with min 10: 3 of 5 stays", "strategy: error_count, threshold: 3, min_requests: 10", seq(3, 2), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := New(mustConfig(t, tt.b), nil)
			for _, o := range tt.obs {
				b.ObserveAt(s, o)
			}
			if got := b.State() == Open; got != tt.open {
				t.Errorf("open = %v, want %v (state %v)", got, tt.open, b.State())
			}
		})
	}
}

func openBreaker(t *testing.T, rec *recorder, at time.Duration) *Breaker {
	t.Helper()
	b := New(slowConfig(t), rec.hook)
	for range 4 {
		b.ObserveAt(at, slow)
	}
	if b.State() != Open {
		t.Fatalf("state = %v after 4 slow requests, want open", b.State())
	}
	return b
}

func TestLifecycle(t *testing.T) {
	var rec recorder
	b := openBreaker(t, &rec, 1*s)
	if tr := rec.last(); tr.From != Closed || tr.To != Open || tr.Failed != 4 || tr.Total != 4 || tr.Reason != "threshold" {
		t.Fatalf("transition = %+v", tr)
	}
	// Open: refused until OpenDuration has elapsed, with the exact wait.
	if ok, wait := b.AllowAt(2 * s); ok || wait != 4*s {
		t.Fatalf("AllowAt(2s) = %v, %v; want false, 4s", ok, wait)
	}
	if ok, wait := b.AllowAt(6*s - 1); ok || wait != 1 {
		t.Fatalf("AllowAt(6s-1ns) = %v, %v; want false, 1ns", ok, wait)
	}
	// Half-open at 6s: two probes admitted, the third refused until a retry
	// surely passes: the oldest probe's timeout (7s) plus a reopened period.
	if ok, _ := b.AllowAt(6 * s); !ok || b.State() != HalfOpen {
		t.Fatalf("first probe refused or state %v", b.State())
	}
	if ok, _ := b.AllowAt(6*s + 100*ms); !ok {
		t.Fatal("second probe refused")
	}
	if ok, wait := b.AllowAt(6*s + 200*ms); ok || wait != 5*s+800*ms {
		t.Fatalf("third request = %v, %v; want false, 5.8s", ok, wait)
	}
	// Both probes succeed: closed, with a fresh window.
	b.ObserveAt(6*s+300*ms, fast)
	if b.State() != HalfOpen {
		t.Fatalf("closed after one of two probes: %v", b.State())
	}
	b.ObserveAt(6*s+400*ms, fast)
	if b.State() != Closed {
		t.Fatalf("state after both probes = %v, want closed", b.State())
	}
	if st := b.StatsAt(6*s + 400*ms); st.Total != 0 || st.Failed != 0 {
		t.Errorf("window not reset on close: %+v", st)
	}
	if ok, _ := b.AllowAt(6*s + 500*ms); !ok {
		t.Error("closed breaker refused")
	}
	want := []struct{ from, to State }{{Closed, Open}, {Open, HalfOpen}, {HalfOpen, Closed}}
	if len(rec.got) != len(want) {
		t.Fatalf("transitions = %+v, want %d", rec.got, len(want))
	}
	for i, w := range want {
		if rec.got[i].From != w.from || rec.got[i].To != w.to {
			t.Errorf("transition %d = %v->%v, want %v->%v", i, rec.got[i].From, rec.got[i].To, w.from, w.to)
		}
	}
}

func TestProbeFailureReopens(t *testing.T) {
	var rec recorder
	b := openBreaker(t, &rec, 0)
	b.AllowAt(5 * s)
	b.AllowAt(5 * s)
	b.ObserveAt(5*s+10*ms, fast)
	b.ObserveAt(5*s+20*ms, slow)
	if b.State() != Open || rec.last().Reason != "probe failed" {
		t.Fatalf("state %v after failed probe (%+v)", b.State(), rec.last())
	}
	// A fresh OpenDuration from the failure.
	if ok, wait := b.AllowAt(5*s + 20*ms); ok || wait != 5*s {
		t.Fatalf("AllowAt = %v, %v; want false, 5s", ok, wait)
	}
	if ok, _ := b.AllowAt(10*s + 20*ms); !ok || b.State() != HalfOpen {
		t.Fatalf("not half-open again after the fresh open duration: %v", b.State())
	}
}

func TestProbeTimeout(t *testing.T) {
	var rec recorder
	b := openBreaker(t, &rec, 0)
	if ok, _ := b.AllowAt(5 * s); !ok {
		t.Fatal("probe refused")
	}
	// The probe never reports. Just before the timeout: still half-open.
	if st := b.AdvanceAt(6*s - 1); st != HalfOpen {
		t.Fatalf("state before probe timeout = %v", st)
	}
	// At the timeout it counts as failed: open again for OpenDuration.
	if ok, wait := b.AllowAt(6 * s); ok || wait != 5*s {
		t.Fatalf("AllowAt at probe timeout = %v, %v; want false, 5s", ok, wait)
	}
	if rec.last().Reason != "probe timeout" || rec.last().From != HalfOpen {
		t.Errorf("last transition = %+v", rec.last())
	}
	// The cycle goes on: half-open again after the fresh open duration.
	if st := b.AdvanceAt(11 * s); st != HalfOpen {
		t.Errorf("state at 11s = %v, want half_open", st)
	}
}

func TestProbeTimeoutWithSlotsFull(t *testing.T) {
	var rec recorder
	b := openBreaker(t, &rec, 0)
	b.AllowAt(5 * s)
	b.AllowAt(5*s + 500*ms)
	b.ObserveAt(5*s+600*ms, fast) // pairs with the oldest probe
	// The second probe (admitted at 5.5s) is outstanding; refused requests
	// learn the earliest time a retry can pass: it times out at 6.5s, the
	// breaker reopens for 5s, and half-opens at 11.5s.
	if ok, wait := b.AllowAt(6 * s); ok || wait != 5*s+500*ms {
		t.Fatalf("AllowAt(6s) = %v, %v; want false, 5.5s", ok, wait)
	}
	if st := b.AdvanceAt(6*s + 500*ms); st != Open {
		t.Fatalf("state after second probe timed out = %v, want open", st)
	}
	// The hint was exact: refused just before, admitted at it.
	if ok, _ := b.AllowAt(11*s + 500*ms - 1); ok {
		t.Fatal("admitted before the hinted retry time")
	}
	if ok, _ := b.AllowAt(11*s + 500*ms); !ok {
		t.Fatal("refused at the hinted retry time")
	}
}

// A probe that never reports is noticed when its timeout comes due, not
// when the next request happens to come: every transition due by then is
// applied at its own instant.
func TestLostProbeTransitionsAtTheirInstants(t *testing.T) {
	tests := []struct {
		name    string
		at      time.Duration // the first call after the probe
		ok      bool
		wait    time.Duration
		history []State // the transitions after the first half-open, in order
	}{
		{"at the timeout", 6 * s, false, 5 * s, []State{Open}},
		{"one tick after", 6*s + 1, false, 5*s - 1, []State{Open}},
		{"during the reopened period", 8 * s, false, 3 * s, []State{Open}},
		{"when it half-opens again", 11 * s, true, 0, []State{Open, HalfOpen}},
		// Long after, with no traffic: a new probe, not a fresh open period.
		{"much later", 11*s + 650*ms, true, 0, []State{Open, HalfOpen}},
		// Later still, past the second probe timeout that never came due
		// (no probe was admitted in the second half-open period).
		{"far later", 60 * s, true, 0, []State{Open, HalfOpen}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rec recorder
			b := openBreaker(t, &rec, 0)
			if ok, _ := b.AllowAt(5 * s); !ok {
				t.Fatal("probe refused")
			}
			n := len(rec.got)
			ok, wait := b.AllowAt(tt.at)
			if ok != tt.ok || wait != tt.wait {
				t.Errorf("AllowAt(%v) = %v, %v; want %v, %v", tt.at, ok, wait, tt.ok, tt.wait)
			}
			got := rec.got[n:]
			if len(got) != len(tt.history) {
				t.Fatalf("transitions %+v, want states %v", got, tt.history)
			}
			for i, tr := range got {
				if tr.To != tt.history[i] {
					t.Errorf("transition %d to %v, want %v", i, tr.To, tt.history[i])
				}
			}
			// Each at the instant it came due.
			if got[0].At != 6*s || got[0].Reason != "probe timeout" {
				t.Errorf("reopen %+v, want at 6s for probe timeout", got[0])
			}
			if len(got) > 1 && got[1].At != 11*s {
				t.Errorf("half-open again at %v, want 11s", got[1].At)
			}
		})
	}
}

func TestStragglerWithoutProbeDoesNotDecide(t *testing.T) {
	var rec recorder
	b := openBreaker(t, &rec, 0)
	// While open, observations are counted but change nothing.
	b.ObserveAt(1*s, fast)
	if b.State() != Open {
		t.Fatalf("observation changed an open breaker: %v", b.State())
	}
	if st := b.AdvanceAt(5 * s); st != HalfOpen {
		t.Fatalf("AdvanceAt(5s) = %v, want half_open", st)
	}
	// Half-open with no probe admitted: neither a slow nor a fast
	// observation decides.
	b.ObserveAt(5*s+1, slow)
	b.ObserveAt(5*s+2, fast)
	b.ObserveAt(5*s+3, fast)
	if b.State() != HalfOpen {
		t.Fatalf("straggler decided the half-open breaker: %v", b.State())
	}
}

func TestWindowSlides(t *testing.T) {
	// 10s window in 1s buckets, min 4, ratio 0.5. Three slow requests at
	// 1.5s; then, at time at, one slow and two fast. While the early slow
	// requests are inside the window, 4 of 6 are slow and the breaker opens;
	// once their bucket [1s,2s) has left the window (at 11s) only 1 of 3 is
	// slow (and fewer than min_requests): it stays closed.
	tests := []struct {
		at   time.Duration
		open bool
	}{
		{9 * s, true},
		{11*s - 1, true}, // window [1s, 11s) still holds the bucket
		{11 * s, false},  // window [2s, 12s): aged out
		{30 * s, false},
	}
	for _, tt := range tests {
		b := New(slowConfig(t), nil)
		for range 3 {
			b.ObserveAt(1500*ms, slow)
		}
		if st := b.StatsAt(tt.at); (st.Total == 3) != tt.open {
			t.Errorf("at %v: window counts %+v", tt.at, st)
		}
		b.ObserveAt(tt.at, fast)
		b.ObserveAt(tt.at, fast)
		b.ObserveAt(tt.at, slow)
		if got := b.State() == Open; got != tt.open {
			t.Errorf("at %v: open = %v, want %v", tt.at, got, tt.open)
		}
	}
}

func TestWindowPartialSlide(t *testing.T) {
	// Counts spread across buckets leave one bucket at a time.
	b := New(slowConfig(t), nil)
	for i := range 10 {
		b.ObserveAt(time.Duration(i)*s, fast) // one per bucket, epochs 0..9
	}
	for i, want := range []uint64{10, 9, 8, 1, 0} {
		at := []time.Duration{9 * s, 10 * s, 11 * s, 18 * s, 19 * s}[i]
		if st := b.StatsAt(at); st.Total != want {
			t.Errorf("total at %v = %d, want %d", at, st.Total, want)
		}
	}
}

func TestClockSteppingBack(t *testing.T) {
	b := New(slowConfig(t), nil)
	b.ObserveAt(5*s, fast)
	b.ObserveAt(2*s, fast) // earlier reading: counted in the newest bucket
	if st := b.StatsAt(1 * s); st.Total != 2 {
		t.Errorf("total = %d, want 2", st.Total)
	}
	if st := b.StatsAt(15 * s); st.Total != 0 {
		t.Errorf("total after the window = %d, want 0", st.Total)
	}
}

func TestErrorCountIgnoresSuccessesInWindow(t *testing.T) {
	b := New(mustConfig(t, "strategy: error_count, threshold: 2, window: 4s, buckets: 4"), nil)
	b.ObserveAt(0, Outcome{Status: 502})
	b.ObserveAt(4*s, Outcome{Status: 502}) // the first has aged out
	if b.State() != Closed {
		t.Fatal("opened with an aged-out error")
	}
	b.ObserveAt(5*s, Outcome{Aborted: true})
	if b.State() != Open {
		t.Fatal("two errors in the window did not open")
	}
}

// With max_open_duration, each reopening from half-open doubles the open
// period up to the maximum, probe timeouts included; closing resets it.
func TestOpenDurationBackoff(t *testing.T) {
	cfg := mustConfig(t, "strategy: error_count, threshold: 1, open_duration: 1s, max_open_duration: 5s, probe_timeout: 1s")
	var rec recorder
	b := New(cfg, rec.hook)
	fail, ok := Outcome{Status: 503}, Outcome{Status: 200}
	b.ObserveAt(0, fail)
	now := time.Duration(0)
	// Each step: the breaker half-opens when the last open period ends,
	// the probe fails (or times out), and the next period is longer.
	for i, want := range []time.Duration{1 * s, 2 * s, 4 * s, 5 * s, 5 * s} {
		if st := b.StatsAt(now); st.State != Open || st.RetryAfter != want {
			t.Fatalf("opening %d: %+v, want open for %v", i, st, want)
		}
		now += want
		if allowed, _ := b.AllowAt(now); !allowed {
			t.Fatalf("opening %d: no probe admitted at %v", i, now)
		}
		if i == 2 {
			// Slot taken: the hint covers the timeout and the next,
			// longer period (4s doubled, capped at 5s).
			if allowed, wait := b.AllowAt(now); allowed || wait != 1*s+5*s {
				t.Fatalf("hint while half-open = %v, %v; want 6s", allowed, wait)
			}
		}
		if i%2 == 0 {
			b.ObserveAt(now, fail)
		} else {
			now += 1 * s // the probe times out
			b.AdvanceAt(now)
		}
	}
	// A probe that succeeds closes the breaker; the next opening from
	// closed starts again at open_duration.
	now += 5 * s
	b.AllowAt(now)
	b.ObserveAt(now, ok)
	if b.State() != Closed {
		t.Fatalf("state after a good probe: %v", b.State())
	}
	b.ObserveAt(now, fail)
	if st := b.StatsAt(now); st.State != Open || st.RetryAfter != 1*s {
		t.Fatalf("after closing and reopening: %+v, want open for 1s", st)
	}
}

// latency_percentile trips exactly when the nearest-rank percentile of the
// window's response times is above max_response_time: checked against a
// sort of random samples.
func TestLatencyPercentileIsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, p := range []float64{0.5, 0.9, 0.99, 0.999, 1} {
		cfg := mustConfig(t, fmt.Sprintf("strategy: latency_percentile, threshold: %v, max_response_time: 100ms", p))
		for trial := range 300 {
			n := 1 + rng.IntN(400)
			rts := make([]time.Duration, n)
			slow := uint64(0)
			for i := range rts {
				rts[i] = time.Duration(rng.IntN(200)) * ms
				if trial%3 == 0 { // mostly fast: the tail decides
					rts[i] = time.Duration(rng.IntN(110)) * ms
				}
				if cfg.Failed(Outcome{ResponseTime: rts[i]}) {
					slow++
				}
			}
			slices.Sort(rts)
			rank := int(math.Ceil(p*float64(n) - 1e-9)) // 1-based nearest rank
			want := rts[rank-1] > 100*ms
			if got := cfg.tripped(slow, uint64(n)); got != want {
				t.Fatalf("p=%v n=%d slow=%d: tripped %v, percentile %v", p, n, slow, got, rts[rank-1])
			}
		}
	}
}

// A p99 breaker opens on a shift of the tail alone: the median stays put.
func TestLatencyPercentileTripsOnTheTail(t *testing.T) {
	cfg := mustConfig(t, "strategy: latency_percentile, threshold: 0.99, max_response_time: 200ms, min_requests: 100, window: 10s, buckets: 10")
	var rec recorder
	b := New(cfg, rec.hook)
	now := time.Duration(0)
	observe := func(n int, rt time.Duration) {
		for range n {
			now += ms
			b.ObserveAt(now, Outcome{ResponseTime: rt, Status: 200})
		}
	}
	observe(990, 20*ms) // the median and p99 fast
	observe(10, 500*ms) // 1% slow: p99 is still 20ms (rank 990)
	if b.State() != Closed {
		t.Fatalf("opened with p99 at the bound: %v", rec.last())
	}
	observe(1, 500*ms) // 11 of 1001 slow: the 991st is slow
	if b.State() != Open {
		t.Fatalf("p99 above 200ms with the median at 20ms did not open: %+v", b.StatsAt(now))
	}
}

// TestProbeAttribution: an outcome carrying probe ids is the result of
// exactly those probes; once a breaker has seen one, a straggler is never
// taken for its probe.
// (slowConfig: open 5s, 2 probes, probe timeout 1s.)
func TestProbeAttribution(t *testing.T) {
	tagged := func(o Outcome, ids ...uint64) Outcome { o.Probes = ids; return o }
	type step struct {
		at      time.Duration
		outcome *Outcome // nil: a request asks AllowProbeAt
		probe   int      // for outcomes: report with the id of the n-th admitted probe (1-based); 0 untagged, -1 an unknown id
		want    State
	}
	o := func(at time.Duration, out Outcome, probe int, want State) step {
		return step{at: at, outcome: &out, probe: probe, want: want}
	}
	ask := func(at time.Duration, want State) step { return step{at: at, want: want} }
	for _, tt := range []struct {
		name  string
		steps []step
	}{
		{"tagged results close it, in any order", []step{
			ask(5*s, HalfOpen), ask(5*s+1, HalfOpen),
			o(5*s+2, fast, 2, HalfOpen), o(5*s+3, fast, 1, Closed),
		}},
		{"a tagged failure reopens it", []step{
			ask(5*s, HalfOpen), o(5*s+1, slow, 1, Open),
		}},
		{"an unknown id decides nothing", []step{
			ask(5*s, HalfOpen), o(5*s+1, slow, -1, HalfOpen), o(5*s+2, fast, -1, HalfOpen),
		}},
		{"once tagged, an untagged straggler decides nothing", []step{
			ask(5*s, HalfOpen), ask(5*s+1, HalfOpen),
			o(5*s+2, fast, 1, HalfOpen), // the breaker learns its feed tags probes
			o(5*s+3, slow, 0, HalfOpen), // a straggler: not the second probe
			o(5*s+4, fast, 2, Closed),   // the second probe's own result
		}},
		{"untagged outcomes are probes, first in first out, on a feed without tags", []step{
			ask(5*s, HalfOpen), ask(5*s+1, HalfOpen), o(5*s+2, fast, 0, HalfOpen), o(5*s+3, fast, 0, Closed),
		}},
		{"a tagged probe that never reports still times out", []step{
			ask(5*s, HalfOpen), o(5*s+1, fast, -1, HalfOpen), ask(6*s, Open),
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var rec recorder
			b := openBreaker(t, &rec, 0)
			var ids []uint64
			for i, st := range tt.steps {
				if st.outcome == nil {
					if ok, id, _ := b.AllowProbeAt(st.at); ok && id != 0 {
						ids = append(ids, id)
					}
				} else {
					out := *st.outcome
					switch {
					case st.probe > 0:
						out = tagged(out, ids[st.probe-1])
					case st.probe < 0:
						out = tagged(out, 0xdead_beef)
					}
					b.ObserveAt(st.at, out)
				}
				if got := b.State(); got != st.want {
					t.Fatalf("step %d: state %v, want %v (transitions %+v)", i, got, st.want, rec.got)
				}
			}
		})
	}
}

// TestRampAfterClosing: with ramp_duration, a breaker that closes from
// half-open admits a rising share of requests: d/ramp_duration at d into
// the ramp, by counts, then all; a refusal's retry hint is when the next
// request passes; failures in the ramp open it as in any closed state.
func TestRampAfterClosing(t *testing.T) {
	closeAt := func(t *testing.T, block string) (*Breaker, time.Duration) {
		t.Helper()
		b := New(mustConfig(t, block), nil)
		b.ObserveAt(0, Outcome{Status: 503})
		if b.State() != Open {
			t.Fatalf("state %v after a 503, want open", b.State())
		}
		ok, id, _ := b.AllowProbeAt(5 * s)
		if !ok || id == 0 {
			t.Fatal("no probe admitted at the end of open_duration")
		}
		b.ObserveAt(5*s+ms, Outcome{Status: 200, Probes: []uint64{id}})
		if b.State() != Closed {
			t.Fatalf("state %v after the probe succeeded, want closed", b.State())
		}
		return b, 5*s + ms
	}
	t.Run("no ramp: all at once", func(t *testing.T) {
		b, t0 := closeAt(t, "strategy: error_count, threshold: 1, open_duration: 5s")
		for i := range 100 {
			if ok, _ := b.AllowAt(t0 + time.Duration(i)*ms); !ok {
				t.Fatalf("request %d refused just after closing without a ramp", i)
			}
		}
	})
	t.Run("ramp: the share rises with time", func(t *testing.T) {
		b, t0 := closeAt(t, "strategy: error_count, threshold: 1, open_duration: 5s, ramp_duration: 10s")
		// 100 requests a second, evenly, through the 10 s ramp and 1 s after.
		admitted := make([]int, 11)
		for i := range 1100 {
			if ok, _ := b.AllowAt(t0 + time.Duration(i)*10*ms); ok {
				admitted[i/100]++
			}
		}
		// Second k of the ramp admits about (k+0.5)/10 of its requests.
		for k := range 10 {
			if want := 10*k + 5; admitted[k] < want-2 || admitted[k] > want+2 {
				t.Errorf("second %d of the ramp admitted %d of 100, want %d±2", k, admitted[k], want)
			}
		}
		if admitted[10] != 100 {
			t.Errorf("after the ramp %d of 100 admitted, want all", admitted[10])
		}
		if !b.Steady() {
			t.Error("not steady after the ramp")
		}
	})
	t.Run("ramp: a refusal's hint is when the next request passes", func(t *testing.T) {
		b, t0 := closeAt(t, "strategy: error_count, threshold: 1, open_duration: 5s, ramp_duration: 10s")
		at := t0 + s
		for range 20 {
			ok, retry := b.AllowAt(at)
			if ok {
				at += 5 * ms
				continue
			}
			if retry <= 0 {
				t.Fatalf("at %v: refused with hint %v", at, retry)
			}
			if retry <= 2 {
				// The next request passes at once.
			} else if early, _ := b.AllowAt(at + retry - 2); early {
				t.Fatalf("at %v: a request before the hint (%v) passed: the hint is not the earliest", at, retry)
			}
			if next, _ := b.AllowAt(at + retry); !next {
				t.Fatalf("at %v: refused with hint %v, and refused again at the hint", at, retry)
			}
			at += retry
		}
	})
	t.Run("the admitted share follows d/ramp_duration", func(t *testing.T) {
		b, t0 := closeAt(t, "strategy: error_count, threshold: 1, open_duration: 5s, ramp_duration: 10s")
		// A burst of 1000 requests at 3 s into the ramp: 30% pass.
		n := 0
		for range 1000 {
			if ok, _ := b.AllowAt(t0 + 3*s); ok {
				n++
			}
		}
		if n < 299 || n > 301 {
			t.Errorf("%d of 1000 admitted at 30%% of the ramp, want 300", n)
		}
		if st := b.StatsAt(t0 + 3*s); st.State != Closed || st.RampShare < 0.29 || st.RampShare > 0.31 {
			t.Errorf("stats in the ramp: %+v", st)
		}
	})
	t.Run("the ramp's edges", func(t *testing.T) {
		b, _ := closeAt(t, "strategy: error_count, threshold: 1, open_duration: 5s")
		if !b.Steady() {
			t.Error("not steady at once after closing without a ramp")
		}
		const ramp = "strategy: error_count, threshold: 1, open_duration: 5s, ramp_duration: 10s"
		// Halfway, each request adds half a request's credit: of two at
		// one instant, the second brings it to exactly 1 and passes.
		b, t0 := closeAt(t, ramp)
		if first, _ := b.AllowAt(t0 + 5*s); first {
			t.Error("the first request halfway through the ramp passed with half a credit")
		}
		if second, _ := b.AllowAt(t0 + 5*s); !second {
			t.Error("the second request halfway through the ramp, at a credit of exactly 1, was refused")
		}
		// At the ramp's very end it is over: no share, and steady once a
		// request has passed.
		b, t0 = closeAt(t, ramp)
		if st := b.StatsAt(t0 + 10*s); st.RampShare != 0 {
			t.Errorf("ramp share %v at the ramp's end, want 0", st.RampShare)
		}
		if ok, _ := b.AllowAt(t0 + 10*s); !ok || !b.Steady() {
			t.Errorf("at the ramp's end: allowed %v, steady %v; want both", ok, b.Steady())
		}
	})
	t.Run("a failure in the ramp opens it", func(t *testing.T) {
		b, t0 := closeAt(t, "strategy: error_count, threshold: 1, open_duration: 5s, ramp_duration: 10s")
		b.ObserveAt(t0+s, Outcome{Status: 503})
		if b.State() != Open {
			t.Fatalf("state %v after a 503 in the ramp, want open", b.State())
		}
		if b.Steady() {
			t.Error("an open breaker reads steady")
		}
	})
}
