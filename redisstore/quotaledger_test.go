package redisstore

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/rlqs/quota"
)

// ledgerClaim is a claim on a 400-per-window limit of one heavy bucket.
func ledgerClaim(key string, demand, committed, want float64) quota.Claim {
	return quota.Claim{Key: key, Limit: 400, Reserve: 4, Hold: time.Minute,
		Demands: []float64{demand}, Weights: []float64{1}, Committed: committed, Want: want}
}

// TestQuotaLedgerDividesAcrossReplicas: on one redis-server, two replicas'
// claims on a limit are divided together (the level over both), the second
// replica is granted only what the first's grant left, a claim is freed
// when its replica stops renewing it, and a limit's hash is its own.
func TestQuotaLedgerDividesAcrossReplicas(t *testing.T) {
	r := redistest.Start(t)
	st := newTestStore(t, settingsFor(r.Addr()), Options{})
	a, b := st.QuotaLedger(), st.QuotaLedger()
	ctx := context.Background()

	da, err := a.Divide(ctx, []quota.Claim{ledgerClaim("k", 1000, 0, 400)})
	if err != nil {
		t.Fatal(err)
	}
	if d := da[0]; d.Replicas != 1 || d.Grant != 396 || math.Abs(d.Level-(400-4-2-1)) > 1e-9 {
		t.Fatalf("one replica: %+v, want the level 393 (less the reserve, a burst and the share's burst) and a grant of 396", d)
	}
	db, err := b.Divide(ctx, []quota.Claim{ledgerClaim("k", 1000, 0, 400), ledgerClaim("other", 1000, 0, 400)})
	if err != nil {
		t.Fatal(err)
	}
	if d := db[0]; d.Replicas != 2 || d.Grant != 0 || d.Level > 200 {
		t.Fatalf("second replica: %+v, want two replicas, the level halved and nothing granted (the first holds it all)", d)
	}
	if d := db[1]; d.Replicas != 1 || d.Grant != 396 {
		t.Fatalf("another limit: %+v, want it untouched by the first", d)
	}
	// a cuts to its share; only then can b be granted the rest.
	da, _ = a.Divide(ctx, []quota.Claim{ledgerClaim("k", 1000, 198, 0)})
	db, _ = b.Divide(ctx, []quota.Claim{ledgerClaim("k", 1000, 0, 400)})
	if da[0].Grant != 0 || db[0].Grant != 400-4-198 {
		t.Fatalf("after a's cut: a granted %v, b granted %v, want 0 and %v", da[0].Grant, db[0].Grant, 400-4-198)
	}

	short := ledgerClaim("gone", 1000, 300, 0)
	short.Hold = 200 * time.Millisecond
	if _, err := a.Divide(ctx, []quota.Claim{short}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // Redis's clock times the hold
	d, err := b.Divide(ctx, []quota.Claim{ledgerClaim("gone", 1000, 0, 400)})
	if err != nil {
		t.Fatal(err)
	}
	if d[0].Replicas != 1 || d[0].Grant != 396 {
		t.Fatalf("after the other replica's hold ran out: %+v, want it forgotten and all granted", d[0])
	}
}

// TestQuotaLedgerWithdrawal: a claim of no demand and nothing committed
// withdraws the replica's claim at once: the other replica is granted
// what it held without waiting for its hold to end.
func TestQuotaLedgerWithdrawal(t *testing.T) {
	r := redistest.Start(t)
	st := newTestStore(t, settingsFor(r.Addr()), Options{})
	a, b := st.QuotaLedger(), st.QuotaLedger()
	ctx := context.Background()
	if _, err := a.Divide(ctx, []quota.Claim{ledgerClaim("k", 1000, 0, 400)}); err != nil {
		t.Fatal(err)
	}
	w := quota.Claim{Key: "k", Limit: 400, Reserve: 4, Hold: time.Minute}
	d, err := a.Divide(ctx, []quota.Claim{w})
	if err != nil {
		t.Fatal(err)
	}
	if d[0].Replicas != 0 || d[0].Grant != 0 {
		t.Fatalf("the withdrawal answered %+v, want no replica left and nothing granted", d[0])
	}
	d, err = b.Divide(ctx, []quota.Claim{ledgerClaim("k", 1000, 0, 400)})
	if err != nil {
		t.Fatal(err)
	}
	if d[0].Replicas != 1 || d[0].Grant != 396 {
		t.Fatalf("after a's withdrawal: %+v, want b alone and granted it all", d[0])
	}
}

// TestQuotaLedgerNeverGrantsTwice: 8 replicas claiming the whole limit at
// once are granted no more than it in total, and all of it.
func TestQuotaLedgerNeverGrantsTwice(t *testing.T) {
	r := redistest.Start(t)
	st := newTestStore(t, settingsFor(r.Addr()), Options{})
	var mu sync.Mutex
	total := 0.0
	var wg sync.WaitGroup
	for range 8 {
		l := st.QuotaLedger()
		wg.Go(func() {
			d, err := l.Divide(context.Background(), []quota.Claim{ledgerClaim("k", 1000, 0, 400)})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			total += d[0].Grant
			mu.Unlock()
		})
	}
	wg.Wait()
	if total != 396 {
		t.Fatalf("granted %v in total to 8 replicas at once, want exactly the limit less the reserve, 396", total)
	}
}

// TestQuotaLedgerCluster: on a Redis Cluster the limits' hashes spread
// over the nodes and one Divide answers them all.
func TestQuotaLedgerCluster(t *testing.T) {
	addrs := startCluster(t)
	st := settingsFor(addrs[0])
	st.Topology, st.Addrs = Cluster, addrs
	s := newTestStore(t, st, Options{})
	var claims []quota.Claim
	for i := range 30 {
		claims = append(claims, ledgerClaim(fmt.Sprint("k", i), 1000, 0, 400))
	}
	d, err := s.QuotaLedger().Divide(context.Background(), claims)
	if err != nil {
		t.Fatal(err)
	}
	for i := range d {
		if d[i].Grant != 396 {
			t.Fatalf("claim %d: %+v, want 396 granted", i, d[i])
		}
	}
}

// BenchmarkQuotaLedgerTick is one replica's RLQS tick on Redis, with two
// replicas claiming 100 limits (10 demand points each): the wall time of
// one Divide of 100 claims, pipelined, and Redis's own CPU per limit and
// tick (INFO commandstats), what a Redis shard pays per limit, replica and
// tick.
//
//	go test ./redisstore -run '^$' -bench QuotaLedgerTick -benchtime 200x
func BenchmarkQuotaLedgerTick(b *testing.B) {
	r := redistest.Start(b)
	st := newTestStore(b, settingsFor(r.Addr()), Options{})
	ctx := context.Background()
	claims := make([]quota.Claim, 100)
	for i := range claims {
		c := ledgerClaim(fmt.Sprint("k", i), 50, 100, 10)
		for j := 1; j < 10; j++ {
			c.Demands, c.Weights = append(c.Demands, float64(10*j)), append(c.Weights, 1)
		}
		claims[i] = c
	}
	a, other := st.QuotaLedger(), st.QuotaLedger()
	if _, err := other.Divide(ctx, claims); err != nil {
		b.Fatal(err)
	}
	st.client.ConfigResetStat(ctx)
	b.ResetTimer()
	for range b.N {
		if _, err := a.Divide(ctx, claims); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	rc := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rc.Close()
	b.ReportMetric(evalshaMicros(b, rc), "redis-µs/limit")
}
