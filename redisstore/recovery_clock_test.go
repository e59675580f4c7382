package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/internal/testclock"
	"github.com/leapgate/leapgate/window"
)

// TestLocalHitsCountAfterRecovery, on one fake clock for the store, its
// local windows and Redis's scripts: hits a local window admitted during
// an outage lower the limit sent to Redis while they are in the window, for
// their key only; a local result is undone in the local window after
// Redis is back; once the window has passed, Redis alone decides again.
// (TestLocalModeRecoveryNoOvershoot is the same in real time, under load.)
func TestLocalHitsCountAfterRecovery(t *testing.T) {
	r := redistest.Start(t)
	clock := &testclock.Clock{} // at 0: the local hits fall in bucket 0
	st := settingsFor(r.Addr())
	st.FailureMode = FailLocal
	st.Timeout = time.Second
	fallback := window.NewStore(window.StoreOptions{Clock: clock})
	s := withFakeTime(newTestStore(t, st, Options{Fallback: fallback, Clock: clock}), clock)
	waitHealthy(t, s)
	sp := mustSpec(t, time.Minute, 60)
	ctx := context.Background()
	req := func(key string) []window.Request {
		return []window.Request{{Key: key, Spec: sp, Limit: 5, Hits: 1, Veto: true}}
	}
	admitted := func(key string, n int) (got int, last window.Result) {
		t.Helper()
		for range n {
			res, err := s.Do(ctx, req(key))
			if err != nil {
				t.Fatal(err)
			}
			if res[0].Allowed {
				got++
			}
			last = res[0]
		}
		return got, last
	}

	r.Kill()
	waitUnhealthy(t, s)
	var local []window.Result
	for i := range 3 {
		res, err := s.Do(ctx, req("k"))
		if err != nil || !res[0].Allowed || res[0].Bucket >= 0 {
			t.Fatalf("local hit %d during the outage: %+v %v", i, res, err)
		}
		local = append(local, res[0])
	}

	r.Restart()
	waitHealthy(t, s)
	clock.Set(time.Second)
	// A local result is undone where it was counted: 2 local hits remain.
	if err := s.Undo(ctx, req("k"), local[:1]); err != nil {
		t.Fatal(err)
	}
	got, last := admitted("k", 4)
	if got != 3 {
		t.Errorf("after recovery: %d of 4 admitted with 2 local hits in the window, want 3 (5 - 2)", got)
	}
	if last.Allowed || last.Reset < 58*time.Second {
		t.Errorf("the refusal %+v, want a reset of the local hits' (about 59 s)", last)
	}
	if got, _ := admitted("other", 6); got != 5 {
		t.Errorf("a key without local hits: %d of 6 admitted, want 5", got)
	}
	// A window after the local hits (and Redis's) only Redis counts.
	clock.Set(2*time.Minute + time.Second)
	if got, _ := admitted("k", 6); got != 5 {
		t.Errorf("a window later: %d of 6 admitted, want 5", got)
	}

	// A second outage, later on the clock: its local hits count the same.
	r.Kill()
	waitUnhealthy(t, s)
	clock.Set(10 * time.Minute)
	if got, _ := admitted("k2", 4); got != 4 {
		t.Fatalf("second outage: %d of 4 admitted locally, want 4", got)
	}
	r.Restart()
	waitHealthy(t, s)
	clock.Set(10*time.Minute + time.Second)
	if got, _ := admitted("k2", 3); got != 1 {
		t.Errorf("after the second recovery: %d of 3 admitted with 4 local hits in the window, want 1", got)
	}
}

// TestRefusalAfterRecoveryWaitsForLocalHits: a request refused soon after
// an outage reports the later of two resets, Redis's and that of the hits
// the local window admitted meanwhile. Redis stalls rather than crashes
// here, so its hits from before the outage survive and, being older, leave
// the window before the local ones: Redis alone would promise too early.
func TestRefusalAfterRecoveryWaitsForLocalHits(t *testing.T) {
	r := redistest.Start(t)
	clock := &testclock.Clock{}
	st := settingsFor(r.Addr())
	st.FailureMode = FailLocal
	st.Timeout = 200 * time.Millisecond
	fallback := window.NewStore(window.StoreOptions{Clock: clock})
	s := withFakeTime(newTestStore(t, st, Options{Fallback: fallback, Clock: clock, HealthInterval: 50 * time.Millisecond}), clock)
	waitHealthy(t, s)
	sp := mustSpec(t, time.Minute, 60)
	ctx := context.Background()
	req := []window.Request{{Key: "k", Spec: sp, Limit: 5, Hits: 1, Veto: true}}
	do := func() window.Result {
		t.Helper()
		res, err := s.Do(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}

	for range 3 { // Redis counts 3 at 0 s
		if res := do(); !res.Allowed || res.Bucket < 0 {
			t.Fatalf("before the outage: %+v", res)
		}
	}
	r.Pause()
	waitUnhealthy(t, s)
	clock.Set(30 * time.Second)
	for range 2 { // the local window counts 2 at 30 s
		if res := do(); !res.Allowed || res.Bucket >= 0 {
			t.Fatalf("during the outage: %+v", res)
		}
	}
	r.Resume()
	waitHealthy(t, s)
	clock.Set(31 * time.Second)
	// 3 in Redis + 2 local = 5: refused. Redis's hits leave at 60 s (29 s
	// from now), the local ones at 90 s (59 s from now).
	if res := do(); res.Allowed || res.Reset < 55*time.Second || res.Reset > time.Minute {
		t.Errorf("after recovery: %+v, want a refusal with a reset of about 59 s", res)
	}
}
