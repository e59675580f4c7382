package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/window"
)

// blockAnswer sends req to s until a block answers it (the first requests
// go to Redis and make the key busy), and returns that answer.
func blockAnswer(t *testing.T, s *Store, req window.Request) window.Result {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		res, err := s.Do(context.Background(), []window.Request{req})
		if err != nil {
			t.Fatal(err)
		}
		if isBlockBucket(res[0].Bucket) {
			return res[0]
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("no block answered within 5 s")
	return window.Result{}
}

// far is a limit no test reaches: blocks are for keys far from their limit.
const far = 1_000_000_000

// check is what a check of req's key on s reads.
func check(t *testing.T, s *Store, req window.Request) window.Result {
	t.Helper()
	req.Hits = 0
	res, err := s.Do(context.Background(), []window.Request{req})
	if err != nil {
		t.Fatal(err)
	}
	return res[0]
}

// TestBlocks covers what a replica does with its blocks: Undo gives a hit
// back to the block, Close gives the blocks back to Redis, a changed limit
// is not answered from a block taken under the old one, nor is a key while
// local-failure-mode hits are in its window, and a block keeps
// answering through a Redis outage until its deadline, its hits recorded
// once Redis is back (even though Redis lost the block).
func TestBlocks(t *testing.T) {
	r := redistest.Start(t)
	ctx := context.Background()
	sp := mustSpec(t, time.Hour, 1)
	plain := newTestStore(t, settingsFor(r.Addr()), Options{}) // no blocks: reads Redis
	waitHealthy(t, plain)

	t.Run("undo", func(t *testing.T) {
		s := reservingStore(t, r.Addr(), time.Second, nil)
		req := window.Request{Key: "undo", Spec: sp, Limit: far, Hits: 1}
		first := blockAnswer(t, s, req)
		if err := s.Undo(ctx, []window.Request{req}, []window.Result{first}); err != nil {
			t.Fatal(err)
		}
		next := blockAnswer(t, s, req)
		if next.Remaining != first.Remaining {
			t.Fatalf("after an undo the next hit left %d, want %d (the undone hit back in the block)", next.Remaining, first.Remaining)
		}
	})

	t.Run("close", func(t *testing.T) {
		st := settingsFor(r.Addr())
		st.Reservation = time.Second
		s, err := New(ctx, st)
		if err != nil {
			t.Fatal(err)
		}
		waitHealthy(t, s)
		req := window.Request{Key: "close", Spec: sp, Limit: far, Hits: 1}
		blockAnswer(t, s, req)
		spent := 0
		for ; spent < 3; spent++ {
			blockAnswer(t, s, req)
		}
		held := check(t, plain, req).Remaining
		s.Close()
		after := check(t, plain, req).Remaining
		if after <= held {
			t.Fatalf("remaining %d before Close, %d after: the block was not given back", held, after)
		}
		// Every hit admitted counts, the block's included: none was lost.
		if used := far - after; used < uint64(spent)+1 {
			t.Fatalf("Redis counts %d hits after Close, want at least %d", used, spent+1)
		}
	})

	t.Run("changed limit", func(t *testing.T) {
		s := reservingStore(t, r.Addr(), time.Second, nil)
		req := window.Request{Key: "cut", Spec: sp, Limit: far, Hits: 1}
		for range 20 {
			blockAnswer(t, s, req)
		}
		req.Limit = 10
		res, err := s.Do(ctx, []window.Request{req})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Allowed || isBlockBucket(res[0].Bucket) {
			t.Fatalf("a cut to 10 after 20 hits answered %+v", res[0])
		}
	})

	t.Run("local hits", func(t *testing.T) {
		// After an outage in local failure mode, Redis does not know the
		// hits the local windows admitted (withLocalHits lowers the limits
		// it is asked with): no block answers while they are in a window.
		s := reservingStore(t, r.Addr(), time.Second, nil)
		req := window.Request{Key: "local", Spec: sp, Limit: far, Hits: 1}
		blockAnswer(t, s, req)
		s.lastLocal.Store(int64(s.clock.Now()))
		res, err := s.Do(ctx, []window.Request{req})
		if err != nil {
			t.Fatal(err)
		}
		if isBlockBucket(res[0].Bucket) {
			t.Fatal("a block answered while local-failure-mode hits were in the window")
		}
	})

	t.Run("outage", func(t *testing.T) {
		r := redistest.Start(t)
		s := reservingStore(t, r.Addr(), 500*time.Millisecond, nil)
		req := window.Request{Key: "outage", Spec: sp, Limit: far, Hits: 1}
		blockAnswer(t, s, req)
		r.Kill()
		spent := 0
		for ; ; spent++ {
			res, err := s.Do(ctx, []window.Request{req})
			if err != nil {
				if !errors.Is(err, ErrUnavailable) && !isTimeout(err) {
					t.Fatalf("after the block's deadline: %v", err)
				}
				break
			}
			if !isBlockBucket(res[0].Bucket) {
				t.Fatalf("answered with Redis down, not from the block: %+v", res[0])
			}
			time.Sleep(5 * time.Millisecond)
		}
		if spent < 10 {
			t.Fatalf("the block answered %d requests in the outage, want it to last until its deadline", spent)
		}
		r.Restart()
		waitHealthy(t, s)
		plain := newTestStore(t, settingsFor(r.Addr()), Options{})
		waitHealthy(t, plain)
		// The block is given back within a sweep or two of Redis's
		// return, with what it spent: Redis restarted empty, so that is
		// all it counts.
		// (The hit it answered before the kill may or may not have been
		// settled then, and lost.)
		deadline := time.Now().Add(5 * time.Second)
		for {
			used := int(far - check(t, plain, req).Remaining)
			if used == spent || used == spent+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Redis counts %d after the outage, want the %d hits the block spent in it (or one more)", used, spent)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// isTimeout reports whether err is a deadline (a call to a Redis that
// just died, before the health check noticed).
func isTimeout(err error) bool { return errors.Is(err, context.DeadlineExceeded) }

// TestReserverSettings: Reservation 0 (or less) takes no blocks, a
// ReservationKeys of 0 is the default, and a block lasts Reservation but
// at most 1/32 of its window.
func TestReserverSettings(t *testing.T) {
	s := &Store{}
	for _, v := range []time.Duration{0, -time.Second} {
		if rv := newReserver(s, v, 10); rv != nil {
			t.Errorf("Reservation %v: blocks taken, want none", v)
		}
	}
	for _, tt := range []struct{ keys, perShard int }{
		{0, DefaultReservationKeys / reserveShards}, {-1, DefaultReservationKeys / reserveShards},
		{1, 1}, {64 * 10, 10},
	} {
		if got := newReserver(s, time.Second, tt.keys).maxKeys; got != tt.perShard {
			t.Errorf("ReservationKeys %d: %d keys per shard, want %d", tt.keys, got, tt.perShard)
		}
	}
	for _, tt := range []struct{ validity, sweep, grace time.Duration }{
		{2 * time.Second, 250 * time.Millisecond, 2 * time.Second},     // a sweep every V/8; grace V
		{4 * time.Millisecond, time.Millisecond, 4 * time.Millisecond}, // sweeps at most every 1 ms
		{100 * time.Millisecond, 12500 * time.Microsecond, 100 * time.Millisecond},
	} {
		rv := newReserver(s, tt.validity, 0)
		if got := rv.sweepEvery(); got != tt.sweep {
			t.Errorf("validity %v: a sweep every %v, want %v", tt.validity, got, tt.sweep)
		}
		if got := rv.grace(tt.validity); got != tt.grace {
			t.Errorf("validity %v: grace %v, want %v", tt.validity, got, tt.grace)
		}
		if got := rv.grace(time.Millisecond); got != 2*tt.sweep {
			t.Errorf("validity %v: grace of a 1 ms block %v, want two sweeps, %v", tt.validity, got, 2*tt.sweep)
		}
	}
	rv := newReserver(s, 2*time.Second, 0)
	for _, tt := range []struct {
		window time.Duration
		want   time.Duration
	}{{time.Second, time.Second / 32}, {64 * time.Second, 2 * time.Second}, {time.Hour, 2 * time.Second}} {
		if got := rv.validFor(mustSpec(t, tt.window, 1)); got != tt.want {
			t.Errorf("a block of a %v window lasts %v, want %v", tt.window, got, tt.want)
		}
	}
}
