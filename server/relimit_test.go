package server_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// userPerSecond is one per-second rule on key user at limit n.
func userPerSecond(n int) string {
	return fmt.Sprintf("domain: test\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: %d}\n", n)
}

// admitted is the times a hammered key's calls were sent and answered OK.
type admitted struct {
	mu    sync.Mutex
	calls [][2]time.Time
	sent  int // calls made, answered or not
}

// between counts the calls sent at or after from and answered before to.
func (a *admitted) between(from, to time.Time) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, c := range a.calls {
		if !c[0].Before(from) && c[1].Before(to) {
			n++
		}
	}
	return n
}

// hammer calls ShouldRateLimit for user alice from two goroutines, as fast
// as they go, until the test's cleanup, and records the OK answers.
func hammer(t *testing.T, client rlsv3.RateLimitServiceClient) *admitted {
	a := &admitted{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for ctx.Err() == nil {
				sent := time.Now()
				a.mu.Lock()
				a.sent++
				a.mu.Unlock()
				resp, err := client.ShouldRateLimit(ctx, request("test", []string{"user", "alice"}))
				if err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
					a.mu.Lock()
					a.calls = append(a.calls, [2]time.Time{sent, time.Now()})
					a.mu.Unlock()
				}
			}
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return a
}

// TestReloadChangedLimitTakesEffect: a busy key's limit raised by a reload
// admits the new limit within one window (it was held near the old one
// until the key saw a full idle window), and a cut applies at once: from
// the reload on, no second admits more than the new limit.
func TestReloadChangedLimitTakesEffect(t *testing.T) {
	if testing.Short() {
		t.Skip("hammers a key for about 4 s of real time")
	}
	const low, high = 200, 400
	ts := start(t, map[string]string{"rules.yaml": userPerSecond(low)}, nil)
	a := hammer(t, ts.rls(t))
	time.Sleep(1500 * time.Millisecond)

	writeRules(t, ts.ruleDir, "rules.yaml", userPerSecond(high))
	waitRules(t, ts, fmt.Sprintf("test.user: unit=SECOND requests_per_unit=%d", high))
	raised := time.Now()
	time.Sleep(2 * time.Second)
	// Calls straddle the edges of the second, and a loaded machine slows
	// them: allow 15 % for that (a key held at the old limit admits 50 %).
	if got := a.between(raised.Add(time.Second), raised.Add(2*time.Second)); got < high*85/100 {
		t.Errorf("the second second after raising %d to %d admitted %d (%d calls in all)", low, high, got, a.sent)
	}

	writeRules(t, ts.ruleDir, "rules.yaml", userPerSecond(low/2))
	waitRules(t, ts, fmt.Sprintf("test.user: unit=SECOND requests_per_unit=%d", low/2))
	cut := time.Now()
	time.Sleep(1200 * time.Millisecond)
	for from := cut; from.Before(cut.Add(200 * time.Millisecond)); from = from.Add(10 * time.Millisecond) {
		if got := a.between(from, from.Add(time.Second)); got > low/2 {
			t.Fatalf("the second from %v after the cut to %d admitted %d", from.Sub(cut), low/2, got)
		}
	}
}
