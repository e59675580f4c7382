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

// A mesh that feeds both ext_proc and the access-log service reports each
// request twice; with Envoy's x-request-id the breaker counts it once.
func TestBothFeedsCountARequestOnce(t *testing.T) {
	e := newBreakerEnv(t)
	// ext_proc reports request r1 (a 503).
	stream, err := e.extProc().Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(requestHeaders("", "orders", true, RequestIDHeader, "r1")); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Millisecond)
	if err := stream.Send(responseHeaders("503", true)); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv = %v, want EOF", err)
	}
	if st := e.stats(ordersRule); st.Total != 1 {
		t.Fatalf("after ext_proc: %+v", st.Stats)
	}

	als, err := accesslogv3.NewAccessLogServiceClient(e.conn).StreamAccessLogs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	before := observations(t, e, breaker.SourceALS)
	for _, id := range []string{"r1", "r2", ""} { // r1 again: the same request
		entry := httpEntry("", "orders", 503, time.Millisecond, time.Millisecond, nil)
		entry.Request.RequestId = id
		err := als.Send(&accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{
			HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: []*accesslogdatav3.HTTPAccessLogEntry{entry}}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	e.eventually("three access-log entries", func() bool { return observations(t, e, breaker.SourceALS) == before+3 })
	// r1 once, r2, and the entry without an ID: 3 requests, not 4.
	if st := e.stats(ordersRule); st.Total != 3 {
		t.Errorf("after both feeds: %+v, want 3 requests counted", st.Stats)
	}
	if got := gatheredTotal(t, e, "leapgate_breaker_duplicate_observations_total"); got != 1 {
		t.Errorf("duplicates = %v, want 1", got)
	}
}

// gatheredTotal is the value of an unlabelled counter of e's registry.
func gatheredTotal(t *testing.T, e *breakerEnv, name string) float64 {
	t.Helper()
	families, err := e.prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}
