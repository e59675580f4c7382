package redisstore

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/leapgate/leapgate/window"
)

// The rules of a replica's blocks, on hand-made blocks (no Redis): how big
// a block is wanted, when a key is far enough from its limit, when a block
// may answer, what its answers say, when it is topped up, and which keys
// are tracked. TestBlocks and TestReservationsNeverOvershootAWindow test
// the same end to end.

const sec = time.Second

// testReserver is a reserver with 2 s blocks on a store without Redis.
func testReserver(t *testing.T, keys int) *reserver {
	t.Helper()
	return newReserver(&Store{}, 2*sec, keys)
}

func TestBlockWant(t *testing.T) {
	const v = 2 * sec
	for _, tt := range []struct {
		demand     uint64
		since, now time.Duration
		want       uint64
	}{
		{100, 0, 2 * sec, 200},                 // twice the demand per validity
		{100, 0, 4 * sec, 100},                 // over twice the validity
		{100, 0, 100 * time.Millisecond, 1600}, // at least v/8 of elapsed time
		{100, 10 * sec, 12 * sec, 200},         // since the last call, not since 0
		{1, 0, 2 * sec, resMin},                // at least the smallest grant
		{0, 0, 0, resMin},
	} {
		b := &block{demand: tt.demand, since: tt.since}
		if got := b.want(v, tt.now); got != tt.want {
			t.Errorf("demand %d over %v: want %d, expected %d", tt.demand, tt.now-tt.since, got, tt.want)
		}
	}
}

func TestFarFromLimit(t *testing.T) {
	const w, v = 64 * sec, 2 * sec // a window is 32 validities
	for _, tt := range []struct {
		remaining, want uint64
		far             bool
	}{
		{32, 2, true},   // 2 × 32 = 64 = 2 × 32 left; 32/8 = 4 = resMin
		{32, 3, false},  // 96 > 64
		{31, 1, false},  // an eighth is below the smallest grant
		{320, 20, true}, // 640 = 640
		{320, 21, false},
	} {
		if got := farFromLimit(tt.remaining, tt.want, w, v); got != tt.far {
			t.Errorf("remaining %d, want %d: far %t, expected %t", tt.remaining, tt.want, got, tt.far)
		}
	}
}

func TestBlockSpendable(t *testing.T) {
	sp := mustSpec(t, 64*sec, 1)
	b := &block{holder: 1, deadline: 10 * sec, limit: 100, spec: sp}
	for _, tt := range []struct {
		name string
		r    window.Request
		now  time.Duration
		ok   bool
	}{
		{"before the deadline", window.Request{Limit: 100, Spec: sp}, 10*sec - 1, true},
		{"at the deadline", window.Request{Limit: 100, Spec: sp}, 10 * sec, false},
		{"another limit", window.Request{Limit: 101, Spec: sp}, 0, false},
		{"another window", window.Request{Limit: 100, Spec: mustSpec(t, 32*sec, 1)}, 0, false},
	} {
		if got := b.spendable(&tt.r, tt.now); got != tt.ok {
			t.Errorf("%s: spendable %t, want %t", tt.name, got, tt.ok)
		}
	}
}

// TestTakeAnswersAndTopsUp: an answer from a block says what Redis had
// left plus the block, a reset of a window past the block's deadline, and
// a top-up is asked for when a quarter of the wanted block is left or an
// eighth of the validity, not before.
func TestTakeAnswersAndTopsUp(t *testing.T) {
	sp := mustSpec(t, 64*sec, 1)
	const now = 100 * sec
	for _, tt := range []struct {
		name     string
		avail    uint64
		deadline time.Duration
		hits     uint64
		topUp    bool
	}{
		// demand 1 over 2 s: want 4, a quarter of it 1.
		{"plenty left", 10, now + sec, 1, false},
		{"a check", 10, now + sec, 0, false}, // nothing recorded
		{"a quarter left", 2, now + sec, 1, false},
		{"below a quarter", 1, now + sec, 1, true},
		{"all of it", 3, now + sec, 3, true},
		{"an eighth of the validity to go", 10, now + sec/4, 1, false},
		{"less", 10, now + sec/4 - 1, 1, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rv := testReserver(t, 0)
			b := &block{holder: 1, spec: sp, limit: 1000, avail: tt.avail, remaining: 500, grantedAt: 7, deadline: tt.deadline, since: now - 2*sec}
			rv.shard("k").keys["k"] = b
			reqs := []window.Request{{Key: "k", Spec: sp, Limit: 1000, Hits: tt.hits}}
			results := make([]window.Result, 1)
			if !rv.take(reqs, []string{"k"}, now, results) {
				t.Fatal("the block did not answer")
			}
			want := window.Result{Allowed: true, Recorded: tt.hits > 0, Remaining: 500 + tt.avail - tt.hits,
				Reset: 64*sec + tt.deadline - now, Bucket: blockBucket(7)}
			if results[0] != want {
				t.Errorf("answer %+v, want %+v", results[0], want)
			}
			if b.pending != tt.topUp {
				t.Errorf("top-up asked %t, want %t", b.pending, tt.topUp)
			}
			// The time of the newest hit spent is what Redis records
			// the block's hits at; a check spends none.
			var spentAt time.Duration
			if tt.hits > 0 {
				spentAt = now
			}
			if b.lastSpent != spentAt {
				t.Errorf("last spent at %v, want %v", b.lastSpent, spentAt)
			}
		})
	}
	// More hits than the block holds: not answered, nothing spent.
	rv := testReserver(t, 0)
	b := &block{holder: 1, spec: sp, limit: 1000, avail: 3, deadline: now + sec}
	rv.shard("k").keys["k"] = b
	if rv.take([]window.Request{{Key: "k", Spec: sp, Limit: 1000, Hits: 4}}, []string{"k"}, now, make([]window.Result, 1)) || b.avail != 3 {
		t.Errorf("4 hits from a block of 3: answered, or %d left", b.avail)
	}
}

// TestSawRemote: which answers of Redis make a key ask for a block.
func TestSawRemote(t *testing.T) {
	sp := mustSpec(t, 64*sec, 1)
	const now = 100 * sec
	r := &window.Request{Key: "k", Spec: sp, Limit: 1_000_000, Hits: 1}
	const stamp = 1_000 // Redis's time of the answer, µs
	far := &window.Result{Allowed: true, Remaining: 900_000, Bucket: stamp * timeBucket}
	for _, tt := range []struct {
		name    string
		b       block
		ask     bool
		remains uint64
	}{
		{"seen within the validity, busy for one", block{since: now - 2*sec, seen: now - sec, demand: 10}, true, 0},
		{"seen a validity ago", block{since: now - 2*sec, seen: now - 2*sec, demand: 10}, false, 0},
		// After a pause of a validity, demand is measured afresh: a
		// burst is not averaged with the quiet time before it.
		{"seen a validity ago, long busy before", block{since: now - 60*sec, seen: now - 2*sec, demand: 10}, false, 0},
		// A first block waits for a validity's worth of demand: a burst
		// shorter than that is not steady demand.
		{"busy for less than a validity", block{since: now - 2*sec + 1, seen: now - sec, demand: 10}, false, 0},
		{"too busy for the room", block{since: now - 2*sec, seen: now - sec, demand: 30_000}, false, 0},
		{"at its retry time", block{since: now - 2*sec, seen: now - sec, demand: 10, retryAt: now}, true, 0},
		{"before it", block{since: now - 2*sec, seen: now - sec, demand: 10, retryAt: now + 1}, false, 0},
		{"held: Redis's remaining is fresher", block{holder: 1, spec: sp, limit: 1_000_000, avail: 50, deadline: now + sec, seen: now - sec, remaining: 5, remainingAt: stamp - 1}, false, 900_000},
		// Answers reach the replica in any order: an older one, or one
		// of the same stamp that left more, does not undo a fresher one.
		{"held: an older answer", block{holder: 1, spec: sp, limit: 1_000_000, avail: 50, deadline: now + sec, seen: now - sec, remaining: 950_000, remainingAt: stamp + 1}, false, 950_000},
		{"held: as old, leaving less", block{holder: 1, spec: sp, limit: 1_000_000, avail: 50, deadline: now + sec, seen: now - sec, remaining: 899_999, remainingAt: stamp}, false, 899_999},
		{"held: as old, leaving more", block{holder: 1, spec: sp, limit: 1_000_000, avail: 50, deadline: now + sec, seen: now - sec, remaining: 900_001, remainingAt: stamp}, false, 900_000},
		// A batch goes to Redis when any of its requests does not fit a block.
		{"held, with just the hits", block{holder: 1, spec: sp, limit: 1_000_000, avail: 1, deadline: now + sec, seen: now - sec}, false, 900_000},
		{"held, without them: topped up", block{holder: 1, spec: sp, limit: 1_000_000, avail: 0, deadline: now + sec, seen: now - sec}, true, 900_000},
		// Unused for a validity (so past its deadline): given back, not
		// topped up with demand measured over the pause.
		{"held, unused for a validity: given back", block{holder: 1, spec: sp, limit: 1_000_000, avail: 9, deadline: now, seen: now - 3*sec, lastUse: now - 2*sec, since: now - 9*sec, demand: 50}, true, 900_000},
		{"held, used within a validity: topped up", block{holder: 1, spec: sp, limit: 1_000_000, avail: 9, deadline: now, seen: now - 3*sec, lastUse: now - 2*sec + 1, since: now - 9*sec, demand: 50}, true, 900_000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rv := testReserver(t, 0)
			b := tt.b
			sh := rv.shard("k")
			sh.keys["k"] = &b
			rv.sawOne(sh, r, far, "k", now)
			if b.pending != tt.ask {
				t.Errorf("block asked %t, want %t", b.pending, tt.ask)
			}
			if b.seen != now {
				t.Errorf("seen %v, want now", b.seen)
			}
			paused := max(tt.b.seen, tt.b.lastUse) <= now-2*sec
			if paused && (b.since != now || b.demand != r.Hits) {
				t.Errorf("after a pause: demand %d since %v, want %d since now", b.demand, b.since, r.Hits)
			}
			if b.giveBack != (paused && tt.b.holder != 0) {
				t.Errorf("given back %v", b.giveBack)
			}
			if b.remaining != tt.remains {
				t.Errorf("remaining %d, want %d", b.remaining, tt.remains)
			}
		})
	}
	// One key per shard (ReservationKeys 64): a second key of a shard is
	// not tracked.
	rv := testReserver(t, reserveShards)
	first := "key-0"
	for i := 1; ; i++ {
		k := fmt.Sprint("key-", i)
		if rv.shardIndex(k) != rv.shardIndex(first) {
			continue
		}
		sh := rv.shard(first)
		rv.sawOne(sh, r, far, first, now)
		rv.sawOne(sh, r, far, k, now)
		if len(sh.keys) != 1 || sh.keys[first] == nil {
			t.Errorf("shard of 1 key tracks %d keys", len(sh.keys))
		}
		break
	}
}

// TestHolderIDs: a replica numbers its blocks base+1 to base+holderIDs,
// wrapping after holderIDs blocks, with base a multiple of holderIDs, so
// that the ranges of two replicas never overlap; every id is a whole,
// nonzero number (0 is "no holder").
func TestHolderIDs(t *testing.T) {
	inRange := func(rv *reserver, id float64) bool {
		return id == math.Trunc(id) && id > rv.base && id <= rv.base+holderIDs
	}
	for range 8 { // bases are random
		rv := testReserver(t, 0)
		if math.Mod(rv.base, holderIDs) != 0 || rv.base < 0 || rv.base+holderIDs >= 1<<53 {
			t.Fatalf("base %v: want a multiple of %d below 2^53", rv.base, holderIDs)
		}
		seen := map[float64]bool{}
		for range 1000 {
			id := rv.nextHolder()
			if !inRange(rv, id) || seen[id] {
				t.Fatalf("base %v: id %v repeated or outside (base, base+%d]", rv.base, id, holderIDs)
			}
			seen[id] = true
		}
		// Around the wrap: the last id of the range, then its first.
		rv.seq.Store(holderIDs - 2)
		if got, want := rv.nextHolder(), rv.base+holderIDs; got != want {
			t.Errorf("the %dth id %v, want %v", holderIDs-1, got, want)
		}
		if got, want := rv.nextHolder(), rv.base+1; got != want {
			t.Errorf("the id after the wrap %v, want %v", got, want)
		}
	}
}

// TestEligible: only a sliding window's checks and hits, up to the largest
// limit, may be answered from blocks, and none while hits the local
// fallback admitted (which Redis does not know) are in the window: a
// window's length after the last of them, blocks answer again.
func TestEligible(t *testing.T) {
	sp := mustSpec(t, time.Minute, 6)
	const lastLocal = 10 * time.Minute
	ok := window.Request{Key: "k", Spec: sp, Limit: 100, Hits: 1}
	with := func(f func(*window.Request)) window.Request { r := ok; f(&r); return r }
	for _, tt := range []struct {
		name      string
		req       window.Request
		lastLocal time.Duration // 0: never
		now       time.Duration
		want      bool
	}{
		{"hits", ok, 0, lastLocal, true},
		{"a check", with(func(r *window.Request) { r.Hits = 0 }), 0, lastLocal, true},
		{"the largest limit's hits", with(func(r *window.Request) { r.Hits = window.MaxLimit }), 0, lastLocal, true},
		{"more hits than any limit", with(func(r *window.Request) { r.Hits = window.MaxLimit + 1 }), 0, lastLocal, false},
		{"a refund", with(func(r *window.Request) { r.Negative = true }), 0, lastLocal, false},
		{"a charge", with(func(r *window.Request) { r.ChargeAlways = true }), 0, lastLocal, false},
		{"another algorithm", with(func(r *window.Request) { r.Algorithm = window.FixedWindow }), 0, lastLocal, false},
		{"local hits in the window", ok, lastLocal, lastLocal + time.Minute - time.Nanosecond, false},
		{"local hits a window ago", ok, lastLocal, lastLocal + time.Minute, true},
	} {
		s := &Store{}
		s.lastLocal.Store(int64(tt.lastLocal))
		rv := newReserver(s, 2*sec, 0)
		if got := rv.eligible(&tt.req, tt.now); got != tt.want {
			t.Errorf("%s: eligible %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestDrain: the keys waiting for a call to Redis are taken at most
// maxBatchCalls at a time, in order, the rest left queued.
func TestDrain(t *testing.T) {
	rv := testReserver(t, 0)
	const n = maxBatchCalls + 44
	for i := range n {
		rv.queue <- fmt.Sprint("k", i)
	}
	keys := rv.drain([]string{"first"})
	if len(keys) != maxBatchCalls || keys[0] != "first" || keys[1] != "k0" || keys[maxBatchCalls-1] != fmt.Sprint("k", maxBatchCalls-2) {
		t.Fatalf("drained %d keys (%q … %q), want %d from first, k0", len(keys), keys[0], keys[len(keys)-1], maxBatchCalls)
	}
	if rest := rv.drain(nil); len(rest) != n-(maxBatchCalls-1) || len(rv.queue) != 0 {
		t.Errorf("then %d keys drained, %d left queued; want %d, 0", len(rest), len(rv.queue), n-(maxBatchCalls-1))
	}
	if keys := rv.drain([]string{"only"}); len(keys) != 1 {
		t.Errorf("an empty queue: %q, want [only]", keys)
	}
}

// metricReserver is testReserver with metrics, for what counts answers.
func metricReserver(t *testing.T) *reserver {
	t.Helper()
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return newReserver(&Store{metrics: m}, 2*sec, 0)
}

// TestApplyAnswers: what Redis's answer to a block's call (or its failure)
// does to the block. The window is 32 s, so its blocks are valid for 1 s
// (a 32nd), not the reserver's 2 s.
func TestApplyAnswers(t *testing.T) {
	sp := mustSpec(t, 32*sec, 1)
	const now, sent = 100 * sec, 99 * sec
	held := block{spec: sp, limit: 1000, holder: 5, avail: 4, spent: 3, remaining: 50, remainingAt: 1, grantedAt: 1, deadline: now + sec, lastUse: now}
	for _, tt := range []struct {
		name     string
		giveBack bool
		used     float64 // -1: a new block
		vals     []int64 // status, total, remaining, _, granted at
		err      error
		want     func(b *block)
		event    string
	}{
		{"given back", true, 3, []int64{1, 10, 50, 0, 2}, nil, func(b *block) {
			b.holder, b.avail, b.spent, b.remainingAt, b.retryAt = 0, 0, 0, 0, now+sec
		}, "returned"},
		{"nothing granted", false, 3, []int64{0, 0, 50, 0, 2}, nil, func(b *block) {
			b.holder, b.avail, b.spent, b.remainingAt, b.retryAt = 0, 0, 0, 0, now+sec
		}, "returned"},
		{"renewed: the hits spent in flight are settled next time", false, 3, []int64{1, 10, 40, 0, 2}, nil, func(b *block) {
			b.holder, b.avail, b.remaining, b.remainingAt, b.grantedAt, b.deadline = 9, 10-3, 40, 2, 2, sent+sec
		}, "renewed"},
		// A request's answer of a later stamp reached the replica first:
		// it already counts the renewed block.
		{"renewed after a fresher answer", false, 3, []int64{1, 10, 60, 0, 0}, nil, func(b *block) {
			b.holder, b.avail, b.grantedAt, b.deadline = 9, 10-3, 0, sent+sec
		}, "renewed"},
		{"renewed with more spent in flight than granted", false, 3, []int64{1, 2, 40, 0, 2}, nil, func(b *block) {
			b.holder, b.avail, b.remaining, b.remainingAt, b.grantedAt, b.deadline = 9, 0, 40, 2, 2, sent+sec
		}, "renewed"},
		// Near the limit: Redis kept the block unrenewed; it goes back at
		// once (the deadline and grant stand; the hits spent in flight
		// are settled by the give-back).
		{"cut: given back at once", false, 3, []int64{2, 10, 40, 0, 2}, nil, func(b *block) {
			b.avail, b.remaining, b.pending, b.giveBack = 10-3, 40, true, true
		}, "cut"},
		{"granted anew: covers what was spent", false, -1, []int64{0, 10, 40, 0, 2}, nil, func(b *block) {
			b.holder, b.avail, b.spent, b.remaining, b.remainingAt, b.grantedAt, b.deadline = 9, 10, 0, 40, 2, 2, sent+sec
		}, "granted"},
		{"not sent: Redis is down", false, 2, nil, ErrUnavailable, func(b *block) { b.spent = 3 + 2 }, ""},
		{"failed: settled or not, spend no more", false, 2, nil, errors.New("timeout"), func(b *block) {
			b.spent, b.avail, b.deadline = 3+2, 0, 0
		}, "failed"},
		{"failed with nothing spent since settling: still held", false, 0, nil, errors.New("timeout"), func(b *block) {
			b.spent, b.avail, b.deadline = 3, 0, 0
		}, "failed"},
		{"a new block failed: Redis's expiry covers it", false, -1, nil, errors.New("timeout"), func(b *block) {
			b.holder, b.remainingAt, b.avail, b.deadline = 0, 0, 0, 0
		}, "failed"},
		{"a malformed answer", false, 2, []int64{1, 10}, nil, func(b *block) {
			b.spent, b.avail, b.deadline = 3+2, 0, 0
		}, "failed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rv := metricReserver(t)
			b := held
			b.pending, b.giveBack = true, tt.giveBack
			want := held
			tt.want(&want)
			op := reservation{key: "k", b: &b, holder: 9, used: tt.used, giveBack: tt.giveBack, sent: sent}
			rv.apply(&op, &call{vals: tt.vals}, tt.err, now)
			if !reflect.DeepEqual(b, want) {
				t.Errorf("block\n %+v\nwant\n %+v", b, want)
			}
			if queued := len(rv.queue) == 1; queued != (tt.event == "cut") {
				t.Errorf("a call queued: %v", queued)
			}
			for _, event := range []string{"granted", "renewed", "cut", "returned", "failed"} {
				want := 0.0
				if event == tt.event {
					want = 1
				}
				if got := testutil.ToFloat64(rv.s.metrics.reservations.WithLabelValues(event)); got != want {
					t.Errorf("%s events %v, want %v", event, got, want)
				}
			}
		})
	}
}

// TestCallAt: what a queued call becomes when the reserver gets to send
// it. Blocks of 2 s.
func TestCallAt(t *testing.T) {
	const now, v = 100 * sec, 2 * sec
	for _, tt := range []struct {
		name           string
		b              block
		send, giveBack bool
	}{
		{"a give-back", block{holder: 1, giveBack: true, seen: now, lastUse: now}, true, true},
		{"a top-up, the key busy", block{holder: 1, seen: now - 5*sec, lastUse: now - sec + 1}, true, false},
		{"a top-up, the key idle for half a validity: given back", block{holder: 1, seen: now - 5*sec, lastUse: now - sec}, true, true},
		{"a first block, the key busy", block{seen: now - sec + 1}, true, false},
		{"a first block, the key idle for half a validity: not asked for", block{seen: now - sec}, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			send, giveBack := tt.b.callAt(now, v)
			if send != tt.send || (send && giveBack != tt.giveBack) {
				t.Errorf("send %v, give back %v; want %v, %v", send, giveBack, tt.send, tt.giveBack)
			}
		})
	}
}

// TestSweep: a sweep gives back a held block idle for half its validity or
// past its deadline, tops up one within an eighth of its validity of its
// deadline, leaves one whose call is pending, and forgets a key without a
// block unseen for 4 of the reserver's validities. The window is 32 s:
// held blocks are valid for 1 s, the reserver's validity is 2 s.
func TestSweep(t *testing.T) {
	sp := mustSpec(t, 32*sec, 1)
	const now = 100 * sec
	const ms = time.Millisecond
	heldBlock := func(lastUse, deadline time.Duration) *block {
		return &block{spec: sp, holder: 5, avail: 4, lastUse: lastUse, deadline: deadline}
	}
	for _, tt := range []struct {
		name                    string
		b                       *block
		pending, giveBack, gone bool
	}{
		{"busy", heldBlock(now-499*ms, now+sec), false, false, false},
		{"idle for half its validity", heldBlock(now-500*ms, now+sec), true, true, false},
		{"past its deadline", heldBlock(now, now), true, true, false},
		{"an eighth of its validity to go", heldBlock(now, now+125*ms), false, false, false},
		{"less", heldBlock(now, now+124*ms), true, false, false},
		{"a call pending", &block{spec: sp, holder: 5, pending: true, lastUse: now - sec}, true, false, false},
		{"no block, seen lately", &block{spec: sp, seen: now - 8*sec + 1}, false, false, false},
		{"no block, unseen for 4 validities", &block{spec: sp, seen: now - 8*sec}, false, false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rv := testReserver(t, 0)
			rv.shard("k").keys["k"] = tt.b
			rv.sweep(now)
			_, kept := rv.shard("k").keys["k"]
			if tt.b.pending != tt.pending || tt.b.giveBack != tt.giveBack || kept == tt.gone {
				t.Errorf("pending %v, give back %v, kept %v; want %v, %v, %v", tt.b.pending, tt.b.giveBack, kept, tt.pending, tt.giveBack, !tt.gone)
			}
			if queued := len(rv.queue) == 1; queued != (tt.pending && tt.name != "a call pending") {
				t.Errorf("queued %v", queued)
			}
		})
	}
}
