package observe

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/leapgate/leapgate/breaker"
)

// A latency_percentile breaker (p90 above 100 ms) fed by both Envoy feeds
// over real gRPC: ext_proc timings and access-log entries count alike, and
// the breaker opens on the request that moves the p90, not before.
func TestLatencyPercentileThroughBothFeeds(t *testing.T) {
	e := newBreakerEnv(t)
	for range 9 { // fast, via ext_proc
		stream, err := e.extProc().Process(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(requestHeaders("", "tail", true)); err != nil {
			t.Fatal(err)
		}
		e.nextTimer() // the handler has taken t0 once it arms the slow timer
		e.clock.Advance(20 * time.Millisecond)
		if err := stream.Send(responseHeaders("200", true)); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("Recv = %v, want EOF", err)
		}
	}
	als, err := accesslogv3.NewAccessLogServiceClient(e.conn).StreamAccessLogs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	slow := func() {
		t.Helper()
		before := observations(t, e, breaker.SourceALS)
		err := als.Send(&accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{
			HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: []*accesslogdatav3.HTTPAccessLogEntry{
				httpEntry("", "tail", 200, 500*time.Millisecond, 500*time.Millisecond, nil)}}}})
		if err != nil {
			t.Fatal(err)
		}
		e.eventually("the access-log entry", func() bool { return observations(t, e, breaker.SourceALS) == before+1 })
	}
	slow() // 1 slow of 10: the 9th smallest (p90) is 20 ms
	if st := e.stats(tailRule); st.State != breaker.Closed || st.Total != 10 {
		t.Fatalf("p90 at 20ms: %+v", st.Stats)
	}
	e.expectCode(e.shouldRateLimit("destination_cluster", "tail"), rlsv3.RateLimitResponse_OK, 0)
	slow() // 2 slow of 11: the 10th smallest is 500 ms
	if st := e.stats(tailRule); st.State != breaker.Open {
		t.Fatalf("p90 at 500ms did not open: %+v", st.Stats)
	}
	e.expectCode(e.shouldRateLimit("destination_cluster", "tail"), rlsv3.RateLimitResponse_OVER_LIMIT, 5*time.Second)
}

// Manual overrides apply to ext_proc's blocking mode too: a forced-open
// breaker answers 503 there, a disabled one lets the request through.
func TestOverridesInBlockingMode(t *testing.T) {
	e := newBreakerEnv(t)
	if resp := blockingRequest(t, e, "orders"); resp.GetImmediateResponse() != nil {
		t.Fatalf("closed breaker refused: %v", resp)
	}
	e.reg.SetOverride(ordersRule, "", breaker.ForceOpen)
	if resp := blockingRequest(t, e, "orders"); resp.GetImmediateResponse() == nil {
		t.Fatalf("forced-open breaker admitted: %v", resp)
	}
	e.reg.SetOverride(ordersRule, "", breaker.Disabled)
	if resp := blockingRequest(t, e, "orders"); resp.GetImmediateResponse() != nil {
		t.Fatalf("disabled breaker refused: %v", resp)
	}
}
