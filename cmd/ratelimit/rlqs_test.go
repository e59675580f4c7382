package main

import (
	"context"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/rlqs/rlqssim"
)

// TestBinaryRLQSDividesTheLimit: the real binary serves RLQS on its gRPC
// port; a simulated fleet of three Envoy filters (1 s reports, real
// streams, real time) offering 300, 300 and 50 requests per second against
// 400 per second never admits more than the limit in any second once the
// first report interval has passed, uses nearly all of it, and ends near
// the max-min shares (175, 175, 50).
func TestBinaryRLQSDividesTheLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet for 10 s")
	}
	rb := startBinary(t, nil, "RUNTIME_ROOT="+ruleRoot(t, rlqssim.Rules))
	tr, err := rlqssim.DialGRPC(rb.grpcAddr, "")
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	bucket := map[string]string{"name": "api"}
	sc := rlqssim.Scenario{Name: "binary", Domain: "rlqs-sim", Limit: 400, Window: time.Second, Duration: 10 * time.Second,
		Clients: []rlqssim.Client{
			{Name: "a", Bucket: bucket, Load: []rlqssim.Phase{{At: 0, Rate: 300}}, Report: time.Second},
			{Name: "b", Bucket: bucket, Load: []rlqssim.Phase{{At: 0, Rate: 300}}, Report: time.Second},
			{Name: "c", Bucket: bucket, Load: []rlqssim.Phase{{At: 0, Rate: 50}}, Report: time.Second},
		}}
	checkBinaryFleet(t, rlqssim.Run(sc, tr))
	rb.stop(t)
}

// TestBinaryRLQSOnTwoReplicas: two binaries on one redis-server
// (BACKEND_TYPE=redis) share the division of the limit. A fleet of four
// simulated filters whose streams alternate between them offers 300, 300,
// 300 and 50 requests per second against 400 per second (1 s reports, real
// time; two replicas dividing alone would admit up to twice the limit).
// At 8 s the second replica is killed: its Envoys reopen their streams on
// the first, and its claim in Redis holds the capacity its assignments may
// still use until the claim's hold ends (2 TTLs and a tick), after which
// the survivor divides the whole limit. The fleet never admits more than
// the limit once the first report interval has passed, before or after
// the kill, and ends near the max-min shares (116.7 × 3, 50).
func TestBinaryRLQSOnTwoReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet for 22 s")
	}
	r := redistest.Start(t)
	root := ruleRoot(t, rlqssim.Rules)
	var transports []rlqssim.Transport
	var binaries []*runningBinary
	for range 2 {
		rb := startBinary(t, nil, "RUNTIME_ROOT="+root, "BACKEND_TYPE=redis", "REDIS_URL="+r.Addr())
		tr, err := rlqssim.DialGRPC(rb.grpcAddr, "")
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		transports = append(transports, tr)
		binaries = append(binaries, rb)
	}
	bucket := map[string]string{"name": "api"}
	client := func(name string, rate float64) rlqssim.Client {
		return rlqssim.Client{Name: name, Bucket: bucket, Load: []rlqssim.Phase{{At: 0, Rate: rate}}, Report: time.Second,
			Expiry: rlqssim.Behavior{Rate: 10}}
	}
	sc := rlqssim.Scenario{Name: "two replicas, one killed at 8 s", Domain: "rlqs-sim", Limit: 400, Window: time.Second, Duration: 22 * time.Second,
		Clients: []rlqssim.Client{client("a", 300), client("b", 300), client("c", 300), client("d", 50)}}
	// The fleet runs in real time from its start: the kill is timed on the
	// wall clock (the simulation's restarts would drop every stream).
	kill := time.AfterFunc(8*time.Second, func() { _ = binaries[1].cmd.Process.Kill() })
	defer kill.Stop()
	checkBinaryFleet(t, rlqssim.Run(sc, rlqssim.NewSpread(transports...)))
}

// checkBinaryFleet holds a fleet's run against real binaries to the
// targets, with the tolerance a loaded 2-core machine needs in real time:
// no protocol error, never more than 1.05 × the limit after the first
// report interval, at least 90 % of the limit used at the end (after a
// replica's death, once its claim is released) and a fairness error of at
// most 10 %.
func checkBinaryFleet(t *testing.T, r rlqssim.Result) {
	t.Helper()
	t.Log(r)
	if len(r.Errors) > 0 {
		t.Errorf("protocol errors: %v", r.Errors)
	}
	if r.PeakSettled > 1.05 {
		t.Errorf("peak %.3f × the limit after the first report interval, want at most 1.05", r.PeakSettled)
	}
	if r.UsedLast < 0.9 {
		t.Errorf("the fleet used %.1f %% of the limit at the end, want at least 90 %%", 100*r.UsedLast)
	}
	if r.FairnessError > 0.1 {
		t.Errorf("fairness error %.1f %%, want at most 10 %%", 100*r.FairnessError)
	}
}

// TestBinaryRLQSLenientReports: Envoy's first report (time_elapsed 0),
// an empty heartbeat and a report without a domain on the real binary
// are answered, not refused.
func TestBinaryRLQSLenientReports(t *testing.T) {
	rb := startBinary(t, nil, "RUNTIME_ROOT="+ruleRoot(t, rlqssim.Rules))
	rb.dial(t)
	tr, err := rlqssim.DialGRPC(rb.grpcAddr, "")
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	got := make(chan *rlqspb.RateLimitQuotaResponse, 10)
	conn, err := tr.Open(func(m *rlqspb.RateLimitQuotaResponse) { got <- m })
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, m := range []*rlqspb.RateLimitQuotaUsageReports{
		{},
		{Domain: "rlqs-sim"},
		{BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId: &rlqspb.BucketId{Bucket: map[string]string{"name": "api"}}, TimeElapsed: &durationpb.Duration{}, NumRequestsAllowed: 1}}},
	} {
		if err := conn.Report(m); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		tr.Tick(0)
		select {
		case m := <-got:
			a := m.GetBucketAction()[0]
			if a.GetBucketId().GetBucket()["name"] != "api" || a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
				t.Fatalf("first answer %v, want a token bucket for name=api", m)
			}
			if ttl := a.GetQuotaAssignmentAction().GetAssignmentTimeToLive(); ttl.GetSeconds() < 1 || ttl.GetNanos() != 0 {
				t.Fatalf("TTL %v, want whole seconds", ttl)
			}
			return
		case <-ctx.Done():
			t.Fatal("no answer to the first report")
		case <-time.After(10 * time.Millisecond):
		}
	}
}
