package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/leapgate/leapgate/window"
)

// diffKey is one counter of a differential run: its layout, algorithm and
// limit are fixed.
type diffKey struct {
	alg    window.Algorithm
	length time.Duration
	bucket int
	limit  uint64
}

// TestMatchesInMemoryStore drives the Redis store and the in-memory
// window.Store with the same random batches at the same times (the script
// takes the test's time instead of Redis's TIME) and requires identical
// answers: every algorithm, mixed batches, repeated keys, check-only
// requests, refunds, vetoes, and Undo of recorded hits.
func TestMatchesInMemoryStore(t *testing.T) {
	r := startRedis(t)
	ft := &fakeTime{}
	s := withFakeTime(newTestStore(t, settingsFor(r.addr()), Options{}), ft)
	ctx := context.Background()
	sw, tb, fw := window.SlidingWindow, window.TokenBucket, window.FixedWindow
	for _, tc := range []struct {
		name string
		keys []diffKey
		step time.Duration // time moves by up to this between batches
	}{
		{"sliding", []diffKey{
			{sw, time.Second, 10, 10}, {sw, time.Second, 1, 5}, {sw, 3 * time.Second, 3, 7}, {sw, time.Second, 20, 0},
		}, 120 * time.Millisecond},
		{"sliding_minute", []diffKey{{sw, time.Minute, 20, 100}, {sw, time.Minute, 6, 4}}, 4 * time.Second},
		{"token_bucket", []diffKey{
			{tb, 10 * time.Second, 1, 10}, {tb, 10 * time.Second, 10, 3}, {tb, 60 * time.Second, 20, 7}, {tb, 10 * time.Second, 1, 0},
		}, 2 * time.Second},
		{"token_bucket_fine", []diffKey{{tb, 10 * time.Second, 1, 1000}, {tb, 10 * time.Second, 1, 6}}, 30 * time.Millisecond},
		{"fixed_window", []diffKey{
			{fw, 10 * time.Second, 1, 5}, {fw, 20 * time.Second, 4, 2}, {fw, 10 * time.Second, 10, 0},
		}, 2 * time.Second},
		{"mixed", []diffKey{
			{sw, 10 * time.Second, 10, 6}, {tb, 10 * time.Second, 1, 4}, {fw, 10 * time.Second, 1, 5}, {tb, 30 * time.Second, 3, 9},
		}, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := window.NewStore(ft)
			reqFor := func(k int) window.Request {
				d := tc.keys[k]
				return window.Request{
					Key:       fmt.Sprintf("%s_%d", t.Name(), k),
					Spec:      mustSpec(t, d.length, d.bucket),
					Limit:     d.limit,
					Algorithm: d.alg,
				}
			}
			rng := rand.New(rand.NewPCG(uint64(len(tc.name)), uint64(tc.step)))
			now := base
			var recorded, refused, vetoed, refunds int
			for step := range 300 {
				now += time.Duration(rng.Int64N(int64(tc.step/time.Microsecond)+1)) * time.Microsecond
				ft.set(now)
				batch := make([]window.Request, 1+rng.IntN(4))
				for i := range batch {
					q := reqFor(rng.IntN(len(tc.keys)))
					q.Hits = uint64(rng.IntN(4)) // 0 is check-only
					q.Veto = rng.IntN(3) > 0
					q.Negative = rng.IntN(5) == 0
					batch[i] = q
				}
				got, err := s.Do(ctx, batch)
				if err != nil {
					t.Fatal(err)
				}
				want := make([]window.Result, len(batch))
				if err := mem.DoAt(ctx, now, batch, want); err != nil {
					t.Fatal(err)
				}
				veto := false
				for i := range batch {
					g, w := got[i], want[i]
					switch {
					case batch[i].Negative:
						refunds++
					case w.Recorded:
						recorded++
					case !w.Allowed:
						refused++
						veto = veto || batch[i].Veto
					}
					if g.Allowed != w.Allowed || g.Recorded != w.Recorded || g.Remaining != w.Remaining || g.Reset != w.Reset ||
						(w.Recorded && g.Bucket != w.Bucket) {
						t.Fatalf("step %d at %v, request %d of %s:\nredis     %+v\nin-memory %+v", step, now-base, i, describe(batch), g, w)
					}
				}
				if veto {
					vetoed++
				}
				if rng.IntN(8) == 0 {
					// take the batch back, on both, at the same time
					if err := s.Undo(ctx, batch, got); err != nil {
						t.Fatal(err)
					}
					if err := mem.Undo(ctx, batch, want); err != nil {
						t.Fatal(err)
					}
				}
			}
			t.Logf("requests recorded %d, refused %d, refunds %d; vetoed batches %d", recorded, refused, refunds, vetoed)
			if recorded == 0 || refused == 0 || refunds == 0 || vetoed == 0 {
				t.Fatal("the random batches missed a case: tune the steps")
			}
		})
	}
}

func describe(batch []window.Request) string {
	out := ""
	for _, q := range batch {
		out += fmt.Sprintf("\n  {%s %v limit=%d hits=%d veto=%t negative=%t}", q.Algorithm, q.Spec.Length(), q.Limit, q.Hits, q.Veto, q.Negative)
	}
	return out
}
