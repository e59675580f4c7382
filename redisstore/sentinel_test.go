package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/window"
)

// TestSentinel: REDIS_TYPE=sentinel finds the master through a real
// sentinel (password-protected, REDIS_SENTINEL_AUTH) and counts there.
func TestSentinel(t *testing.T) {
	master := redistest.Start(t)
	sentinel := redistest.StartSentinel(t, "requirepass spw", fmt.Sprintf("sentinel monitor mymaster 127.0.0.1 %d 1", master.Port))

	st := settingsFor(sentinel.Addr())
	st.Topology, st.MasterName = Sentinel, "mymaster"
	st.SentinelPassword = "spw"
	s := newTestStore(t, st, Options{})
	waitHealthy(t, s)
	sp := mustSpec(t, time.Minute, 6)
	ctx := context.Background()
	for i := range 4 {
		res, err := s.Do(ctx, []window.Request{{Key: "sentinel", Spec: sp, Limit: 3, Hits: 1, Veto: true}})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Allowed != (i < 3) {
			t.Fatalf("hit %d: %+v", i, res[0])
		}
	}
	// The hits are on the master.
	direct := newTestStore(t, settingsFor(master.Addr()), Options{})
	res, err := direct.Do(ctx, []window.Request{{Key: "sentinel", Spec: sp, Limit: 3, Hits: 0}})
	if err != nil || res[0].Allowed || res[0].Remaining != 0 {
		t.Fatalf("master's view: %+v %v", res, err)
	}
}

// TestSentinelFailover: when the master dies, the sentinel promotes the
// replica and the store follows it without help; counts replicated before
// the failover still count.
func TestSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("failover takes a few seconds")
	}
	master := redistest.Start(t)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", fmt.Sprint(master.Port))
	sentinel := redistest.StartSentinel(t,
		fmt.Sprintf("sentinel monitor mymaster 127.0.0.1 %d 1", master.Port),
		"sentinel down-after-milliseconds mymaster 300",
		"sentinel failover-timeout mymaster 2000")

	st := settingsFor(sentinel.Addr())
	st.Topology, st.MasterName = Sentinel, "mymaster"
	st.Timeout = time.Second
	s := newTestStore(t, st, Options{})
	waitHealthy(t, s)
	sp := mustSpec(t, time.Hour, 60)
	ctx := context.Background()
	do := func() ([]window.Result, error) {
		return s.Do(ctx, []window.Request{{Key: "failover", Spec: sp, Limit: 10, Hits: 1, Veto: true}})
	}
	for range 4 {
		if _, err := do(); err != nil {
			t.Fatal(err)
		}
	}
	// Let the replica catch up, then kill the master.
	direct := newTestStore(t, settingsFor(replica.Addr()), Options{})
	for deadline := time.Now().Add(10 * time.Second); ; {
		res, err := direct.Do(ctx, []window.Request{{Key: "failover", Spec: sp, Limit: 10, Hits: 0}})
		if err == nil && res[0].Remaining == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica did not catch up: %+v %v", res, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	master.Kill()

	var res []window.Result
	var err error
	for deadline := time.Now().Add(20 * time.Second); ; {
		if res, err = do(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer after the failover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !res[0].Recorded || res[0].Remaining != 5 {
		t.Fatalf("first answer from the promoted replica: %+v, want recorded with 5 remaining", res[0])
	}
}
