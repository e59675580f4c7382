package window

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// TestChargeAlwaysGoesIntoDebt plays the budget scenario of a token limit
// on each algorithm that serves ChargeAlways: a check passes, a charge of
// 150 against 100 is recorded and refused, the next check is refused with
// a Reset at which it passes, and after the window everything is paid.
func TestChargeAlwaysGoesIntoDebt(t *testing.T) {
	w := time.Minute
	for _, tc := range []struct {
		name string
		m    interface {
			AllowAt(now time.Duration, hits, limit uint64) Result
			ChargeAt(now time.Duration, hits, limit uint64) Result
		}
		// wantReset is the Reset of the check after the charge.
		wantReset time.Duration
	}{
		{"sliding_window", NewCounter(mustSpec(t, w, 1)), w},
		{"fixed_window", NewFixedCounter(mustSpec(t, w, 1)), w - 10*time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := 10 * time.Second
			if r := tc.m.ChargeAt(at, 0, 100); !r.Allowed || r.Recorded || r.Remaining != 100 {
				t.Fatalf("check on an empty window: %+v", r)
			}
			r := tc.m.ChargeAt(at, 150, 100)
			if r.Allowed || !r.Recorded || r.Remaining != 0 {
				t.Fatalf("charge of 150 against 100: %+v, want refused, recorded, 0 remaining", r)
			}
			if r.Reset < tc.wantReset || r.Reset > tc.wantReset+TickLength(w) {
				t.Fatalf("charge's reset %v, want %v (up to a tick later)", r.Reset, tc.wantReset)
			}
			check := tc.m.AllowAt(at+time.Second, 0, 100)
			if check.Allowed || check.Remaining != 0 {
				t.Fatalf("check in debt: %+v, want refused with 0 remaining", check)
			}
			pass := at + time.Second + check.Reset
			if early := tc.m.AllowAt(pass-time.Nanosecond, 0, 100); early.Allowed {
				t.Fatalf("check passed 1ns before its reset %v: %+v", check.Reset, early)
			}
			if later := tc.m.AllowAt(pass, 0, 100); !later.Allowed || later.Remaining != 100 {
				t.Fatalf("check at its reset: %+v, want allowed with 100 remaining", later)
			}
			// Without ChargeAlways the same charge records nothing.
			if r := tc.m.AllowAt(pass, 150, 100); r.Recorded {
				t.Fatalf("AllowAt recorded hits that do not fit: %+v", r)
			}
		})
	}
}

// TestChargeAlwaysDebtAgesOutWithTheWindow is the sliding window's debt
// against an exact log of every charged hit, on random traces of clients
// that check (0 hits) and, when admitted, charge a random cost, often more
// than is left:
//
//   - always: a check is never admitted while the real window holds the
//     limit or more, and the estimate is never below the real count;
//   - when every charge follows its own admitted check (no charges in
//     flight while in debt): a check is refused only when the real window,
//     times rounded up to the tick, has less than one block of room, so a
//     debt heals as its hits age out;
//   - with charges in flight (several checks admitted before their
//     charges arrive): a debt built of several charges ages out with the
//     newest of them at the latest.
func TestChargeAlwaysDebtAgesOutWithTheWindow(t *testing.T) {
	w := time.Second
	tick := TickLength(w)
	for _, limit := range []uint64{5, ExactLimit, Blocks, 1000, 100_000} {
		for _, inFlight := range []int{1, 4} {
			rng := rand.New(rand.NewPCG(limit, uint64(inFlight)))
			b := (max(limit, Blocks) + Blocks - 1) / Blocks
			for trace := range 20 {
				c := NewCounter(mustSpec(t, w, 1))
				log := &exactLog{w: w}
				now, pending, newest := time.Duration(0), 0, time.Duration(-1)
				for range 400 {
					now += time.Duration(rng.Int64N(int64(w) / 8))
					if pending > 0 && (pending == inFlight || rng.IntN(2) == 0) {
						pending--
						hits := 1 + rng.Uint64N(limit*3/2)
						if r := c.ChargeAt(now, hits, limit); !r.Recorded {
							t.Fatalf("limit %d trace %d at %v: charge of %d not recorded: %+v", limit, trace, now, hits, r)
						}
						log.add(now, hits)
						newest = now
						continue
					}
					r := c.ChargeAt(now, 0, limit)
					real, rounded := log.count(now, 0), log.count(now, tick)
					switch {
					case r.Allowed && real >= limit:
						t.Fatalf("limit %d trace %d at %v: check admitted with %d in the window", limit, trace, now, real)
					case c.CountAt(now) < min(real, MaxLimit):
						t.Fatalf("limit %d trace %d at %v: estimate %d below the real %d", limit, trace, now, c.CountAt(now), real)
					case !r.Allowed && inFlight == 1 && rounded+1+b <= limit:
						t.Fatalf("limit %d trace %d at %v: check refused with %d in the (rounded) window", limit, trace, now, rounded)
					case !r.Allowed && newest >= 0 && now >= newest+w+tick:
						t.Fatalf("limit %d trace %d at %v: check refused a window after the newest charge at %v", limit, trace, now, newest)
					}
					if r.Allowed && pending < inFlight {
						pending++
					}
				}
			}
		}
	}
}

// TestChargeAlwaysRetryAfterIsHonest: after every charge into debt, a check
// is refused 1ns before the charge's Reset and admitted at it.
func TestChargeAlwaysRetryAfterIsHonest(t *testing.T) {
	w := time.Second
	for _, limit := range []uint64{3, Blocks, 1000, 50_000} {
		rng := rand.New(rand.NewPCG(limit, 5))
		c := NewCounter(mustSpec(t, w, 1))
		now, debts := time.Duration(0), 0
		for range 2000 {
			now += time.Duration(rng.Int64N(int64(w) / 4))
			r := c.ChargeAt(now, 1+rng.Uint64N(limit), limit)
			if r.Allowed {
				continue
			}
			debts++
			if early := c.AllowAt(now+r.Reset-1, 0, limit); early.Allowed {
				t.Fatalf("limit %d: charged into debt at %v with reset %v, but a check passed 1ns earlier", limit, now, r.Reset)
			}
			now += r.Reset
			if again := c.AllowAt(now, 0, limit); !again.Allowed {
				t.Fatalf("limit %d: check at the reset %v refused: %+v", limit, r.Reset, again)
			}
		}
		if debts < 100 {
			t.Fatalf("limit %d: only %d charges into debt: the trace does not test them", limit, debts)
		}
	}
}

// TestChargeAlwaysInStore: through Store.DoAt, an always-charged request is
// recorded even on a new key, keeps its hits when another request of the
// batch vetoes, vetoes the others itself when it does not fit, and is an
// error on an algorithm that does not serve it.
func TestChargeAlwaysInStore(t *testing.T) {
	ctx := context.Background()
	spec := mustSpec(t, time.Minute, 1)
	s := NewStore(StoreOptions{})
	do := func(now time.Duration, reqs ...Request) []Result {
		t.Helper()
		res := make([]Result, len(reqs))
		if err := s.DoAt(ctx, now, reqs, res); err != nil {
			t.Fatal(err)
		}
		return res
	}
	tokens := func(hits uint64) Request {
		return Request{Key: "tokens", Spec: spec, Limit: 100, Hits: hits, Veto: true, ChargeAlways: true}
	}
	// A charge larger than the limit on a new key is recorded.
	if r := do(0, tokens(150))[0]; r.Allowed || !r.Recorded || r.Remaining != 0 || r.Reset != time.Minute {
		t.Fatalf("charge of 150 on a new key: %+v", r)
	}
	if n := s.CountAt("tokens", time.Second); n != 150 {
		t.Fatalf("counted %d, want 150", n)
	}
	// Its refusal vetoes the batch's other hits; its own stay.
	res := do(time.Second, tokens(10), Request{Key: "calls", Spec: spec, Limit: 5, Hits: 1, Veto: true})
	if res[0].Allowed || !res[0].Recorded || res[1].Recorded || !res[1].Allowed {
		t.Fatalf("charge in debt beside a call: %+v", res)
	}
	if n, c := s.CountAt("tokens", time.Second), s.CountAt("calls", time.Second); n != 160 || c != 0 {
		t.Fatalf("counted tokens %d (want 160) and calls %d (want 0)", n, c)
	}
	// Another request's veto does not take an always-charged hit back.
	res = do(2*time.Minute, tokens(10), Request{Key: "banned", Spec: spec, Limit: 0, Hits: 1, Veto: true})
	if !res[0].Allowed || !res[0].Recorded || res[1].Allowed {
		t.Fatalf("charge beside a refusal: %+v", res)
	}
	if n := s.CountAt("tokens", 2*time.Minute); n != 10 {
		t.Fatalf("after the veto counted %d, want the charge's 10", n)
	}
	for _, alg := range []Algorithm{TokenBucket, SlidingLog, TimeBuckets} {
		err := s.DoAt(ctx, 0, []Request{{Key: "x", Spec: spec, Limit: 10, Hits: 1, Algorithm: alg, ChargeAlways: true}}, make([]Result, 1))
		if !errors.Is(err, ErrChargeAlways) {
			t.Fatalf("%v with ChargeAlways: err %v, want ErrChargeAlways", alg, err)
		}
	}
}

// TestChargeAlwaysCapsAtMaxLimit: charges beyond what 32-bit counts hold
// saturate instead of wrapping around.
func TestChargeAlwaysCapsAtMaxLimit(t *testing.T) {
	spec := mustSpec(t, time.Minute, 1)
	c, f := NewCounter(spec), NewFixedCounter(spec)
	for range 3 {
		c.ChargeAt(0, MaxLimit, 10)
		f.ChargeAt(0, MaxLimit, 10)
	}
	if n := c.CountAt(0); n != MaxLimit {
		t.Fatalf("sliding window counted %d, want MaxLimit", n)
	}
	if r := f.AllowAt(0, 0, MaxLimit); r.Allowed || r.Remaining != 0 {
		t.Fatalf("fixed window after saturating charges: %+v", r)
	}
}
