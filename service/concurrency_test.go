package service

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/window"

	"github.com/leapgate/leapgate/internal/testclock"
)

const concurrencyRules = `
domain: conc
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// TestConcurrentAdmissionIsExact hammers one pair of keys from many
// goroutines at one instant, while the rules are reloaded: exactly the limit
// of the tighter rule is admitted, and the looser rule counts only the
// admitted requests (all-or-nothing holds under concurrency).
func TestConcurrentAdmissionIsExact(t *testing.T) {
	const workers, perWorker = 16, 40
	h := newHarness(t, mustParse(t, concurrencyRules), nil)
	request := req("conc", desc("a", "x"), desc("b", "x"))
	var admitted atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	reloads := sync.WaitGroup{}
	reloads.Add(1)
	go func() { // reload the same rules under load: counters must survive
		defer reloads.Done()
		for {
			select {
			case <-stop:
				return
			default:
				h.svc.SetRules(mustParse(t, concurrencyRules))
			}
		}
	}()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perWorker {
				resp, err := h.call(request)
				if err != nil {
					t.Error(err)
					return
				}
				if resp.OverallCode == codeOK {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	reloads.Wait()
	if got := admitted.Load(); got != 50 {
		t.Fatalf("admitted %d requests, want exactly 50", got)
	}
	resp, err := h.call(req("conc", desc("b", "x")))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Statuses[0].LimitRemaining; got != 49 {
		t.Errorf("b remaining %d after 50 admitted requests and one more, want 49", got)
	}
	if got := h.counter("within_limit", "conc", "conc.a"); got != 50 {
		t.Errorf("within_limit{conc.a} = %v, want 50", got)
	}
	if got := h.counter("over_limit", "conc", "conc.a"); got != workers*perWorker-50 {
		t.Errorf("over_limit{conc.a} = %v, want %d", got, workers*perWorker-50)
	}
}

// refuseAll is a Breakers whose every breaker is open.
type refuseAll struct{}

func (refuseAll) AllowProbe(*descriptors.Rule, []descriptors.Entry) (bool, uint64, time.Duration) {
	return false, 0, time.Second
}

// FuzzShouldRateLimit feeds arbitrary wire-format requests to the service:
// it must answer or return an error, never panic, and always answer one
// status per descriptor.
func FuzzShouldRateLimit(f *testing.F) {
	seeds := []*rlsv3.RateLimitRequest{
		req("test", desc("k", "exact")),
		reqHits("test", 3, desc("user", "u"), with(desc("multi", "m"), hits(0))),
		req("test", with(desc("x", "y"), override(1, 1, 30))),
		req("test", desc("old", "o"), desc("new", "n"), desc("quota", "a"), desc("quota", "b")),
		req("test", desc("nested", "a", "sub", "s"), desc("backend", "api"), desc("meta", "m")),
		req("", desc("k", "v")),
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	svc, err := New(Options{
		Limiter:         window.NewStore(window.StoreOptions{Clock: &testclock.Clock{}}),
		Registry:        prometheus.NewRegistry(),
		Breakers:        refuseAll{},
		ResponseHeaders: HeadersDraft11,
		DynamicMetadata: true,
		MaxDetailedKeys: 10,
	})
	if err != nil {
		f.Fatal(err)
	}
	svc.SetRules(mustParse(f, testRules))
	f.Fuzz(func(t *testing.T, data []byte) {
		var r rlsv3.RateLimitRequest
		if proto.Unmarshal(data, &r) != nil {
			return
		}
		resp, err := svc.ShouldRateLimit(context.Background(), &r)
		if err == nil && len(resp.GetStatuses()) != len(r.GetDescriptors()) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(r.GetDescriptors()))
		}
	})
}
