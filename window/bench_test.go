package window

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leapgate/leapgate/internal/testclock"
)

// BenchmarkCounterAllowAt is a check-and-add of the default Counter on one
// key with the time passed in, the clock moving one microsecond per op (so
// blocks close and expire): an exact log (limit ExactLimit), blocks of one
// hit (Blocks), of about 9.4 hits (1000) and of about 20M hits (2^31). Run
// with -cpu 1,2 for 1 and 2 goroutines.
func BenchmarkCounterAllowAt(b *testing.B) {
	for _, limit := range []uint64{ExactLimit, Blocks, 1000, 1 << 31} {
		b.Run(fmt.Sprintf("limit=%d", limit), func(b *testing.B) {
			c := NewCounter(mustSpec(b, time.Second, 1))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				// Each goroutine keeps its own clock (1 µs per call), as
				// callers that each read the time do; a shared atomic
				// clock here would measure its own contention.
				var now time.Duration
				for pb.Next() {
					now += time.Microsecond
					c.AllowAt(now, 1, limit)
				}
			})
		})
	}
}

// BenchmarkBucketCounterAllowAt is BenchmarkCounterAllowAt for the
// TimeBuckets counter (lock-free), at 10, 20 and 60 buckets.
func BenchmarkBucketCounterAllowAt(b *testing.B) {
	for _, k := range []int{10, 20, 60} {
		b.Run(fmt.Sprintf("buckets=%d", k), func(b *testing.B) {
			c := NewBucketCounter(mustSpec(b, 1200*time.Millisecond, k))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var now time.Duration
				for pb.Next() {
					now += time.Microsecond
					c.AllowAt(now, 1, 1<<31)
				}
			})
		})
	}
}

// BenchmarkCounterAllowAtRefused is the over-limit path (with its
// Retry-After) of the default Counter and of the TimeBuckets counter.
func BenchmarkCounterAllowAtRefused(b *testing.B) {
	for _, alg := range []Algorithm{SlidingWindow, TimeBuckets} {
		b.Run(alg.String(), func(b *testing.B) {
			m := newMeter(mustSpec(b, time.Hour, DefaultBuckets), alg)
			m.AllowAt(0, 1000, 1000)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					m.AllowAt(time.Minute, 1, 1000)
				}
			})
		})
	}
}

// BenchmarkStoreDo is Store.DoAt (one request per call) over 100k existing
// keys picked at random.
func BenchmarkStoreDo(b *testing.B) {
	const n = 100_000
	spec := mustSpec(b, time.Second, DefaultBuckets)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "domain_key_value_" + strconv.Itoa(i)
	}
	s := NewStore(StoreOptions{Clock: &testclock.Clock{}})
	res := make([]Result, 1)
	for _, k := range keys {
		s.DoAt(context.Background(), 0, []Request{{Key: k, Spec: spec, Limit: 1 << 30, Hits: 1}}, res)
	}
	var clock atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
		req := make([]Request, 1)
		res := make([]Result, 1)
		for pb.Next() {
			req[0] = Request{Key: keys[rng.IntN(n)], Spec: spec, Limit: 1 << 30, Hits: 1, Veto: true}
			s.DoAt(context.Background(), time.Duration(clock.Add(1000)), req, res)
		}
	})
}

// BenchmarkBytesPerKey reports the heap bytes per active key of a Store
// (counter, map entry and a 24-byte key) for every algorithm, the
// TimeBuckets counter at several bucket counts.
func BenchmarkBytesPerKey(b *testing.B) {
	for _, k := range []int{1, 10, 20, 60} {
		b.Run(fmt.Sprintf("%v/buckets=%d", TimeBuckets, k), func(b *testing.B) {
			var perKey float64
			for range b.N {
				perKey = bytesPerKey(b, k, TimeBuckets, 100_000)
			}
			b.ReportMetric(perKey, "B/key")
		})
	}
	for _, alg := range []Algorithm{SlidingWindow, TokenBucket, FixedWindow} {
		b.Run(alg.String(), func(b *testing.B) {
			var perKey float64
			for range b.N {
				perKey = bytesPerKey(b, 1, alg, 100_000)
			}
			b.ReportMetric(perKey, "B/key")
		})
	}
	// The sliding log's ring holds one timestamp per unit of limit.
	for _, limit := range []uint64{5, 10, 12, 13, 20, 100} {
		b.Run(fmt.Sprintf("%v/limit=%d", SlidingLog, limit), func(b *testing.B) {
			var perKey float64
			for range b.N {
				perKey = bytesPerKeyAt(b, 1, SlidingLog, limit, 20_000)
			}
			b.ReportMetric(perKey, "B/key")
		})
	}
}

// bytesPerKey measures the heap growth per key of a Store holding n keys
// of algorithm alg with k buckets each, at limit 10.
func bytesPerKey(tb testing.TB, k int, alg Algorithm, n int) float64 {
	return bytesPerKeyAt(tb, k, alg, 10, n)
}

// bytesPerKeyAt is bytesPerKey at the given limit.
func bytesPerKeyAt(tb testing.TB, k int, alg Algorithm, limit uint64, n int) float64 {
	spec := mustSpec(tb, time.Minute, k)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("domain_rule_key_%08d", i) // 24 bytes
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := NewStore(StoreOptions{Clock: &testclock.Clock{}})
	res := make([]Result, 1)
	for _, key := range keys {
		s.DoAt(context.Background(), 0, []Request{{Key: key, Spec: spec, Limit: limit, Hits: 1, Algorithm: alg}}, res)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(s)
	runtime.KeepAlive(keys)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
}

// BenchmarkShortfall measures what each bounded-memory sliding window
// gives up on steady traffic at 1.5x the limit (Poisson arrivals, limit 1000
// per 1.2 s, 200 windows): an exact sliding log and the counter see the
// same arrivals; "shortfall-%" is the capacity lost, (log admitted - counter
// admitted) / log admitted, and "quota-used-%" the counter's admissions as a
// share of the log's. cmd/accuracy measures every other trace shape.
func BenchmarkShortfall(b *testing.B) {
	b.Run(SlidingWindow.String(), func(b *testing.B) {
		var shortfall, used float64
		for range b.N {
			shortfall, used = shortfallRate(b, SlidingWindow, 1)
		}
		b.ReportMetric(shortfall, "shortfall-%")
		b.ReportMetric(used, "quota-used-%")
	})
	for _, k := range []int{1, 2, 4, 10, 20, 50, 60, 100} {
		b.Run(fmt.Sprintf("%v/buckets=%d", TimeBuckets, k), func(b *testing.B) {
			var shortfall, used float64
			for range b.N {
				shortfall, used = shortfallRate(b, TimeBuckets, k)
			}
			b.ReportMetric(shortfall, "shortfall-%")
			b.ReportMetric(used, "quota-used-%")
		})
	}
}

func shortfallRate(tb testing.TB, alg Algorithm, k int) (shortfallPct, usedPct float64) {
	const (
		limit   = 1000
		windows = 200
	)
	w := 1200 * time.Millisecond // divisible by every bucket count measured
	c := newMeter(mustSpec(tb, w, k), alg)
	rng := rand.New(rand.NewPCG(42, 7))
	mean := float64(w) / (1.5 * limit)
	var log []time.Duration // the exact sliding log's admitted hits, oldest first
	ours, exact := 0, 0
	for now := time.Duration(0); now < windows*w; now += time.Duration(rng.ExpFloat64() * mean) {
		for len(log) > 0 && log[0] <= now-w {
			log = log[1:]
		}
		if len(log) < limit {
			exact++
			log = append(log, now)
		}
		if c.AllowAt(now, 1, limit).Allowed {
			ours++
		}
	}
	return 100 * float64(exact-ours) / float64(exact), 100 * float64(ours) / float64(exact)
}

// BenchmarkStoreDoOneKey is Store.DoAt on one hot key: the Store's own
// overhead (hash, shard read lock, map lookup) without cache misses.
func BenchmarkStoreDoOneKey(b *testing.B) {
	spec := mustSpec(b, time.Second, DefaultBuckets)
	s := NewStore(StoreOptions{Clock: &testclock.Clock{}})
	var clock atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := []Request{{Key: "domain_key_value", Spec: spec, Limit: 1 << 30, Hits: 1, Veto: true}}
		res := make([]Result, 1)
		for pb.Next() {
			s.DoAt(context.Background(), time.Duration(clock.Add(1000)), req, res)
		}
	})
}

// BenchmarkAlgorithms is AllowAt of each algorithm on one key, time passed in.
func BenchmarkAlgorithms(b *testing.B) {
	spec := mustSpec(b, time.Second, DefaultBuckets)
	for _, alg := range []Algorithm{SlidingWindow, TokenBucket, FixedWindow, TimeBuckets} { // SlidingLog: BenchmarkLogCounterAllowAt
		b.Run(alg.String(), func(b *testing.B) {
			m := newMeter(spec, alg)
			var clock atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					m.AllowAt(time.Duration(clock.Add(1000)), 1, 1<<31)
				}
			})
		})
	}
}

// BenchmarkLogCounterAllowAt is a check-and-add of the sliding log on one
// key with the time passed in, at limits 10 and 100 per 1s window, the clock
// moving so that about 1.5x the limit is offered per window (a mix of
// admissions, refusals and expiries). Run with -cpu 1,2 for 1 and 2
// goroutines.
func BenchmarkLogCounterAllowAt(b *testing.B) {
	for _, limit := range []uint64{10, 100} {
		b.Run(fmt.Sprintf("limit=%d", limit), func(b *testing.B) {
			l := NewLogCounter(mustSpec(b, time.Second, 1))
			step := int64(time.Second) / int64(limit) * 2 / 3
			var clock atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					l.AllowAt(time.Duration(clock.Add(step)), 1, limit)
				}
			})
		})
	}
}

// BenchmarkMapBaseline100k is the floor for BenchmarkStoreDo: a plain
// map[string]*T lookup of a random one of 100k keys, touching the value.
// On a small VM both are dominated by cache misses.
func BenchmarkMapBaseline100k(b *testing.B) {
	const n = 100_000
	type val struct{ hits atomic.Uint64 }
	keys := make([]string, n)
	m := make(map[string]*val, n)
	for i := range keys {
		keys[i] = "domain_key_value_" + strconv.Itoa(i)
		m[keys[i]] = &val{}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
		for pb.Next() {
			m[keys[rng.IntN(n)]].hits.Add(1)
		}
	})
}
