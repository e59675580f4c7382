package redisstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/window"
)

// BenchmarkDo measures Do against a real redis-server on loopback: each
// algorithm (and "mixed": one descriptor each of sliding_window,
// token_bucket and fixed_window), 1 and 3
// descriptors, one hot key or keys spread over 100k, from concurrent
// goroutines (RunParallel). Besides ns/op (inverse throughput) and
// allocations it reports the p99 latency of one Do and the round trips per
// Do (always 1).
//
//	go test -run '^$' -bench BenchmarkDo -benchmem -benchtime 20000x ./redisstore/
func BenchmarkDo(b *testing.B) {
	r := redistest.Start(b)
	st := settingsFor(r.Addr())
	st.PoolSize = 16
	s := newTestStore(b, st, Options{HealthInterval: time.Hour})
	waitHealthy(b, s)
	rt := countRoundTrips(s)
	sp := mustSpec(b, time.Second, 20)
	mixed := []window.Algorithm{window.SlidingWindow, window.TokenBucket, window.FixedWindow}
	for _, alg := range []string{"sliding_window", "token_bucket", "fixed_window", "sliding_log", "time_buckets", "mixed"} {
		algFor := func(d int) window.Algorithm {
			if alg == "mixed" {
				return mixed[d%len(mixed)]
			}
			for _, a := range append(mixed, window.SlidingLog, window.TimeBuckets) {
				if a.String() == alg {
					return a
				}
			}
			panic(alg)
		}
		for _, descriptors := range []int{1, 3} {
			if alg == "mixed" && descriptors == 1 {
				continue
			}
			for _, keys := range []int{1, 100_000} {
				benchDo(b, s, rt, sp, alg, algFor, descriptors, keys)
			}
		}
	}
}

// benchDo runs one BenchmarkDo case.
func benchDo(b *testing.B, s *Store, rt *roundTrips, sp window.Spec, alg string, algFor func(int) window.Algorithm, descriptors, keys int) {
	name := fmt.Sprintf("alg=%s/descriptors=%d/keys=%d", alg, descriptors, keys)
	b.Run(name, func(b *testing.B) {
		// Key names are made up front: the benchmark measures Do.
		names := make([][]string, descriptors)
		for d := range names {
			names[d] = make([]string, keys)
			for k := range keys {
				names[d][k] = fmt.Sprintf("bench_d%d_k%d", d, k)
			}
		}
		runTimed(b, rt, func() func(ctx context.Context, i int) error {
			reqs := make([]window.Request, descriptors) // one per goroutine
			return func(ctx context.Context, i int) error {
				k := i % keys
				for d := range reqs {
					q := window.Request{Key: names[d][k], Spec: sp, Limit: window.MaxLimit, Hits: 1, Veto: true, Algorithm: algFor(d)}
					if q.Algorithm == window.SlidingLog {
						q.Limit = 100 // a small limit, its use case (each call reads the whole log)
					}
					reqs[d] = q
				}
				_, err := s.Do(ctx, reqs)
				return err
			}
		})
	})
}

// benchCallersPerCPU is the RunParallel parallelism: 25 goroutines per
// GOMAXPROCS, 50 on two cores, as many concurrent callers as a busy
// replica sees.
const benchCallersPerCPU = 25

// runTimed runs calls from b.RunParallel goroutines (newCall is called once
// per goroutine; i counts calls across all of them) and reports, besides
// ns/op and allocations, the p99 latency of one call and the Redis round
// trips per call counted by rt.
func runTimed(b *testing.B, rt *roundTrips, newCall func() func(ctx context.Context, i int) error) {
	var next atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	before := rt.n.Load()
	b.ReportAllocs()
	b.SetParallelism(benchCallersPerCPU)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		call := newCall()
		mine := make([]time.Duration, 0, 1024)
		for pb.Next() {
			i := int(next.Add(1))
			start := time.Now()
			if err := call(ctx, i); err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(start))
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	}
	b.ReportMetric(float64(rt.n.Load()-before)/float64(b.N), "roundtrips/op")
}
