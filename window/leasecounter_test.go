package window

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestLeaseCounter plays a concurrency limit of 2 with 10s leases, one step
// per row: admission up to the cap, refusal at it with the time the first
// lease ends, refunds by holder, a lease that ends without its refund, a
// late refund that frees nothing, slots held by nobody, and a holder
// admitted twice.
func TestLeaseCounter(t *testing.T) {
	const s = time.Second
	c := NewLeaseCounter(mustSpec(t, 10*s, 1))
	a, b, d, e := HolderID("a"), HolderID("b"), HolderID("d"), HolderID("e")
	acquire := func(holder uint64) func(time.Duration) Result {
		return func(now time.Duration) Result { return c.AcquireAt(now, holder, 1, 2) }
	}
	release := func(holder uint64) func(time.Duration) Result {
		return func(now time.Duration) Result { c.ReleaseAt(now, holder, 1); return c.AcquireAt(now, 0, 0, 2) }
	}
	for i, step := range []struct {
		at   time.Duration
		what string
		do   func(time.Duration) Result
		want Result // Bucket not compared
		held uint64
	}{
		{0, "a starts", acquire(a), Result{Allowed: true, Recorded: true, Remaining: 1, Reset: 10 * s}, 1},
		{1 * s, "b starts", acquire(b), Result{Allowed: true, Recorded: true, Remaining: 0, Reset: 10 * s}, 2},
		{2 * s, "d refused at the cap", acquire(d), Result{Remaining: 0, Reset: 8 * s}, 2},
		{3 * s, "a ends", release(a), Result{Allowed: true, Remaining: 1, Reset: 8 * s}, 1},
		{3 * s, "a's second refund frees nothing", release(a), Result{Allowed: true, Remaining: 1, Reset: 8 * s}, 1},
		{4 * s, "d starts", acquire(d), Result{Allowed: true, Recorded: true, Remaining: 0, Reset: 10 * s}, 2},
		// b never refunds: its lease ends at 11s.
		{11 * s, "b's lease ended", acquire(e), Result{Allowed: true, Recorded: true, Remaining: 0, Reset: 10 * s}, 2},
		{12 * s, "b's late refund frees nothing", release(b), Result{Remaining: 0, Reset: 2 * s}, 2},
		{12 * s, "still full", acquire(a), Result{Remaining: 0, Reset: 2 * s}, 2},
		{14 * s, "d's lease ended too", acquire(0), Result{Allowed: true, Recorded: true, Remaining: 0, Reset: 10 * s}, 2},
		{15 * s, "a refund by nobody frees the oldest slot held by nobody", release(0), Result{Allowed: true, Remaining: 1, Reset: 6 * s}, 1},
		{16 * s, "e admitted again holds two slots", func(now time.Duration) Result { return c.AcquireAt(now, e, 1, 3) },
			Result{Allowed: true, Recorded: true, Remaining: 1, Reset: 10 * s}, 2},
		{17 * s, "e's refund of two gives both back", func(now time.Duration) Result { c.ReleaseAt(now, e, 2); return c.AcquireAt(now, 0, 0, 2) },
			Result{Allowed: true, Remaining: 2, Reset: 0}, 0},
		{17 * s, "more than the cap is never admitted", func(now time.Duration) Result { return c.AcquireAt(now, a, 3, 2) },
			Result{Remaining: 2, Reset: 10 * s}, 0},
	} {
		got := step.do(step.at)
		got.Bucket = 0
		if got != step.want {
			t.Fatalf("step %d at %v (%s): %+v, want %+v", i, step.at, step.what, got, step.want)
		}
		if n := c.CountAt(step.at); n != step.held {
			t.Fatalf("step %d at %v (%s): %d slots held, want %d", i, step.at, step.what, n, step.held)
		}
	}
	if !c.idleAt(17 * s) {
		t.Fatal("a counter holding nothing is not idle")
	}
}

// TestLeaseCounterNeverOverCap hammers one key from many goroutines that
// acquire and release their own slots: the slots held never exceed the cap,
// and once every holder released, none is held.
func TestLeaseCounterNeverOverCap(t *testing.T) {
	const limit = 5
	s := NewStore(StoreOptions{})
	spec := mustSpec(t, time.Hour, 1)
	var inFlight, peak atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				holder := string(rune('a'+g)) + string(rune(i))
				req := Request{Key: "k", Spec: spec, Limit: limit, Hits: 1, Veto: true, Algorithm: Concurrency, Holder: holder}
				res, err := s.Do(context.Background(), []Request{req})
				if err != nil {
					t.Error(err)
					return
				}
				if !res[0].Allowed {
					continue
				}
				n := inFlight.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				inFlight.Add(-1)
				req.Negative = true
				if _, err := s.Do(context.Background(), []Request{req}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > limit || p == 0 {
		t.Fatalf("peak in flight %d, want 1..%d", p, limit)
	}
	if n := s.CountAt("k", 0); n != 0 {
		t.Fatalf("%d slots held after every release", n)
	}
}

// TestLeaseCounterInStore: a vetoed batch gives back the slots it took
// (holder and nobody), refunds are applied only when nothing was vetoed,
// the memory of a key's leases is accounted, and limits above MaxLogLimit
// are refused.
func TestLeaseCounterInStore(t *testing.T) {
	ctx := context.Background()
	spec := mustSpec(t, time.Minute, 1)
	s := NewStore(StoreOptions{})
	slot := func(holder string, neg bool) Request {
		return Request{Key: "uploads", Spec: spec, Limit: 100, Hits: 1, Veto: true, Algorithm: Concurrency, Holder: holder, Negative: neg}
	}
	banned := Request{Key: "banned", Spec: spec, Limit: 0, Hits: 1, Veto: true}
	do := func(reqs ...Request) []Result {
		t.Helper()
		res := make([]Result, len(reqs))
		if err := s.DoAt(ctx, time.Second, reqs, res); err != nil {
			t.Fatal(err)
		}
		return res
	}
	do(slot("a", false))
	if res := do(slot("b", false), slot("", false), banned); res[0].Recorded || res[1].Recorded {
		t.Fatalf("vetoed batch: %+v", res)
	}
	if n := s.CountAt("uploads", time.Second); n != 1 {
		t.Fatalf("after a vetoed batch %d slots held, want a's 1", n)
	}
	do(slot("a", true), banned)
	if n := s.CountAt("uploads", time.Second); n != 1 {
		t.Fatalf("a refund in a vetoed batch was applied: %d slots held", n)
	}
	before := s.Stats().Bytes
	for i := range 100 {
		do(slot(string(rune(i+1000)), false))
	}
	if grew := s.Stats().Bytes - before; grew < 100*24 {
		t.Fatalf("100 leases accounted as %d bytes", grew)
	}
	err := s.DoAt(ctx, 0, []Request{{Key: "x", Spec: spec, Limit: MaxLogLimit + 1, Hits: 1, Algorithm: Concurrency}}, make([]Result, 1))
	if err == nil {
		t.Fatal("a concurrency limit above MaxLogLimit was accepted")
	}
}

// TestLeaseCounterEdges: slots of a 10 s lease, at the edges of the rules:
// a lease ends exactly a lease length after it started, slots taken at
// another time by nobody are a lease of their own, a release by nobody
// passes over named holders' slots, an undo finds a holder's lease
// whenever it started, and the whole limit at once fits.
func TestLeaseCounterEdges(t *testing.T) {
	const lease = 10 * time.Second
	t0 := time.Minute
	sp := mustSpec(t, lease, 1)
	const limit = 5
	acquire := func(c *LeaseCounter, at time.Duration, holder, n uint64) Result {
		t.Helper()
		r := c.AcquireAt(at, holder, n, limit)
		if !r.Recorded {
			t.Fatalf("acquire %d for %d at %v: %+v", n, holder, at, r)
		}
		return r
	}

	c := NewLeaseCounter(sp)
	acquire(c, t0, 0, 1)
	acquire(c, t0+lease/2, 0, 1) // not merged into the first lease
	if got := c.CountAt(t0 + lease - 1); got != 2 {
		t.Errorf("1ns before the first lease ends: %d held, want 2", got)
	}
	if got := c.CountAt(t0 + lease); got != 1 {
		t.Errorf("as the first lease ends: %d held, want the second's 1", got)
	}

	c = NewLeaseCounter(sp)
	acquire(c, t0, 7, 1) // a named holder's slot first
	acquire(c, t0, 0, 2)
	c.ReleaseAt(t0, 0, 2)
	if got := c.CountAt(t0); got != 1 {
		t.Errorf("after nobody released 2 of 2: %d held, want holder 7's 1", got)
	}
	c.ReleaseAt(t0, 7, 1)
	if got := c.CountAt(t0); got != 0 {
		t.Errorf("after holder 7 released: %d held, want 0", got)
	}

	c = NewLeaseCounter(sp)
	acquire(c, t0, 0, 1)
	acquire(c, t0, 7, 1) // a named holder at the same time: a lease of its own
	c.ReleaseAt(t0, 7, 1)
	if got := c.CountAt(t0); got != 1 {
		t.Errorf("after holder 7 released its own: %d held, want nobody's 1", got)
	}

	c = NewLeaseCounter(sp)
	acquire(c, t0, 7, 1)
	second := acquire(c, t0+time.Second, 7, 1)
	c.undoAt(second.Bucket, 7, 1)
	if got := c.CountAt(t0 + time.Second); got != 1 {
		t.Errorf("after undoing holder 7's second acquire: %d held, want 1", got)
	}
	c = NewLeaseCounter(sp)
	acquire(c, t0, 0, 1)
	second = acquire(c, t0+5*time.Second, 0, 1)
	c.undoAt(second.Bucket, 0, 1) // nobody's lease that started then
	if got := c.CountAt(t0 + lease); got != 0 {
		t.Errorf("after undoing nobody's second lease: %d held as the first ends, want 0", got)
	}

	// When refused, the time until enough leases end.
	c = NewLeaseCounter(sp)
	acquire(c, t0, 0, 2)
	acquire(c, t0+2*time.Second, 0, 2)
	if r := c.AcquireAt(t0+3*time.Second, 0, 3, limit); r.Allowed || r.Reset != 7*time.Second {
		t.Errorf("3 more with 4 of 5 held: %+v, want refused until the first lease ends in 7s", r)
	}
	c = NewLeaseCounter(sp)
	acquire(c, t0, 0, 1)
	if r := c.AcquireAt(t0+3*time.Second, 0, limit, limit); r.Allowed || r.Reset != 7*time.Second {
		t.Errorf("the whole limit with 1 held: %+v, want refused until it ends in 7s", r)
	}

	c = NewLeaseCounter(sp)
	if r := c.AcquireAt(t0, 0, limit, limit); !r.Allowed {
		t.Errorf("the whole limit at once: %+v, want allowed", r)
	}
	c = NewLeaseCounter(sp)
	acquire(c, t0, 0, 3)
	if r := c.AcquireAt(t0, 0, 3, limit); r.Allowed || r.Recorded {
		t.Errorf("3 more with 3 of 5 held: %+v, want refused", r)
	}
}

// TestLeaseCounterAccountsItsBytes: as holders come and go, the growth a
// lease counter reports (which the Store adds to its accounted bytes) sums
// to its footprint, a growing list is not shrunk on the way, and a list
// that empties gives its room back.
func TestLeaseCounterAccountsItsBytes(t *testing.T) {
	c := NewLeaseCounter(mustSpec(t, time.Minute, 1))
	t0 := time.Hour
	accounted := c.footprint()
	check := func(what string) {
		t.Helper()
		accounted += c.takeGrowth()
		if fp := c.footprint(); accounted != fp {
			t.Fatalf("%s: %d bytes accounted, footprint %d", what, accounted, fp)
		}
	}
	resizes, last := 0, cap(c.leases)
	for h := uint64(1); h <= 100; h++ {
		if !c.AcquireAt(t0, h, 1, 1000).Recorded {
			t.Fatalf("holder %d refused", h)
		}
		check(fmt.Sprint("holder ", h, " in"))
		if cap(c.leases) != last {
			resizes, last = resizes+1, cap(c.leases)
		}
	}
	if resizes > 12 { // appends double: about log2(100)
		t.Errorf("the list was resized %d times while growing to 100: it shrinks as it grows", resizes)
	}
	if got := cap(c.leases); got < 100 {
		t.Fatalf("100 leases in a list of capacity %d", got)
	}
	for h := uint64(1); h < 100; h++ {
		c.ReleaseAt(t0, h, 1)
		check(fmt.Sprint("holder ", h, " out"))
	}
	if got := cap(c.leases); got > 32 {
		t.Errorf("one lease left in a list of capacity %d: its room was not given back", got)
	}
}

// TestLeaseCounterShrinkPolicy: a lease list gives back room when it holds
// under a quarter of its capacity, halving it, and keeps a capacity of 16
// whatever it holds (resized's contract; TestLeaseCounterAccountsItsBytes
// checks that the accounted bytes follow).
func TestLeaseCounterShrinkPolicy(t *testing.T) {
	c := NewLeaseCounter(mustSpec(t, time.Minute, 1))
	t0 := time.Hour
	for h := uint64(1); h <= 17; h++ {
		if !c.AcquireAt(t0, h, 1, 1000).Recorded {
			t.Fatalf("holder %d refused", h)
		}
	}
	if got := cap(c.leases); got != 32 {
		t.Fatalf("17 leases in a list of capacity %d, want 32 (append doubles)", got)
	}
	for h := uint64(17); h >= 2; h-- {
		c.ReleaseAt(t0, h, 1)
		n := len(c.leases)
		want := 32
		if n < 32/4 {
			want = 16
		}
		if got := cap(c.leases); got != want {
			t.Fatalf("%d leases: capacity %d, want %d", n, got, want)
		}
	}
}
