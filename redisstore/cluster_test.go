package redisstore

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/window"
)

// startCluster starts a 3-master Redis Cluster (no replicas) on free ports
// and returns its addresses once every node reports cluster_state:ok.
func startCluster(t *testing.T) []string {
	t.Helper()
	redistest.Need(t)
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Skip("redis-cli is not installed (apt-get install -y redis-tools); skipping the cluster test")
	}
	var addrs []string
	for range 3 {
		r := redistest.Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000")
		addrs = append(addrs, r.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster node %s not ok: %v %s", a, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
	}
	return addrs
}

// TestCluster: on a 3-node Redis Cluster a batch whose keys live on
// different nodes costs one pipeline, two replicas share one limit, and a
// refused Veto in one slot takes back the hits recorded in the others.
func TestCluster(t *testing.T) {
	addrs := startCluster(t)
	st := settingsFor(addrs[0])
	st.Topology, st.Addrs = Cluster, addrs
	st.KeyPrefix = "lg_"
	a := newTestStore(t, st, Options{HealthInterval: time.Hour})
	b := newTestStore(t, st, Options{})
	waitHealthy(t, a, b)
	sp := mustSpec(t, time.Hour, 60)
	ctx := context.Background()

	// Keys spread over distinct slots (and, with 3 masters, nodes).
	keys := []string{"user_alice", "user_bob", "path_/x", "tenant_42"}
	slots := map[uint16]bool{}
	for _, k := range keys {
		slots[keySlot(a.counterKey(&window.Request{Key: k}))] = true
	}
	if len(slots) < 3 {
		t.Fatalf("test keys share slots: %v", slots)
	}
	// keySlot agrees with the cluster.
	cc := a.client.(*redis.ClusterClient)
	for _, k := range keys {
		want, err := cc.ClusterKeySlot(ctx, a.counterKey(&window.Request{Key: k})).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := keySlot(a.counterKey(&window.Request{Key: k})); int64(got) != want {
			t.Fatalf("keySlot(%q) = %d, cluster says %d", k, got, want)
		}
	}

	rt := countRoundTrips(a)
	reqs := make([]window.Request, len(keys))
	for i, k := range keys {
		reqs[i] = window.Request{Key: k, Spec: sp, Limit: 5, Hits: 1, Veto: true}
	}
	before := rt.n.Load()
	res, err := a.Do(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if n := rt.n.Load() - before; n != 1 {
		t.Fatalf("%d round trips for one batch over %d slots, want 1 pipeline", n, len(slots))
	}
	for i, r := range res {
		if !r.Recorded || r.Remaining != 4 {
			t.Fatalf("result %d: %+v", i, r)
		}
	}

	// Fill tenant_42, then a batch vetoed by it records nowhere.
	if _, err := a.Do(ctx, []window.Request{{Key: "tenant_42", Spec: sp, Limit: 5, Hits: 4, Veto: true}}); err != nil {
		t.Fatal(err)
	}
	res, err = a.Do(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Recorded {
			t.Fatalf("result %d recorded in a vetoed cross-slot batch: %+v", i, r)
		}
	}
	if !res[0].Allowed || res[0].Remaining != 4 {
		t.Fatalf("alice after the take-back: %+v, want allowed with 4 remaining", res[0])
	}
	check, err := a.Do(ctx, []window.Request{{Key: "user_alice", Spec: sp, Limit: 5, Hits: 0}})
	if err != nil || check[0].Remaining != 4 {
		t.Fatalf("alice's count after a vetoed batch: %+v %v, want 4 remaining", check, err)
	}

	// Two replicas, one limit, concurrent load.
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		s := a
		if w%2 == 1 {
			s = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				res, err := s.Do(ctx, []window.Request{
					{Key: "shared", Spec: sp, Limit: 100, Hits: 1, Veto: true},
					{Key: fmt.Sprint("spread", w, i), Spec: sp, Limit: 100, Hits: 1, Veto: true},
				})
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
	if n := admitted.Load(); n != 100 {
		t.Fatalf("admitted %d on the cluster, want exactly 100", n)
	}

	// Mixed algorithms across slots: a refused token-bucket Veto takes
	// back the sliding hits recorded in another slot, and the fixed
	// window's refund (in a third slot) does not apply.
	tbSpec := mustSpec(t, time.Hour, 1)
	mixed := []window.Request{
		{Key: "mix_sliding", Spec: sp, Limit: 5, Hits: 1, Veto: true},
		{Key: "mix_fixed", Spec: tbSpec, Limit: 5, Hits: 2, Negative: true, Veto: true, Algorithm: window.FixedWindow}, // a refund never vetoes
		{Key: "mix_bucket", Spec: tbSpec, Limit: 2, Hits: 1, Veto: true, Algorithm: window.TokenBucket},
	}
	mixedSlots := map[uint16]bool{}
	for i := range mixed {
		mixedSlots[keySlot(a.counterKey(&mixed[i]))] = true
	}
	if len(mixedSlots) != 3 {
		t.Fatalf("mixed keys share slots: %v", mixedSlots)
	}
	for _, q := range []window.Request{
		{Key: "mix_fixed", Spec: tbSpec, Limit: 5, Hits: 5, Veto: true, Algorithm: window.FixedWindow}, // full: its refund's check is refused
		{Key: "mix_bucket", Spec: tbSpec, Limit: 2, Hits: 2, Veto: true, Algorithm: window.TokenBucket},
	} {
		if res, err := a.Do(ctx, []window.Request{q}); err != nil || !res[0].Recorded {
			t.Fatalf("filling %s: %+v %v", q.Key, res, err)
		}
	}
	remaining := func() []uint64 {
		t.Helper()
		check := make([]window.Request, len(mixed))
		copy(check, mixed)
		for i := range check {
			check[i].Hits, check[i].Veto, check[i].Negative = 0, false, false
		}
		res, err := a.Do(ctx, check)
		if err != nil {
			t.Fatal(err)
		}
		return []uint64{res[0].Remaining, res[1].Remaining, res[2].Remaining}
	}
	before = rt.n.Load()
	res, err = a.Do(ctx, mixed)
	if err != nil {
		t.Fatal(err)
	}
	// one pipeline, then the take-back
	if n := rt.n.Load() - before; n != 2 {
		t.Errorf("vetoed mixed cross-slot batch: %d round trips, want 2", n)
	}
	if res[2].Allowed || res[0].Recorded || !res[0].Allowed || res[1].Remaining != 0 {
		t.Fatalf("vetoed mixed batch: %+v", res)
	}
	if got := remaining(); fmt.Sprint(got) != "[5 0 0]" {
		t.Fatalf("remaining after a vetoed mixed batch %v, want [5 0 0]", got)
	}
	// The refused bucket no longer vetoes: the sliding hit counts and the
	// refund applies, in a second round trip (sent once no veto of the
	// batch refused).
	mixed[2].Veto = false
	before = rt.n.Load()
	res, err = a.Do(ctx, mixed)
	if err != nil {
		t.Fatal(err)
	}
	if n := rt.n.Load() - before; n != 2 {
		t.Errorf("cross-slot batch with a veto and a refund: %d round trips, want 2", n)
	}
	if !res[0].Recorded || !res[1].Allowed || res[1].Remaining != 2 {
		t.Fatalf("mixed batch: %+v", res)
	}
	if got := remaining(); fmt.Sprint(got) != "[4 2 0]" {
		t.Fatalf("remaining after a mixed batch %v, want [4 2 0]", got)
	}
	// No veto at all: refunds go in the one pipeline.
	mixed[0].Veto = false
	before = rt.n.Load()
	if _, err = a.Do(ctx, mixed); err != nil {
		t.Fatal(err)
	}
	if n := rt.n.Load() - before; n != 1 {
		t.Errorf("cross-slot batch without a veto: %d round trips, want 1", n)
	}
	if got := remaining(); fmt.Sprint(got) != "[3 4 0]" {
		t.Fatalf("remaining after a batch without veto %v, want [3 4 0]", got)
	}

	// TTLs are set on the cluster too.
	for _, k := range keys {
		ttl, err := cc.PTTL(ctx, a.counterKey(&window.Request{Key: k})).Result()
		if err != nil || ttl <= 0 {
			t.Fatalf("TTL of %s: %v %v", k, ttl, err)
		}
	}
}
