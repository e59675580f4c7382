package rlqs

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/ruletest"
	"github.com/leapgate/leapgate/internal/testclock"
)

// benchFleet is streams × buckets: every stream reports on the buckets
// {user: u0} … {user: u<buckets-1>} of a 600 per minute limit per user, so
// each of the buckets pools is shared by every stream.
type benchFleet struct {
	server  *Server
	clock   *testclock.Clock
	streams []*Stream
	reports []*rlqspb.RateLimitQuotaUsageReports
}

func newBenchFleet(b *testing.B, streams, buckets int) *benchFleet {
	b.Helper()
	f := &benchFleet{clock: testclock.At(time.Hour)}
	s, err := New(Options{Clock: f.clock, MaxBucketsPerDomain: streams * buckets})
	if err != nil {
		b.Fatal(err)
	}
	s.SetRules(ruletest.Parse(b, descriptors.Options{}, testRules))
	s.learnUntil = 0
	f.server = s
	var ids []*rlqspb.BucketId
	for j := 0; j < buckets; j++ {
		ids = append(ids, &rlqspb.BucketId{Bucket: map[string]string{"user": fmt.Sprint("u", j)}})
	}
	for i := 0; i < streams; i++ {
		f.streams = append(f.streams, s.Open(func(*rlqspb.RateLimitQuotaResponse) {}))
		r := &rlqspb.RateLimitQuotaUsageReports{Domain: "web"}
		for _, id := range ids {
			r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId: id, TimeElapsed: &durationpb.Duration{Seconds: 1}, NumRequestsAllowed: uint64(1 + i%7), NumRequestsDenied: uint64(i % 3)})
		}
		f.reports = append(f.reports, r)
	}
	for i, st := range f.streams {
		st.Report(f.reports[i])
	}
	return f
}

// BenchmarkReport is one stream's report of 100 buckets on a fleet of
// 1,000 streams × 100 buckets: the server's CPU per report.
func BenchmarkReport(b *testing.B) {
	f := newBenchFleet(b, 1000, 100)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		f.clock.Advance(time.Millisecond)
		f.streams[i%len(f.streams)].Report(f.reports[i%len(f.streams)])
	}
}

// BenchmarkTick is one allocation tick over 1,000 streams × 100 buckets
// (100 pools of 1,000 clients each), every stream having reported in the
// last second: it must stay well under RLQS_TICK.
func BenchmarkTick(b *testing.B) {
	f := newBenchFleet(b, 1000, 100)
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		f.clock.Advance(500 * time.Millisecond)
		for i, st := range f.streams {
			st.Report(f.reports[i])
		}
		b.StartTimer()
		f.server.Tick(context.Background())
	}
}

// BenchmarkMemory reports the heap the server holds per stream (with its
// 100 buckets) and per bucket, on 1,000 streams × 100 buckets.
func BenchmarkMemory(b *testing.B) {
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		f := newBenchFleet(b, 1000, 100)
		f.server.Tick(context.Background())
		f.reports = nil // the reports are the client's; the ids they share stay referenced by the buckets
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/1000, "B/stream")
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/100_000, "B/bucket")
		runtime.KeepAlive(f)
	}
}
