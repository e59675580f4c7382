package redisstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/window"
)

// BenchmarkVictimBesideAnExpensiveKey is the hardening issue's attack on
// one redis-server: a key of each algorithm filled to a limit of 10,000
// (10,000 hits in a sliding log's window, 10,000 leases held), 32
// goroutines hammering it, and a victim calling a sliding-window key of
// its own every millisecond. It reports what one call on the full key
// costs alone (alone-ms/call) and the victim's latency while the attack
// runs (victim-p50-ms, victim-p99-ms): a script step that reads the whole
// key slows every key of the server.
//
//	go test -run '^$' -bench BenchmarkVictimBesideAnExpensiveKey -benchtime 1x ./redisstore
func BenchmarkVictimBesideAnExpensiveKey(b *testing.B) {
	r := redistest.Start(b)
	s := newTestStore(b, settingsFor(r.Addr()), Options{HealthInterval: time.Hour})
	waitHealthy(b, s)
	ctx := context.Background()
	const n = 10_000
	for _, alg := range []window.Algorithm{window.SlidingWindow, window.SlidingLog, window.Concurrency} {
		b.Run(alg.String(), func(b *testing.B) {
			sp := mustSpec(b, time.Hour, 1)
			req := func(holder string) []window.Request {
				return []window.Request{{Key: "attacked", Spec: sp, Limit: n, Hits: 1, Algorithm: alg, Holder: holder}}
			}
			for i := range n {
				if _, err := s.Do(ctx, req(fmt.Sprint(i))); err != nil {
					b.Fatal(err)
				}
			}
			var lat []time.Duration
			for b.Loop() {
				start := time.Now()
				for range 20 {
					s.Do(ctx, req(""))
				}
				b.ReportMetric(float64(time.Since(start).Microseconds())/20/1000, "alone-ms/call")
				stop := make(chan struct{})
				var wg sync.WaitGroup
				for range 32 {
					wg.Go(func() {
						for {
							select {
							case <-stop:
								return
							default:
								s.Do(ctx, req(""))
							}
						}
					})
				}
				victim := []window.Request{{Key: "victim", Spec: mustSpec(b, time.Second, 1), Limit: 1 << 30, Hits: 1}}
				lat = lat[:0]
				for range 300 {
					t := time.Now()
					if _, err := s.Do(ctx, victim); err != nil {
						b.Error(err)
					}
					lat = append(lat, time.Since(t))
					time.Sleep(time.Millisecond)
				}
				close(stop)
				wg.Wait()
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "victim-p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "victim-p99-ms")
			s.Do(ctx, nil)
		})
	}
}
