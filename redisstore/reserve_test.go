package redisstore

import (
	"context"
	"fmt"
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
	return reservingStoreOn(t, settingsFor(addr), validity, reg)
}

// reservingStoreOn is reservingStore on the Redis of settings st.
func reservingStoreOn(t *testing.T, st Options, validity time.Duration, reg prometheus.Registerer) *Store {
	t.Helper()
	st.Reservation = validity
	s := newTestStore(t, st, Options{Registry: reg})
	waitHealthy(t, s)
	return s
}

// TestBlocksCountEveryHit: two replicas that answer most requests of a key
// far from its limit from blocks; once they have given their blocks back
// (Close), Redis counts every hit they admitted, no more and no less. On
// one node and on a Cluster.
func TestBlocksCountEveryHit(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		r := redistest.Start(t)
		blocksCountEveryHit(t, settingsFor(r.Addr()))
	})
	t.Run("cluster", func(t *testing.T) {
		st := settingsFor("")
		st.Topology, st.Addrs = Cluster, startCluster(t)
		blocksCountEveryHit(t, st)
	})
}

func blocksCountEveryHit(t *testing.T, settings Options) {
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	stores := []*Store{
		reservingStoreOn(t, settings, 100*time.Millisecond, regs[0]),
		reservingStoreOn(t, settings, 100*time.Millisecond, regs[1]),
	}
	sp := mustSpec(t, time.Hour, 1)
	const limit = 1_000_000_000
	req := []window.Request{{Key: "far", Spec: sp, Limit: limit, Hits: 1, Veto: true}}
	ctx := context.Background()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	const callers, calls = 8, 3000
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls {
				res, err := stores[w%2].Do(ctx, req)
				if err != nil {
					t.Error(err)
					return
				}
				if res[0].Recorded {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	var fromBlocks float64
	for _, reg := range regs {
		fromBlocks += gatherCounter(t, reg, "leapgate_redis_block_answers_total")
	}
	t.Logf("%d of %d requests admitted, %.0f answered from blocks", admitted.Load(), callers*calls, fromBlocks)
	if admitted.Load() != callers*calls {
		t.Fatalf("admitted %d of %d, far from the limit", admitted.Load(), callers*calls)
	}
	if fromBlocks < callers*calls/2 {
		t.Errorf("only %.0f of %d requests were answered from blocks", fromBlocks, callers*calls)
	}
	for _, s := range stores {
		s.Close()
	}
	plain := newTestStore(t, settings, Options{})
	waitHealthy(t, plain)
	if used := limit - check(t, plain, req[0]).Remaining; used != callers*calls {
		t.Fatalf("Redis counts %d hits after the blocks were given back, want the %d admitted", used, callers*calls)
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
// admits of the same requests. The same load without blocks runs beside
// it, for what blocks cost.
func TestReservationsNeverOvershootAWindow(t *testing.T) {
	for _, tt := range []struct {
		name        string
		reservation time.Duration
	}{
		{"blocks", time.Second}, // capped at W/32
		{"no blocks", 0},
	} {
		t.Run(tt.name, func(t *testing.T) { neverOvershootAWindow(t, tt.reservation) })
	}
}

func neverOvershootAWindow(t *testing.T, reservation time.Duration) {
	clock := testclock.At(base)
	stores, reg := replicasOnOneClock(t, clock, reservation)
	const limit, w = 1000, time.Second
	sp := mustSpec(t, w, 1)
	req := []window.Request{{Key: "swing", Spec: sp, Limit: limit, Hits: 1, Veto: true}}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	var offered, admitted []time.Duration
	var kinds []string
	// Redis expires keys by its own (real) clock, by TTLs the scripts set
	// in the fake time: the fake clock must never fall behind real time,
	// or a key would expire while its hits still count.
	start := time.Now()
	for step := range 3000 { // 3 s or more, in steps of at least 1 ms
		clock.Set(max(clock.Now()+time.Millisecond, base+time.Since(start)))
		n := 0
		if (step/500)%2 == 1 {
			n = 3 // 6,000 a second: six times the limit
		} else if rng.IntN(7) == 0 {
			n = 1 // about 290 a second: far from the limit, so blocks are granted
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
				kinds = append(kinds, fmt.Sprintf("%d:%v", i%2, isBlockBucket(res[0].Bucket)))
			}
		}
		// Let blocks be granted and settled: the calls for them run on
		// their own while the fake clock stands still.
		time.Sleep(200 * time.Microsecond)
	}
	// Every window (t-W, t] ending at an admission.
	for i, j := 0, 0; i < len(admitted); i++ {
		for admitted[j] <= admitted[i]-w {
			j++
		}
		if i-j+1 > limit {
			c := map[string]int{}
			for k := j; k <= i; k++ {
				c[kinds[k]]++
			}
			t.Logf("admissions in that window by replica:from a block: %v", c)
			t.Fatalf("%d admitted in the window ending at %v, over the limit %d", i-j+1, admitted[i]-base, limit)
		}
	}
	exact := exactLogAdmits(offered, limit, w)
	fromBlocks := gatherCounter(t, reg, "leapgate_redis_block_answers_total")
	t.Logf("offered %d, admitted %d, an exact sliding log admits %d (%.1f %%); %.0f answered from one replica's blocks",
		len(offered), len(admitted), exact, 100*float64(len(admitted))/float64(exact), fromBlocks)
	if on := reservation > 0; on != (fromBlocks > 0) {
		t.Errorf("blocks on %v, but %.0f requests were answered from blocks", on, fromBlocks)
	}
	if float64(len(admitted)) < 0.95*float64(exact) {
		t.Errorf("admitted %d, under 95 %% of the exact log's %d", len(admitted), exact)
	}
}

// replicasOnOneClock starts a redis-server and two Stores on it (two
// replicas) that take blocks valid for reservation (0: none), with clock
// as their clock and Redis's; reg holds the first one's metrics.
func replicasOnOneClock(t *testing.T, clock *testclock.Clock, reservation time.Duration) ([]*Store, *prometheus.Registry) {
	t.Helper()
	r := redistest.Start(t)
	reg := prometheus.NewRegistry()
	var stores []*Store
	for i := range 2 {
		st := settingsFor(r.Addr())
		st.Reservation = reservation
		opts := Options{Clock: clock}
		if i == 0 {
			opts.Registry = reg
		}
		s := withFakeTime(newTestStore(t, st, opts), clock)
		waitHealthy(t, s)
		stores = append(stores, s)
	}
	return stores, reg
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
	grace := v
	var age time.Duration // of the newest hit spent
	reserve := func(key string, limit uint64, holder, used float64, want uint64) grant {
		t.Helper()
		req := window.Request{Key: key, Spec: sp}
		calls := []call{s.reserveCall(s.counterKey(&req), sp, limit, holder, used, age, want, v, grace)}
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

	const l = 100_000 // W/V = 100: a block of want hits stands for 50*want a window
	expect("first grant", reserve("k", l, 1, -1, 100), grant{0, 100, 99_900})
	expect("a block counts in full", remaining("k", l), uint64(99_900))
	// Two blocks of 900: 2 * 45,000 a window would not fit in the room.
	expect("too much for the room", reserve("k", l, 2, -1, 1000), grant{0, 0, 99_900})
	expect("second grant", reserve("k", l, 2, -1, 900), grant{0, 900, 99_000})
	// Holder 1 spent 30: recorded; 70 left; topped up to 100 again.
	expect("top-up", reserve("k", l, 1, 30, 100), grant{1, 100, 98_970})
	expect("after the top-up", remaining("k", l), uint64(98_970))
	// Holder 2 spent 12 and gives the rest back.
	expect("give back", reserve("k", l, 2, 12, 0), grant{1, 0, 99_858})
	expect("after giving back", remaining("k", l), uint64(99_858))
	// Holder 1's block is never settled: at its exp (2V after the grant)
	// it counts as spent in full, until a window has passed.
	clock.Advance(2 * v)
	expect("an unsettled block, spent in full", remaining("k", l), uint64(99_858))
	expect("nothing of it to settle", reserve("k", l, 1, 0, 0), grant{0, 0, 99_858})
	clock.Advance(time.Second + 2*v)
	expect("a window later", remaining("k", l), uint64(l))

	// With a longer grace, a block is still Redis's to settle 2V on.
	grace = 3 * v
	expect("grant with a grace of 3V", reserve("grace", l, 8, -1, 50), grant{0, 50, 99_950})
	clock.Advance(2 * v)
	expect("settled within the grace", reserve("grace", l, 8, 5, 0), grant{1, 0, 99_995})
	grace = v

	// A block noticed only a window after it ended is dropped uncounted.
	expect("grant", reserve("late", l, 3, -1, 50), grant{0, 50, 99_950})
	clock.Advance(2 * time.Second)
	expect("dropped", remaining("late", l), uint64(l))

	// Hits spent of a block Redis no longer holds (lost with its data)
	// are recorded all the same.
	expect("settling a lost block", reserve("lost", l, 4, 7, 0), grant{0, 0, l - 7})

	// A key near its limit gets no block: 60,000 used leave 40,000, and
	// a block of 1,000 stands for 50,000 a window.
	if _, err := s.Do(ctx, []window.Request{{Key: "near", Spec: sp, Limit: l, Hits: 60_000}}); err != nil {
		t.Fatal(err)
	}
	expect("near the limit", reserve("near", l, 5, -1, 1000), grant{0, 0, 40_000})
	expect("far from it", reserve("near", l, 5, -1, 400), grant{0, 400, 39_600})
	expect("a small limit", reserve("small", 20, 6, -1, 4), grant{0, 0, 20})
	// At most eight blocks on one counter.
	for h := range 8 {
		if g := reserve("many", 1_000_000, float64(10+h), -1, 10); g.total != 10 {
			t.Fatalf("block %d: %+v", h, g)
		}
	}
	expect("a ninth block", reserve("many", 1_000_000, 20, -1, 10).total, int64(0))

	// A request the blocks leave no room for is refused until the first
	// of them must be settled.
	expect("grant", reserve("room", l, 7, -1, 1000), grant{0, 1000, 99_000})
	res, err := s.Do(ctx, []window.Request{{Key: "room", Spec: sp, Limit: l, Hits: 99_001}})
	if err != nil {
		t.Fatal(err)
	}
	expect("99,001 with 1,000 reserved", res[0].Allowed, false)
	expect("retry after", res[0].Reset, 2*v)
	res, err = s.Do(ctx, []window.Request{{Key: "room", Spec: sp, Limit: l, Hits: 99_000}})
	if err != nil {
		t.Fatal(err)
	}
	expect("99,000 with 1,000 reserved", res[0].Allowed, true)

	// The hits a block spent are recorded at the newest of them (the
	// replica says how long ago it was), however late the settling, so a
	// slow settling costs no capacity.
	const ms = time.Millisecond
	// resetOf is the Reset of a check of key: when the newest hits
	// counted leave the window.
	resetOf := func(key string) time.Duration {
		t.Helper()
		res, err := s.Do(ctx, []window.Request{{Key: key, Spec: sp, Limit: l}})
		if err != nil {
			t.Fatal(err)
		}
		return res[0].Reset
	}
	expect("grant", reserve("aged", l, 30, -1, 100), grant{0, 100, l - 100})
	clock.Advance(8 * ms)
	age = 6 * ms
	expect("settled 8 ms on, the newest hit 6 ms before", reserve("aged", l, 30, 5, 0), grant{1, 0, l - 5})
	age = 0
	expect("they leave a window after the newest", resetOf("aged"), time.Second-6*ms)
	// Never later than the block's useEnd (V after the grant): none was
	// spent after it.
	grace = 100 * ms
	expect("grant", reserve("capped", l, 31, -1, 100), grant{0, 100, l - 100})
	clock.Advance(40 * ms)
	expect("settled 30 ms after useEnd", reserve("capped", l, 31, 3, 0), grant{1, 0, l - 3})
	expect("recorded at useEnd", resetOf("capped"), time.Second-30*ms)
	grace = v
	// A block nobody settled counts in full from its useEnd, not from
	// when it is noticed.
	expect("grant", reserve("unsettled", l, 32, -1, 100), grant{0, 100, l - 100})
	clock.Advance(500 * ms)
	expect("noticed 490 ms after useEnd: spent in full", remaining("unsettled", l), uint64(l-100))
	expect("from useEnd", resetOf("unsettled"), time.Second-490*ms)
	// Never before the newest hits already counted (the log's stamps stay
	// in order): an older block hit counts from the newer hit's time.
	t0 := clock.Now()
	expect("grant", reserve("ordered", l, 33, -1, 100), grant{0, 100, l - 100})
	clock.Advance(5 * ms)
	if _, err := s.Do(ctx, []window.Request{{Key: "ordered", Spec: sp, Limit: l, Hits: 1}}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(3 * ms)
	age = 8 * ms // spent at the grant, before that hit
	expect("settled", reserve("ordered", l, 33, 2, 0), grant{1, 0, l - 3})
	age = 0
	clock.Set(t0 + time.Second + 2*ms)
	expect("a window after the block's hit, before the newer one's", remaining("ordered", l), uint64(l-3))
	clock.Set(t0 + time.Second + 6*ms) // stamps are rounded up to a tick (16 us)
	expect("a window after the newer hit", remaining("ordered", l), uint64(l))

	// A held block on a key that came near its limit, which would keep
	// more than an eighth of what is left besides it, is cut: the hits it
	// spent are settled, the rest stays held as it was (not renewed, its
	// exp unchanged) for the replica to give back at once.
	expect("grant", reserve("cut", l, 34, -1, 100), grant{0, 100, l - 100})
	if _, err := s.Do(ctx, []window.Request{{Key: "cut", Spec: sp, Limit: l, Hits: 99_200}}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(5 * ms)
	// 10 spent: 90 kept would be more than an eighth of the 700 left.
	expect("near the limit: cut", reserve("cut", l, 34, 10, 1000), grant{2, 90, 700})
	clock.Advance(15 * ms) // the grant's exp (V plus a grace of V)
	expect("not renewed: gone at its first exp", reserve("cut", l, 34, 0, 0), grant{0, 0, 700})
	// Not far from the limit (39,900 left: a block of 1,000 stands for
	// 100,000 a window), but the block is small beside what is left:
	// renewed, without growing.
	expect("grant", reserve("kept", l, 36, -1, 100), grant{0, 100, l - 100})
	if _, err := s.Do(ctx, []window.Request{{Key: "kept", Spec: sp, Limit: l, Hits: 60_000}}); err != nil {
		t.Fatal(err)
	}
	expect("renewed, not grown", reserve("kept", l, 36, 10, 1000), grant{1, 90, 39_900})
	// Far from it, the same call renews.
	expect("grant", reserve("renew", l, 35, -1, 100), grant{0, 100, l - 100})
	clock.Advance(5 * ms)
	expect("far from the limit: renewed", reserve("renew", l, 35, 10, 100), grant{1, 100, l - 110})
	clock.Advance(15 * ms)
	expect("held past the first grant's exp", reserve("renew", l, 35, 0, 0), grant{1, 0, l - 10})
}

// TestBlocksCostCronNothing: two replicas with blocks, on one clock that is
// both theirs and Redis's, serve a client that sends a whole limit at once,
// after a quiet spell in which every earlier hit has left the window. An
// exact sliding log admits every request of such a burst, and so must the
// blocks, however late the calls for blocks run: after each busy spell the
// clock moves a tenth of a window before the reserver gets to run, as it
// does when its goroutine or Redis is slow. Two clients: a cron job whose
// bursts start slowly (two requests, two more a 40th of a window later, as
// goroutines started under load send them), which must not be taken for
// steady demand; and a client steady far below its limit (its requests
// answered from blocks) that then sends the whole limit at once, which
// must not find hits its blocks spent still counted (recorded at the late
// settling rather than when they were spent).
//
// The window is 20 s (blocks valid for a 32nd of it), so that the fake
// clock, which never falls behind real time (Redis expires keys by its own
// clock, by TTLs set in fake time), runs well ahead of it: the requests
// fall at the fake times the test gives them, however slow the machine.
func TestBlocksCostCronNothing(t *testing.T) {
	clock := testclock.At(base)
	stores, reg := replicasOnOneClock(t, clock, time.Second) // capped at W/32
	const w = 20 * time.Second
	sp := mustSpec(t, w, 1)
	ctx := context.Background()
	start := time.Now()
	tick := func(d time.Duration) { clock.Set(max(clock.Now()+d, base+time.Since(start))) }
	reserverRuns := func() { time.Sleep(3 * time.Millisecond) }

	for _, tt := range []struct {
		name  string
		limit uint64
		// busy sends a busy spell's requests through send (alternating
		// replicas), moving the clock with tick.
		busy   func(send func(), tick func(time.Duration))
		blocks bool // whether blocks must answer some requests
	}{
		{"cron, slow start", 100, func(send func(), tick func(time.Duration)) {
			send()
			send()
			tick(w / 40)
			send()
			send()
			reserverRuns()
			for i := range 96 { // within a 50th of the window
				tick(w / 5000)
				send()
				if i%8 == 0 {
					reserverRuns()
				}
			}
		}, false},
		{"steady far from the limit, then all of it", 1000, func(send func(), tick func(time.Duration)) {
			for i := range 400 { // a fifth of the limit a window, for two windows
				tick(w / 200)
				send()
				if i%8 == 0 {
					reserverRuns()
				}
			}
			tick(w / 10) // the reserver runs late
			reserverRuns()
			tick(w + w/30) // the steady hits have left
			// The whole limit within a 50th of the window.
			for i := range 1000 {
				tick(w / 50_000)
				send()
				if i%64 == 0 {
					reserverRuns()
				}
			}
		}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := []window.Request{{Key: tt.name, Spec: sp, Limit: tt.limit, Hits: 1, Veto: true}}
			var offered, admitted []time.Duration
			var refusals []string // the first few, to tell what refused
			sent := 0
			send := func() {
				res, err := stores[sent%2].Do(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				sent++
				offered = append(offered, clock.Now())
				if res[0].Recorded {
					admitted = append(admitted, clock.Now())
				} else if len(refusals) < 10 {
					refusals = append(refusals, fmt.Sprintf("request %d at %v: reset %v", sent, clock.Now()-base, res[0].Reset))
				}
			}
			answers := gatherCounter(t, reg, "leapgate_redis_block_answers_total")
			for range 5 {
				tt.busy(send, tick)
				tick(w / 10) // the reserver runs late
				reserverRuns()
				tick(w + w/30)
			}
			if behind := time.Since(start) - (clock.Now() - base); behind > 0 {
				t.Fatalf("real time ran %v ahead of the fake clock: the requests did not fall at the times given", behind)
			}
			exact := exactLogAdmits(offered, int(tt.limit), w)
			fromBlocks := gatherCounter(t, reg, "leapgate_redis_block_answers_total") - answers
			t.Logf("offered %d, admitted %d, an exact sliding log admits %d; one replica answered %.0f from blocks",
				len(offered), len(admitted), exact, fromBlocks)
			if tt.blocks && fromBlocks == 0 {
				t.Error("no request was answered from a block: the test does not exercise them")
			}
			if len(admitted) != exact {
				t.Errorf("admitted %d, want the exact log's %d; refused: %q", len(admitted), exact, refusals)
			}
			limit := int(tt.limit)
			for i := limit; i < len(admitted); i++ {
				if admitted[i]-admitted[i-limit] < w {
					t.Fatalf("%d admitted within %v from %v", limit+1, admitted[i]-admitted[i-limit], admitted[i-limit]-base)
				}
			}
		})
	}
}
