package rlqs

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
)

// TestStreamQuirks: what Envoy's filter sends, and what a hostile client
// may, gets a clear answer.
func TestStreamQuirks(t *testing.T) {
	t.Run("the domain comes from the first message that names one", func(t *testing.T) {
		h := newHarness(t, Options{}, testRules)
		c := h.open()
		c.report("") // a heartbeat with no domain and no buckets
		c.report("web", usage(api, 0, 1, 0))
		c.report("other", usage(map[string]string{"name": "banned"}, 0, 1, 0))
		if got := c.strategy(api); got != "tb 2/1s burst 2 ttl 4s" {
			t.Errorf("api: %q, want the hold of web's rule", got)
		}
		if got := c.strategy(map[string]string{"name": "banned"}); got != "deny" {
			t.Errorf("a later domain is ignored: banned got %q, want web's deny", got)
		}
	})
	t.Run("empty reports are heartbeats", func(t *testing.T) {
		h := newHarness(t, Options{}, testRules)
		c := h.open()
		c.report("web")
		c.report("web")
		if len(c.received) != 0 {
			t.Errorf("got %d responses to empty reports, want none", len(c.received))
		}
	})
	t.Run("the id is answered exactly as reported", func(t *testing.T) {
		h := newHarness(t, Options{}, testRules)
		c := h.open()
		id := map[string]string{"tenant": "t1", "plan": "gold"}
		c.report("web", usage(id, 0, 1, 0))
		got := c.received[0].GetBucketAction()[0].GetBucketId().GetBucket()
		if len(got) != 2 || got["tenant"] != "t1" || got["plan"] != "gold" {
			t.Errorf("answered %v, want %v", got, id)
		}
	})
	t.Run("huge counts claim at most the limit", func(t *testing.T) {
		h := newHarness(t, Options{}, testRules)
		h.server.learnUntil = 0
		a, b := h.open(), h.open()
		a.report("web", usage(api, 0, 1, 0))
		b.report("web", usage(api, 0, 1, 0))
		for i := 0; i < 10; i++ {
			h.clock.Advance(time.Second)
			a.report("web", usage(api, 1, math.MaxUint64, math.MaxUint64))
			b.report("web", usage(api, 1, 150, 150)) // 200 per second, by the server's clock
			h.server.Tick(context.Background())
			h.clock.Advance(500 * time.Millisecond)
			h.server.Tick(context.Background())
		}
		if r := b.rate(api); r < 190 {
			t.Errorf("beside a client reporting 2^64 requests, a client of 200 per second got %v, want about 195", r)
		}
		if r := a.rate(api); math.IsNaN(r) || r > 400 {
			t.Errorf("the huge client got %v", r)
		}
	})
	t.Run("a report on a closed stream is ignored", func(t *testing.T) {
		h := newHarness(t, Options{}, testRules)
		c := h.open()
		c.stream.Close()
		c.report("web", usage(api, 0, 1, 0))
		c.stream.Close()
		if len(c.received) != 0 {
			t.Errorf("a closed stream got %d responses", len(c.received))
		}
	})
}

// TestBucketCaps: buckets past a cap are answered but take no share, so
// that one stream's 100,000 ids neither grow memory past the cap nor cut
// the rest of the fleet.
func TestBucketCaps(t *testing.T) {
	h := newHarness(t, Options{MaxBucketsPerStream: 100, MaxBucketsPerDomain: 150}, testRules)
	h.server.learnUntil = 0
	honest := h.open()
	honest.report("web", usage(api, 0, 1, 0))
	hostile := h.open()
	for i := 0; i < 100_000; i += 1000 {
		var us []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
		for j := i; j < i+1000; j++ {
			us = append(us, usage(map[string]string{"user": fmt.Sprint("u", j)}, 0, 1, 0))
		}
		hostile.report("web", us...)
	}
	other := h.open()
	for j := 0; j < 100; j++ {
		other.report("web", usage(map[string]string{"path": fmt.Sprint("/api/", j)}, 0, 1, 0))
	}
	if n := h.server.perDomain["web"]; n != 150 {
		t.Errorf("tracked %d buckets, want the cap of 150", n)
	}
	if got := hostile.strategy(map[string]string{"user": "u99999"}); got != "deny" {
		t.Errorf("a limited bucket past the stream cap got %q, want deny", got)
	}
	if got := other.strategy(map[string]string{"path": "/api/99"}); got != "deny" {
		t.Errorf("a limited bucket past the domain cap got %q, want deny", got)
	}
	if got := testutil.ToFloat64(h.server.metrics.capped); got != 100_000-100+51 {
		t.Errorf("leapgate_rlqs_buckets_capped_total = %v, want %d", got, 100_000-100+51)
	}
	h.run(5*time.Second, time.Second, map[*client]map[string]float64{honest: {"name=api": 1000}})
	if r := honest.rate(api); r < 380 {
		t.Errorf("the honest client on another rule got %v per second, want nearly 400", r)
	}
}

// TestIdleBucketsAreAbandoned and refreshed ones are not: a bucket whose
// reports carry no request for BucketIdle gets an abandon action; one in
// use is refreshed before its TTL ends.
func TestIdleBucketsAreAbandonedAndLiveOnesRefreshed(t *testing.T) {
	h := newHarness(t, Options{BucketIdle: 10 * time.Second}, testRules)
	c := h.open()
	idle := map[string]string{"name": "free"}
	c.report("web", usage(api, 0, 1, 0), usage(idle, 0, 1, 0))
	for i := 0; i < 24; i++ { // 12 s
		h.clock.Advance(500 * time.Millisecond)
		if i%2 == 1 {
			us := []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(api, 1, 10, 0)}
			if c.strategy(idle) != "abandon" { // Envoy erases an abandoned bucket
				us = append(us, usage(idle, 1, 0, 0))
			}
			c.report("web", us...)
		}
		h.server.Tick(context.Background())
		if exp := c.expires[bucketKey(api)]; h.clock.Now() >= exp {
			t.Fatalf("at %v the api assignment expired (at %v) without a refresh", h.clock.Now(), exp)
		}
	}
	if got := c.strategy(idle); got != "abandon" {
		t.Errorf("the idle bucket's last action is %q, want abandon", got)
	}
	if got := c.strategy(api); got == "abandon" {
		t.Errorf("the bucket in use was abandoned")
	}
}

// FuzzReport: any bytes decoded as a usage report, from several streams,
// never panic and never make the assignments exceed the limit.
func FuzzReport(f *testing.F) {
	seed, _ := proto.Marshal(&rlqspb.RateLimitQuotaUsageReports{Domain: "web", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(api, 0, 1, 0)}})
	f.Add(seed, seed)
	big, _ := proto.Marshal(&rlqspb.RateLimitQuotaUsageReports{Domain: "web", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(api, -5, math.MaxUint64, 3), usage(nil, 9, 1, 1)}})
	f.Add(big, seed)
	f.Add([]byte{}, []byte{0x12, 0x00})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		h := newHarness(t, Options{}, testRules)
		h.server.learnUntil = 0
		ca, cb := h.open(), h.open()
		for i := 0; i < 6; i++ {
			for _, x := range []struct {
				c    *client
				data []byte
			}{{ca, a}, {cb, b}} {
				var m rlqspb.RateLimitQuotaUsageReports
				if proto.Unmarshal(x.data, &m) == nil {
					x.c.stream.Report(&m)
				}
			}
			h.clock.Advance(500 * time.Millisecond)
			h.server.Tick(context.Background())
			total := ca.costOf(api, 1) + cb.costOf(api, 1)
			if total > 400+2*4 { // a cut may not have reached the client yet
				t.Fatalf("assignments admit %v per second on a limit of 400", total)
			}
		}
	})
}
