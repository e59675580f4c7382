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
