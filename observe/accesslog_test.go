package observe

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/leapgate/leapgate/breaker"
)

// httpEntry builds an access-log entry; ttfb < 0 leaves it out.
func httpEntry(route, cluster string, code uint32, ttfb, duration time.Duration, flags *accesslogdatav3.ResponseFlags) *accesslogdatav3.HTTPAccessLogEntry {
	e := &accesslogdatav3.HTTPAccessLogEntry{
		CommonProperties: &accesslogdatav3.AccessLogCommon{
			RouteName:       route,
			UpstreamCluster: cluster,
			Duration:        durationpb.New(duration),
			ResponseFlags:   flags,
		},
		Request:  &accesslogdatav3.HTTPRequestProperties{RequestHeaders: map[string]string{"X-User-Id": "bob"}},
		Response: &accesslogdatav3.HTTPResponseProperties{},
	}
	if ttfb >= 0 {
		e.CommonProperties.TimeToFirstUpstreamRxByte = durationpb.New(ttfb)
	}
	if code != 0 {
		e.Response.ResponseCode = wrapperspb.UInt32(code)
	}
	return e
}

func TestAccessLogObservation(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name    string
		entry   *accesslogdatav3.HTTPAccessLogEntry
		skip    bool
		rt      time.Duration
		status  int
		aborted bool
	}{
		{"ttfb counts", httpEntry("api", "backend", 200, 80*ms, 900*ms, nil), false, 80 * ms, 200, false},
		{"no ttfb: duration", httpEntry("api", "backend", 504, -1, 15*time.Second, &accesslogdatav3.ResponseFlags{UpstreamRequestTimeout: true}), false, 15 * time.Second, 504, false},
		{"no response code: aborted", httpEntry("api", "backend", 0, -1, 3*ms, nil), false, 3 * ms, 0, true},
		{"UF", httpEntry("api", "backend", 503, -1, 3*ms, &accesslogdatav3.ResponseFlags{UpstreamConnectionFailure: true}), false, 3 * ms, 503, true},
		{"UC", httpEntry("api", "backend", 503, -1, 3*ms, &accesslogdatav3.ResponseFlags{UpstreamConnectionTermination: true}), false, 3 * ms, 503, true},
		{"UR", httpEntry("api", "backend", 503, 2*ms, 3*ms, &accesslogdatav3.ResponseFlags{UpstreamRemoteReset: true}), false, 2 * ms, 503, true},
		{"UPE", httpEntry("api", "backend", 502, -1, 3*ms, &accesslogdatav3.ResponseFlags{UpstreamProtocolError: true}), false, 3 * ms, 502, true},
		{"LR", httpEntry("api", "backend", 503, -1, 3*ms, &accesslogdatav3.ResponseFlags{LocalReset: true}), false, 3 * ms, 503, true},
		{"DC", httpEntry("api", "backend", 200, 5*ms, 9*ms, &accesslogdatav3.ResponseFlags{DownstreamConnectionTermination: true}), false, 5 * ms, 200, true},
		{"DR", httpEntry("api", "backend", 200, 5*ms, 9*ms, &accesslogdatav3.ResponseFlags{DownstreamRemoteReset: true}), false, 5 * ms, 200, true},
		{"UO overflow is an error status, not an abort", httpEntry("api", "backend", 503, -1, ms, &accesslogdatav3.ResponseFlags{UpstreamOverflow: true}), false, ms, 503, false},
		{"RL skipped", httpEntry("api", "backend", 503, -1, ms, &accesslogdatav3.ResponseFlags{RateLimited: true}), true, 0, 0, false},
		{"RLSE skipped", httpEntry("api", "backend", 500, -1, ms, &accesslogdatav3.ResponseFlags{RateLimitServiceError: true}), true, 0, 0, false},
		{"FI skipped", httpEntry("api", "backend", 500, -1, ms, &accesslogdatav3.ResponseFlags{FaultInjected: true}), true, 0, 0, false},
		{"NR skipped", httpEntry("api", "", 404, -1, ms, &accesslogdatav3.ResponseFlags{NoRouteFound: true}), true, 0, 0, false},
		{"UAEX skipped", httpEntry("api", "backend", 403, -1, ms, &accesslogdatav3.ResponseFlags{UnauthorizedDetails: &accesslogdatav3.ResponseFlags_Unauthorized{}}), true, 0, 0, false},
		{"OM skipped", httpEntry("api", "backend", 503, -1, ms, &accesslogdatav3.ResponseFlags{OverloadManager: true}), true, 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obs, ok := accessLogObservation(tt.entry)
			if ok == tt.skip {
				t.Fatalf("ok = %v, want skip %v", ok, tt.skip)
			}
			if tt.skip {
				return
			}
			if obs.ResponseTime != tt.rt || obs.Status != tt.status || obs.Aborted != tt.aborted ||
				obs.Route != "api" || obs.Cluster != tt.entry.GetCommonProperties().GetUpstreamCluster() || obs.Source != breaker.SourceALS {
				t.Errorf("observation %+v", obs)
			}
			if len(obs.Headers) != 1 || obs.Headers[0].Key != "x-user-id" || obs.Headers[0].Value != "bob" {
				t.Errorf("headers %+v", obs.Headers)
			}
		})
	}
	circuit := httpEntry("api", "backend", 503, -1, 0, nil)
	circuit.Response.ResponseCodeDetails = CircuitOpenDetails
	if _, ok := accessLogObservation(circuit); ok {
		t.Error("ext_proc circuit-open reply counted")
	}
	intermediate := httpEntry("api", "backend", 200, 1, 1, nil)
	//lint:ignore SA1019 what an Envoy that still sets the deprecated flag sends
	intermediate.CommonProperties.IntermediateLogEntry = true
	if _, ok := accessLogObservation(intermediate); ok {
		t.Error("intermediate entry counted")
	}
}

func TestAccessLogStream(t *testing.T) {
	e := newBreakerEnv(t)
	stream, err := accesslogv3.NewAccessLogServiceClient(e.conn).StreamAccessLogs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	batch := func(entries ...*accesslogdatav3.HTTPAccessLogEntry) *accesslogv3.StreamAccessLogsMessage {
		return &accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{
			HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: entries}}}
	}
	first := batch(
		httpEntry("checkout", "backend", 200, 150*time.Millisecond, time.Second, nil),
		httpEntry("checkout", "backend", 200, 20*time.Millisecond, time.Second, nil),
		httpEntry("", "orders", 503, time.Millisecond, time.Millisecond, nil),
	)
	first.Identifier = &accesslogv3.StreamAccessLogsMessage_Identifier{Node: &corev3.Node{Id: "envoy-1"}, LogName: "edge"}
	if err := stream.Send(first); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(batch(
		httpEntry("", "orders", 503, -1, 5*time.Millisecond, &accesslogdatav3.ResponseFlags{RateLimited: true}), // skipped
		httpEntry("", "orders", 200, time.Millisecond, time.Millisecond, nil),
	)); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_TcpLogs{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatalf("CloseAndRecv: %v", err)
	}
	if st := e.stats(slowRule); st.State != breaker.Open || st.Failed != 1 || st.Total != 2 {
		t.Errorf("slow breaker: %+v", st.Stats)
	}
	// 1 failed of 2 reaches the 0.5 ratio; the RL entry is not a third.
	if st := e.stats(ordersRule); st.State != breaker.Open || st.Failed != 1 || st.Total != 2 {
		t.Errorf("orders breaker: %+v (the RL entry must not count)", st.Stats)
	}
	if got := observations(t, e, "als"); got != 4 {
		t.Errorf("als observations = %v, want 4", got)
	}
}
