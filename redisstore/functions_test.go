package redisstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/window"
)

// commandCalls returns the calls of a command counted by INFO commandstats.
func commandCalls(t *testing.T, c *redis.Client, cmd string) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

// TestAllowRunsAsFunction: on Redis 7 the admission calls are FCALLs of the
// function library, not EVALSHAs; after FUNCTION FLUSH the calls still
// succeed (sent again as EVAL), and the next health check loads the library
// again.
func TestAllowRunsAsFunction(t *testing.T) {
	r := redistest.Start(t)
	s := newTestStore(t, settingsFor(r.Addr()), Options{})
	waitHealthy(t, s)
	admin := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer admin.Close()
	ctx := context.Background()
	sp := mustSpec(t, time.Minute, 1)
	do := func(n int) {
		t.Helper()
		for i := range n {
			res, err := s.Do(ctx, []window.Request{{Key: "f" + strconv.Itoa(i), Spec: sp, Limit: 10, Hits: 1, Veto: true}})
			if err != nil || !res[0].Recorded {
				t.Fatalf("Do: %+v, %v", res, err)
			}
		}
	}
	fcall, evalsha := commandCalls(t, admin, "fcall"), commandCalls(t, admin, "evalsha")
	do(20)
	if got := commandCalls(t, admin, "fcall") - fcall; got < 20 {
		t.Fatalf("%d FCALLs for 20 calls", got)
	}
	if got := commandCalls(t, admin, "evalsha") - evalsha; got != 0 {
		t.Fatalf("%d EVALSHAs beside the FCALLs", got)
	}
	// Undo is the library's second function: an FCALL too, and it takes
	// the hits back.
	q := []window.Request{{Key: "f0", Spec: sp, Limit: 10, Hits: 1, Veto: true}}
	res, err := s.Do(ctx, q)
	if err != nil || res[0].Remaining != 8 {
		t.Fatalf("Do: %+v, %v", res, err)
	}
	fcall = commandCalls(t, admin, "fcall")
	if err := s.Undo(ctx, q, res); err != nil {
		t.Fatal(err)
	}
	if got := commandCalls(t, admin, "fcall") - fcall; got != 1 {
		t.Fatalf("%d FCALLs for one Undo", got)
	}
	q[0].Hits = 0
	if res, err := s.Do(ctx, q); err != nil || res[0].Remaining != 9 {
		t.Fatalf("after Undo: %+v, %v, want 9 remaining", res, err)
	}
	if got := commandCalls(t, admin, "evalsha") - evalsha; got != 0 {
		t.Fatalf("%d EVALSHAs beside the FCALLs", got)
	}

	if err := admin.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// Each call finds no function and is sent again as EVAL (do fails the
	// test on an error), and the missing library is noticed: it is loaded
	// again below. (Whether the reload is still pending when do returns
	// depends on the health check's timing, so it is not asserted.)
	do(5)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		libs, err := admin.FunctionList(ctx, redis.FunctionListQuery{}).Result()
		if err == nil && len(libs) == 1 && s.pipe.functions.Load() && !s.pipe.reload.Load() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the library was not loaded again: %v %v", libs, err)
		}
	}
	fcall = commandCalls(t, admin, "fcall")
	do(5)
	if got := commandCalls(t, admin, "fcall") - fcall; got < 5 {
		t.Fatalf("%d FCALLs after the reload", got)
	}
}

// TestAllowWithoutFunctions: a Redis user that may not load functions (an
// ACL without FUNCTION) keeps EVALSHA, with the same answers.
func TestAllowWithoutFunctions(t *testing.T) {
	r := redistest.Start(t, "--user", "app", "on", ">app-password", "~*", "&*", "+@all", "-function", "--user", "default", "on", "nopass", "~*", "&*", "+@all")
	st := settingsFor(r.Addr())
	st.Username, st.Password = "app", "app-password"
	s := newTestStore(t, st, Options{})
	waitHealthy(t, s)
	if s.pipe.functions.Load() || !s.pipe.refused.Load() {
		t.Fatalf("functions %v, refused %v: want EVALSHA for a user without FUNCTION", s.pipe.functions.Load(), s.pipe.refused.Load())
	}
	admin := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer admin.Close()
	evalsha := commandCalls(t, admin, "evalsha")
	sp := mustSpec(t, time.Minute, 1)
	for i := range 3 {
		res, err := s.Do(context.Background(), []window.Request{{Key: "k", Spec: sp, Limit: 2, Hits: 1, Veto: true}})
		if err != nil || res[0].Allowed != (i < 2) {
			t.Fatalf("call %d: %+v, %v", i, res, err)
		}
	}
	if got := commandCalls(t, admin, "evalsha") - evalsha; got < 3 {
		t.Fatalf("%d EVALSHAs for 3 calls", got)
	}
}
