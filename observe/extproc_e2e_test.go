package observe

import (
	"context"
	"testing"
	"time"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/leapgate/leapgate/breaker"
	"github.com/leapgate/leapgate/internal/envoyhdr"
)

// shouldRateLimit asks the rate-limit service over gRPC, as Envoy's stage-1
// breaker filter does, for one descriptor.
func (e *breakerEnv) shouldRateLimit(kv ...string) *rlsv3.RateLimitResponse {
	e.t.Helper()
	d := &rlcommonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	resp, err := rlsv3.NewRateLimitServiceClient(e.conn).ShouldRateLimit(context.Background(),
		&rlsv3.RateLimitRequest{Domain: "breaker", Descriptors: []*rlcommonv3.RateLimitDescriptor{d}})
	if err != nil {
		e.t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// expectCode checks the overall code and, when refused, the circuit-open
// header and the time until the breaker admits again.
func (e *breakerEnv) expectCode(resp *rlsv3.RateLimitResponse, want rlsv3.RateLimitResponse_Code, reset time.Duration) {
	e.t.Helper()
	if resp.GetOverallCode() != want {
		e.t.Fatalf("overall code %v, want %v (%v)", resp.GetOverallCode(), want, resp)
	}
	if want != rlsv3.RateLimitResponse_OVER_LIMIT {
		return
	}
	reason := ""
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == envoyhdr.ReasonHeader {
			reason = h.GetValue()
		}
	}
	if reason != envoyhdr.ReasonCircuitOpen {
		e.t.Errorf("%s = %q, want %q", envoyhdr.ReasonHeader, reason, envoyhdr.ReasonCircuitOpen)
	}
	if got := resp.GetStatuses()[0].GetDurationUntilReset().AsDuration(); got != reset {
		e.t.Errorf("duration_until_reset = %v, want %v", got, reset)
	}
}

// TestBreakerEndToEnd drives the breaker of (route checkout, cluster
// backend) through its whole cycle over real gRPC: slow ext_proc timings
// open it, ShouldRateLimit answers OVER_LIMIT with circuit-open, the
// half-open probes are admitted (and no more), their fast timings close it.
func TestBreakerEndToEnd(t *testing.T) {
	e := newBreakerEnv(t)
	desc := []string{"route", "checkout", "destination_cluster", "backend"}
	e.expectCode(e.shouldRateLimit(desc...), rlsv3.RateLimitResponse_OK, 0)

	e.observeRequest("checkout", "backend", 400*time.Millisecond, "200")
	e.observeRequest("checkout", "backend", 300*time.Millisecond, "200")
	e.expectCode(e.shouldRateLimit(desc...), rlsv3.RateLimitResponse_OVER_LIMIT, 5*time.Second)
	e.clock.Advance(2 * time.Second)
	e.expectCode(e.shouldRateLimit(desc...), rlsv3.RateLimitResponse_OVER_LIMIT, 3*time.Second)

	// Half-open: two probes pass, the third is told when a retry surely
	// passes: the oldest probe's timeout (2s), then a reopened open_duration
	// (5s).
	e.clock.Advance(3 * time.Second)
	e.expectCode(e.shouldRateLimit(desc...), rlsv3.RateLimitResponse_OK, 0)
	e.expectCode(e.shouldRateLimit(desc...), rlsv3.RateLimitResponse_OK, 0)
	e.expectCode(e.shouldRateLimit(desc...), rlsv3.RateLimitResponse_OVER_LIMIT, 7*time.Second)
	if st := e.stats(slowRule); st.State != breaker.HalfOpen || st.ProbesAdmitted != 2 {
		t.Fatalf("half-open: %+v", st.Stats)
	}

	// The probes go upstream and are fast: closed, fresh window.
	e.observeRequest("checkout", "backend", 30*time.Millisecond, "200")
	e.observeRequest("checkout", "backend", 40*time.Millisecond, "200")
	e.expectCode(e.shouldRateLimit(desc...), rlsv3.RateLimitResponse_OK, 0)
	if st := e.stats(slowRule); st.State != breaker.Closed || st.Total != 0 {
		t.Fatalf("after the probes: %+v", st.Stats)
	}
}

// TestBreakerEndToEndProbeFailure shows a failing probe, reported through
// the access log, reopening the breaker for a fresh open_duration, and a
// lost probe timing out.
func TestBreakerEndToEndProbeFailure(t *testing.T) {
	e := newBreakerEnv(t)
	desc := []string{"destination_cluster", "orders"}
	als, err := accesslogv3.NewAccessLogServiceClient(e.conn).StreamAccessLogs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	send := func(code uint32) {
		t.Helper()
		err := als.Send(&accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{
			HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: []*accesslogdatav3.HTTPAccessLogEntry{
				httpEntry("", "orders", code, time.Millisecond, time.Millisecond, nil)}}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	before := observations(t, e, breaker.SourceALS)
	send(503)
	send(500)
	e.eventually("two access-log entries", func() bool { return observations(t, e, breaker.SourceALS) == before+2 })
	e.expectCode(e.shouldRateLimit(desc...), rlsv3.RateLimitResponse_OVER_LIMIT, 5*time.Second)

	e.clock.Advance(5 * time.Second)
	e.expectCode(e.shouldRateLimit(desc...), rlsv3.RateLimitResponse_OK, 0) // the probe
	send(502)                                                               // fails
	e.eventually("the probe result", func() bool { return e.stats(ordersRule).State == breaker.Open })
	e.expectCode(e.shouldRateLimit(desc...), rlsv3.RateLimitResponse_OVER_LIMIT, 5*time.Second)

	// The next probe never reports: after probe_timeout (default 5s) the
	// breaker reopens instead of sticking in half-open.
	e.clock.Advance(5 * time.Second)
	e.expectCode(e.shouldRateLimit(desc...), rlsv3.RateLimitResponse_OK, 0)
	// Slot taken: a retry surely passes after the timeout and a reopened
	// open_duration.
	e.expectCode(e.shouldRateLimit(desc...), rlsv3.RateLimitResponse_OVER_LIMIT, 10*time.Second)
	e.clock.Advance(5 * time.Second)
	e.expectCode(e.shouldRateLimit(desc...), rlsv3.RateLimitResponse_OVER_LIMIT, 5*time.Second)
	if st := e.stats(ordersRule); st.State != breaker.Open {
		t.Fatalf("after the lost probe: %+v", st.Stats)
	}
	if _, err := als.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
}
