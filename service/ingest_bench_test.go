package service

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/leapgate/leapgate/breaker"
	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/window"
)

// BenchmarkExtProcObservability measures observability-mode ext_proc
// streams absorbed per second over real gRPC on loopback (client and
// server on the same machine): each stream carries request headers and
// response headers and is closed by the server. "orders" feeds an
// error_ratio breaker (no timer); "checkout" a slow_request_ratio breaker,
// which arms the in-flight timer and its receiving goroutine.
func BenchmarkExtProcObservability(b *testing.B) {
	for _, bc := range []struct{ name, route, cluster string }{
		{"error_breaker", "", "orders"},
		{"slow_breaker_timer", "checkout", "backend"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			e := startBreakerEnv(b, true)
			client := e.extProc()
			reqH := requestHeaders(bc.route, bc.cluster, true)
			respH := responseHeaders("200", true)
			b.ReportAllocs()
			b.SetParallelism(16) // Envoy keeps many streams in flight
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					stream, err := client.Process(context.Background())
					if err != nil {
						b.Error(err)
						return
					}
					if err := stream.Send(reqH); err != nil {
						b.Error(err)
						return
					}
					if err := stream.Send(respH); err != nil {
						b.Error(err)
						return
					}
					if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
						b.Errorf("Recv: %v", err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "streams/s")
			b.StopTimer()
			if got := observations(b, e, breaker.SourceExtProc); got != float64(b.N) {
				b.Errorf("observed %v of %d streams", got, b.N)
			}
		})
	}
}

// BenchmarkAccessLogEntries measures access-log entries absorbed per second
// over real gRPC on loopback, in batches of 100 entries per message (each
// feeding one breaker).
func BenchmarkAccessLogEntries(b *testing.B) {
	e := startBreakerEnv(b, true)
	const batch = 100
	entries := make([]*accesslogdatav3.HTTPAccessLogEntry, batch)
	for i := range entries {
		entries[i] = httpEntry("", "orders", 200, time.Millisecond, 2*time.Millisecond, nil)
	}
	msg := &accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{
		HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: entries}}}
	stream, err := accesslogv3.NewAccessLogServiceClient(e.conn).StreamAccessLogs(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		if err := stream.Send(msg); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := stream.CloseAndRecv(); err != nil { // waits until all are absorbed
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N*batch)/time.Since(start).Seconds(), "entries/s")
}

const breakerBenchRules = `
domain: bench
descriptors:
  - key: route
    value: checkout
    descriptors:
      - key: destination_cluster
        value: backend
        rate_limit: {unit: second, requests_per_unit: 4000000000}
        circuit_breaker: {strategy: slow_request_ratio, threshold: 0.5, max_response_time: 100ms}
  - key: destination_cluster
    circuit_breaker: {strategy: error_ratio, threshold: 0.5}
`

// BenchmarkShouldRateLimitBreakerCost measures what consulting a closed
// breaker adds to ShouldRateLimit (in-process, monotonic clock): the same
// requests with Options.Breakers nil and with a breaker.Registry.
//   - limit_and_breaker: descriptor (route, destination_cluster) with a rate
//     limit and a circuit_breaker;
//   - breaker_only: a value-less destination_cluster rule carrying only a
//     circuit_breaker (one breaker per cluster), the stage-1 descriptor.
func BenchmarkShouldRateLimitBreakerCost(b *testing.B) {
	set, err := descriptors.Parse([]descriptors.File{{Name: "bench.yaml", Data: []byte(breakerBenchRules)}})
	if err != nil {
		b.Fatal(err)
	}
	mkReq := func(kv ...string) *rlsv3.RateLimitRequest {
		d := &rlcommonv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &rlcommonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		return &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommonv3.RateLimitDescriptor{d}}
	}
	for _, rc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
	}{
		{"limit_and_breaker", mkReq("route", "checkout", "destination_cluster", "backend")},
		{"breaker_only", mkReq("destination_cluster", "orders")},
	} {
		for _, withBreakers := range []bool{false, true} {
			name := rc.name + "/without_breakers"
			if withBreakers {
				name = rc.name + "/with_breakers"
			}
			b.Run(name, func(b *testing.B) {
				clock := window.NewMonotonicClock()
				opts := Options{Limiter: window.NewStore(clock), Registry: prometheus.NewRegistry()}
				if withBreakers {
					reg, err := breaker.NewRegistry(breaker.Options{Clock: clock, Metrics: prometheus.NewRegistry()})
					if err != nil {
						b.Fatal(err)
					}
					if err := reg.SetRules(set); err != nil {
						b.Fatal(err)
					}
					reg.Observe(breaker.Observation{Cluster: "orders", Status: 200}) // creates the per-value breaker
					opts.Breakers = reg
				}
				svc, err := New(opts)
				if err != nil {
					b.Fatal(err)
				}
				svc.SetRules(set)
				ctx := context.Background()
				var refused atomic.Int64
				b.ReportAllocs()
				for b.Loop() {
					resp, err := svc.ShouldRateLimit(ctx, rc.req)
					if err != nil {
						b.Fatal(err)
					}
					if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
						refused.Add(1)
					}
				}
				if refused.Load() > 0 {
					b.Fatalf("%d refused", refused.Load())
				}
			})
		}
	}
}
