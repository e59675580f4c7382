package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/internal/testclock"
	"github.com/leapgate/leapgate/window"
)

// scriptArgs is a go-redis hook that records the arguments of every script
// call (EVALSHA and EVAL), pipelined or not.
type scriptArgs struct {
	mu    sync.Mutex
	calls [][]any
}

func (h *scriptArgs) record(cmd redis.Cmder) {
	if name := strings.ToLower(cmd.Name()); name == "evalsha" || name == "eval" || name == "fcall" {
		h.mu.Lock()
		h.calls = append(h.calls, cmd.Args())
		h.mu.Unlock()
	}
}
func (h *scriptArgs) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptArgs) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.record(cmd); return next(ctx, cmd) }
}
func (h *scriptArgs) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.record(c)
		}
		return next(ctx, cmds)
	}
}

// TestScriptsReadRedisClock: every allow and undo call tells the script to
// read Redis's TIME (an empty time argument), never the replica's clock,
// so replicas with skewed clocks agree. allow's ARGV is (dry, time, ...),
// undo's (time, ...); a call's arguments are the command, the script,
// the number of keys, the keys, then ARGV.
func TestScriptsReadRedisClock(t *testing.T) {
	r := redistest.Start(t)
	s := newTestStore(t, settingsFor(r.Addr()), Options{})
	h := &scriptArgs{}
	s.client.AddHook(h)
	ctx := context.Background()
	sp, err := window.NewSpec(time.Minute, 1)
	if err != nil {
		t.Fatal(err)
	}
	reqs := []window.Request{{Key: "clock", Spec: sp, Limit: 10, Hits: 1}, {Key: "clock2", Spec: sp, Limit: 10, Hits: 2}}
	res, err := s.Do(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Undo(ctx, reqs, res); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[string]bool{}
	for i, args := range h.calls {
		keys := 0
		fmt.Sscan(fmt.Sprint(args[2]), &keys)
		argv := args[3+keys:]
		var script string
		var timeArg any
		switch len(argv) {
		case 4: // allow, one group: (time, n, dry, packed arguments)
			script, timeArg = "allow", argv[0]
		case 1 + 6*keys: // undo: (time, 6 per key)
			script, timeArg = "undo", argv[0]
		default:
			t.Fatalf("script call %d: %d arguments for %d keys", i, len(argv), keys)
		}
		seen[script] = true
		if timeArg != "" {
			t.Errorf("%s call %d passes the time %v: it must read Redis's TIME", script, i, timeArg)
		}
	}
	if !seen["allow"] || !seen["undo"] {
		t.Fatalf("script calls seen: %v, want allow and undo", seen)
	}
}

// TestClockStepsBackKeepsLaterHits: when Redis's clock steps back, a counter
// stands still at the newest time written, so hits admitted after the step
// count from then on: they do not age out early. Every answer, Reset
// included, equals the in-memory store's at the same instants.
func TestClockStepsBackKeepsLaterHits(t *testing.T) {
	r := redistest.Start(t)
	ft := &testclock.Clock{}
	s := withFakeTime(newTestStore(t, settingsFor(r.Addr()), Options{}), ft)
	ctx := context.Background()
	for _, a := range []window.Algorithm{window.SlidingWindow, window.TimeBuckets, window.SlidingLog, window.TokenBucket, window.FixedWindow} {
		t.Run(a.String(), func(t *testing.T) {
			buckets := 1
			if a == window.TimeBuckets {
				buckets = 10
			}
			sp, err := window.NewSpec(10*time.Second, buckets)
			if err != nil {
				t.Fatal(err)
			}
			mem := window.NewStore(window.StoreOptions{})
			req := window.Request{Key: "step_" + a.String(), Spec: sp, Limit: 4, Veto: true, Algorithm: a}
			both := func(at time.Duration, hits uint64) window.Result {
				t.Helper()
				ft.Set(base + at)
				q := req
				q.Hits = hits
				got, err := s.Do(ctx, []window.Request{q})
				if err != nil {
					t.Fatal(err)
				}
				want := make([]window.Result, 1)
				if err := mem.DoAt(ctx, base+at, []window.Request{q}, want); err != nil {
					t.Fatal(err)
				}
				g, w := got[0], want[0]
				if g.Allowed != w.Allowed || g.Recorded != w.Recorded || g.Remaining != w.Remaining || g.Reset != w.Reset {
					t.Fatalf("at %v, %d hits: redis %+v, in memory %+v", at, hits, g, w)
				}
				return g
			}
			both(29500*time.Millisecond, 2)
			// The clock steps back 5 s: two more hits, counted at 29.5 s.
			if r := both(24500*time.Millisecond, 2); !r.Recorded {
				t.Fatalf("the hits after the step were refused: %+v", r)
			}
			// They still count after 34.5 s, when they would have left had
			// they been stamped with the stepped-back time.
			for _, at := range []time.Duration{30 * time.Second, 35 * time.Second, 39 * time.Second} {
				both(at, 1)
			}
		})
	}
}
