package observe

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"

	"github.com/leapgate/leapgate/breaker"
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
