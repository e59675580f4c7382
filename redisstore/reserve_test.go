package redisstore

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/internal/testclock"
	"github.com/leapgate/leapgate/window"
)

// reservingStore is a Store on r that takes blocks valid for validity.
func reservingStore(t *testing.T, addr string, validity time.Duration, reg prometheus.Registerer) *Store {
	t.Helper()
	st := settingsFor(addr)
	st.Reservation = validity
	s := newTestStore(t, st, Options{Registry: reg})
	waitHealthy(t, s)
	return s
}

// TestReservationsHoldTheLimitAcrossStores: two replicas that answer most
// requests from blocks admit no more than the limit, and, once their
// blocks are given back, exactly the limit: the blocks strand nothing.
func TestReservationsHoldTheLimitAcrossStores(t *testing.T) {
	r := redistest.Start(t)
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	stores := []*Store{
		reservingStore(t, r.Addr(), 100*time.Millisecond, regs[0]),
		reservingStore(t, r.Addr(), 100*time.Millisecond, regs[1]),
	}
	// A window far longer than the test: every admitted hit is inside one
	// window, so the limit is an exact bound on the admitted total.
	sp := mustSpec(t, time.Hour, 1)
	const limit = 20_000
	req := []window.Request{{Key: "far", Spec: sp, Limit: limit, Hits: 1, Veto: true}}
	ctx := context.Background()
	var admitted, asked atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3000 {
				res, err := stores[w%2].Do(ctx, req)
				if err != nil {
					t.Error(err)
					return
				}
				asked.Add(1)
				if res[0].Recorded {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := admitted.Load(); n > limit {
		t.Fatalf("admitted %d across two replicas, over the limit of %d", n, limit)
	}
	var fromBlocks float64
	for _, reg := range regs {
		fromBlocks += gatherCounter(t, reg, "leapgate_redis_block_answers_total")
	}
	t.Logf("%d of %d requests admitted, %.0f answered from blocks", admitted.Load(), asked.Load(), fromBlocks)
	if fromBlocks < float64(asked.Load())/2 {
		t.Errorf("only %.0f of %d requests were answered from blocks", fromBlocks, asked.Load())
	}

	// Idle blocks are given back within a quarter of their validity and
	// a sweep: then the rest of the limit is there to take, to the hit.
	time.Sleep(300 * time.Millisecond)
	for refusals := 0; refusals < 20; {
		res, err := stores[refusals%2].Do(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Recorded {
			admitted.Add(1)
		} else {
			refusals++
		}
	}
	if n := admitted.Load(); n != limit {
		t.Fatalf("admitted %d in all, want the limit %d exactly", n, limit)
	}
}

// gatherCounter is the value of the counter name in reg (summed over its
// labels).
func gatherCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestReservationsNeverOvershootAWindow: two replicas with blocks, on one
// clock that is both theirs and Redis's, under load that swings between
// far below the limit (blocks are granted) and far above it (the key sits
// at its limit with blocks outstanding): no window of length W ever holds
// more than the limit, and they admit nearly what an exact sliding log
// admits of the same requests.
func TestReservationsNeverOvershootAWindow(t *testing.T) {
	r := redistest.Start(t)
	clock := testclock.At(base)
	var stores []*Store
	for range 2 {
		st := settingsFor(r.Addr())
		st.Reservation = time.Second // capped at W/32
		s := withFakeTime(newTestStore(t, st, Options{Clock: clock}), clock)
		waitHealthy(t, s)
		stores = append(stores, s)
	}
	const limit, w = 1000, time.Second
	sp := mustSpec(t, w, 1)
	req := []window.Request{{Key: "swing", Spec: sp, Limit: limit, Hits: 1, Veto: true}}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	var offered, admitted []time.Duration
	for step := range 6000 { // 6 s in steps of 1 ms
		clock.Advance(time.Millisecond)
		n := 0
		if (step/700)%2 == 1 {
			n = 3 // 6,000 a second: six times the limit
		} else if rng.IntN(3) == 0 {
			n = 1 // about 670 a second
		}
		for i := range 2 * n {
			now := clock.Now()
			res, err := stores[i%2].Do(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			offered = append(offered, now)
			if res[0].Recorded {
				admitted = append(admitted, now)
			}
		}
		if step%10 == 0 {
			time.Sleep(100 * time.Microsecond) // let blocks be granted and settled
		}
	}
	// Every window (t-W, t] ending at an admission.
	for i, j := 0, 0; i < len(admitted); i++ {
		for admitted[j] <= admitted[i]-w {
			j++
		}
		if i-j+1 > limit {
			t.Fatalf("%d admitted in the window ending at %v, over the limit %d", i-j+1, admitted[i]-base, limit)
		}
	}
	exact := exactLogAdmits(offered, limit, w)
	t.Logf("offered %d, admitted %d, an exact sliding log admits %d (%.1f %%)", len(offered), len(admitted), exact,
		100*float64(len(admitted))/float64(exact))
	if float64(len(admitted)) < 0.95*float64(exact) {
		t.Errorf("admitted %d, under 95 %% of the exact log's %d", len(admitted), exact)
	}
}

// exactLogAdmits is how many of the requests at times offered (ascending)
// an exact sliding log of limit over w admits.
func exactLogAdmits(offered []time.Duration, limit int, w time.Duration) int {
	var log []time.Duration
	n := 0
	for _, t := range offered {
		for len(log) > 0 && log[0] <= t-w {
			log = log[1:]
		}
		if len(log) < limit {
			log = append(log, t)
			n++
		}
	}
	return n
}

// TestReserveScript drives the script's reservations directly, on a fake
// clock: what a grant takes, that a block counts in full for everyone
// else, what settling records and gives back, and what becomes of a block
// nobody settles.
func TestReserveScript(t *testing.T) {
	r := redistest.Start(t)
	clock := testclock.At(base)
	s := withFakeTime(newTestStore(t, settingsFor(r.Addr()), Options{}), clock)
	waitHealthy(t, s)
	ctx := context.Background()
	const v = 10 * time.Millisecond
	sp := mustSpec(t, time.Second, 1)
	type grant struct{ found, total, remaining int64 }
	reserve := func(key string, limit uint64, holder, used float64, want uint64) grant {
		t.Helper()
		req := window.Request{Key: key, Spec: sp}
		calls := []call{s.reserveCall(s.counterKey(&req), sp, limit, holder, used, want, v)}
		if err := s.runReserve(ctx, calls); err != nil {
			t.Fatal(err)
		}
		c := calls[0].vals
		return grant{c[0], c[1], c[2]}
	}
	// remaining is what a check of key reads.
	remaining := func(key string, limit uint64) uint64 {
		t.Helper()
		res, err := s.Do(ctx, []window.Request{{Key: key, Spec: sp, Limit: limit}})
		if err != nil {
			t.Fatal(err)
		}
		return res[0].Remaining
	}
	expect := func(what string, got, want any) {
		t.Helper()
		if got != want {
			t.Errorf("%s: got %v, want %v", what, got, want)
		}
	}

	expect("first grant", reserve("k", 1000, 1, -1, 100), grant{0, 100, 900})
	expect("a block counts in full", remaining("k", 1000), uint64(900))
	expect("a grant takes at most an eighth of the room", reserve("k", 1000, 2, -1, 1000), grant{0, 112, 788})
	// Holder 1 spent 30: recorded; 70 left; topped up to 100 again.
	expect("top-up", reserve("k", 1000, 1, 30, 100), grant{1, 100, 758})
	expect("after the top-up", remaining("k", 1000), uint64(758))
	// Holder 2 spent 12 and gives the rest back.
	expect("give back", reserve("k", 1000, 2, 12, 0), grant{1, 0, 858})
	expect("after giving back", remaining("k", 1000), uint64(858))
	// Holder 1's block is never settled: at its exp (2V after the grant)
	// it counts as spent in full, until a window has passed.
	clock.Advance(2 * v)
	expect("an unsettled block, spent in full", remaining("k", 1000), uint64(858))
	expect("nothing of it to settle", reserve("k", 1000, 1, 0, 0), grant{0, 0, 858})
	clock.Advance(time.Second + 2*v)
	expect("a window later", remaining("k", 1000), uint64(1000))

	// A block noticed only a window after it ended is dropped uncounted.
	expect("grant", reserve("late", 1000, 3, -1, 50), grant{0, 50, 950})
	clock.Advance(2 * time.Second)
	expect("dropped", remaining("late", 1000), uint64(1000))

	// Hits spent of a block Redis no longer holds (lost with its data)
	// are recorded all the same.
	expect("settling a lost block", reserve("lost", 1000, 4, 7, 0), grant{0, 0, 993})

	// Small grants are not made: near its limit a key goes to Redis hit by hit.
	expect("limit 20", reserve("small", 20, 5, -1, 100), grant{0, 0, 20})
	// At most eight blocks on one counter.
	for h := range 8 {
		if g := reserve("many", 1_000_000, float64(10+h), -1, 10); g.total != 10 {
			t.Fatalf("block %d: %+v", h, g)
		}
	}
	expect("a ninth block", reserve("many", 1_000_000, 20, -1, 10).total, int64(0))

	// A request the blocks leave no room for is refused until the first
	// of them must be settled.
	expect("grant", reserve("room", 100, 6, -1, 100), grant{0, 12, 88})
	res, err := s.Do(ctx, []window.Request{{Key: "room", Spec: sp, Limit: 100, Hits: 89}})
	if err != nil {
		t.Fatal(err)
	}
	expect("89 of 100 with 12 reserved", res[0].Allowed, false)
	expect("retry after", res[0].Reset, 2*v)
	res, err = s.Do(ctx, []window.Request{{Key: "room", Spec: sp, Limit: 100, Hits: 88}})
	if err != nil {
		t.Fatal(err)
	}
	expect("88 of 100 with 12 reserved", res[0].Allowed, true)
}
