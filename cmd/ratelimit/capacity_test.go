package main

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

const capacityRules = `domain: cap
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 100}
`

// call is one ShouldRateLimit call as a client sees it: sent at sent, the
// answer received at received.
type call struct {
	sent, received time.Time
	admitted       bool
}

// TestBinaryFullCapacity runs the real binary with a 100/second rule, in
// memory and as two replicas on one redis-server, against three clients at
// once, each on its own key: a cron client that sends its whole quota at one
// instant, 1.03 s after its previous round's last answer; a client evenly
// paced at 97/s; and a hammer that sends as fast as it can. The first two must get at least 99% admitted (an
// exact sliding log admits all); for every client, no window of one second
// may admit more than 100, as far as the client can tell (101 admissions
// whose calls all fall within one second prove an overshoot).
func TestBinaryFullCapacity(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 20 s of real time")
	}
	root := ruleRoot(t, capacityRules)
	for n, backend := range []string{"memory", "redis, two replicas"} {
		t.Run(backend, func(t *testing.T) {
			clients := startReplicas(t, root, 2*n)
			// ask sends one call for key through the replicas in turn.
			var turn sync.Mutex
			next := 0
			ask := func(key string) call {
				turn.Lock()
				c := clients[next%len(clients)]
				next++
				turn.Unlock()
				req := &rlsv3.RateLimitRequest{Domain: "cap", Descriptors: []*rlcommonv3.RateLimitDescriptor{
					{Entries: []*rlcommonv3.RateLimitDescriptor_Entry{{Key: "client", Value: key}}},
				}}
				sent := time.Now()
				resp, err := c.ShouldRateLimit(context.Background(), req)
				if err != nil {
					t.Error(err)
				}
				return call{sent: sent, received: time.Now(), admitted: resp.GetOverallCode() == rlsv3.RateLimitResponse_OK}
			}

			var cron, paced, hammer []call
			var wg sync.WaitGroup
			wg.Add(3)
			go func() { // the whole quota at once, 1.03 s after the last round's last answer
				defer wg.Done()
				// A round starts 1.03 s after the previous round's last
				// answer, not after its start: every hit of that round was
				// counted before its answer, so it has aged out of the
				// window by then however slowly the round was served (under
				// -race on two cores a round of 100 calls takes tens of ms).
				var last time.Time
				for range 8 {
					time.Sleep(time.Until(last.Add(1030 * time.Millisecond)))
					var mu sync.Mutex
					var batch sync.WaitGroup
					for range 100 {
						batch.Add(1)
						go func() {
							defer batch.Done()
							c := ask("cron")
							mu.Lock()
							cron = append(cron, c)
							mu.Unlock()
						}()
					}
					batch.Wait()
					for _, c := range cron {
						if c.received.After(last) {
							last = c.received
						}
					}
				}
			}()
			go func() { // 97 per second, never two calls closer than 1/97 s
				defer wg.Done()
				gap := time.Second / 97
				at := time.Now()
				for range 97 * 6 {
					time.Sleep(time.Until(at))
					c := ask("paced")
					paced = append(paced, c)
					at = c.sent.Add(gap)
				}
			}()
			go func() { // as fast as it can, for 3 s
				defer wg.Done()
				var mu sync.Mutex
				var workers sync.WaitGroup
				end := time.Now().Add(3 * time.Second)
				for range 4 {
					workers.Add(1)
					go func() {
						defer workers.Done()
						for time.Now().Before(end) {
							c := ask("hammer")
							mu.Lock()
							hammer = append(hammer, c)
							mu.Unlock()
						}
					}()
				}
				workers.Wait()
			}()
			wg.Wait()

			for _, c := range []struct {
				name  string
				calls []call
				least float64 // share that must be admitted
			}{
				{"cron", cron, 0.99},
				{"paced at 97%", paced, 0.99},
				{"hammer", hammer, 0},
			} {
				admitted := 0
				for _, x := range c.calls {
					if x.admitted {
						admitted++
					}
				}
				share := float64(admitted) / float64(len(c.calls))
				t.Logf("%s: %d of %d admitted (%.2f%%)", c.name, admitted, len(c.calls), 100*share)
				if share < c.least {
					t.Errorf("%s: %.2f%% admitted, want at least %.0f%%", c.name, 100*share, 100*c.least)
				}
				if at, n := overshoot(c.calls, 100, time.Second); n > 0 {
					t.Errorf("%s: %d admissions within one second from %v", c.name, n, at.Format(time.StampMicro))
				}
			}
			if len(hammer) < 300 {
				t.Errorf("the hammer sent only %d calls: it did not load the limit", len(hammer))
			}
		})
	}
}

// overshoot looks for limit+1 admitted calls that all lie within one window
// (from the earliest send to the latest answer): proof that the server
// admitted more than limit in some window. It returns the first such group's
// start and size, or 0.
func overshoot(calls []call, limit int, w time.Duration) (time.Time, int) {
	var in []call
	for _, c := range calls {
		if c.admitted {
			in = append(in, c)
		}
	}
	slices.SortFunc(in, func(a, b call) int { return a.sent.Compare(b.sent) })
	for i := 0; i+limit < len(in); i++ {
		latest := in[i].received
		for _, c := range in[i : i+limit+1] {
			if c.received.After(latest) {
				latest = c.received
			}
		}
		if latest.Sub(in[i].sent) < w {
			return in[i].sent, limit + 1
		}
	}
	return time.Time{}, 0
}
