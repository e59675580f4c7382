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
	"github.com/leapgate/leapgate/internal/envoyhdr"
)

// probeHeader returns the probe ids a rate-limit answer gives the request
// in request_headers_to_add, "" for none.
func probeHeader(resp *rlsv3.RateLimitResponse) string {
	for _, h := range resp.GetRequestHeadersToAdd() {
		if h.GetKey() == envoyhdr.ProbeHeader {
			return h.GetValue()
		}
	}
	return ""
}

// accessLogger returns a function that sends one access-log entry for the
// cluster (with the probe ids, if any, in the x-leapgate-probe header the
// log records) and waits until the service has taken it.
func accessLogger(t *testing.T, e *breakerEnv, cluster string) func(status uint32, probe string) {
	t.Helper()
	als, err := accesslogv3.NewAccessLogServiceClient(e.conn).StreamAccessLogs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return func(status uint32, probe string) {
		t.Helper()
		sent := observations(t, e, breaker.SourceALS) + 1
		entry := httpEntry("", cluster, status, time.Millisecond, time.Millisecond, nil)
		if probe != "" {
			entry.Request.RequestHeaders[envoyhdr.ProbeHeader] = probe
		}
		if err := als.Send(&accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{
			HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: []*accesslogdatav3.HTTPAccessLogEntry{entry}}}}); err != nil {
			t.Fatal(err)
		}
		e.eventually("the access-log entry", func() bool { return observations(t, e, breaker.SourceALS) == sent })
	}
}

// TestProbeAttributionEndToEnd: a half-open breaker's probe, admitted by
// the rate-limit answer, carries its id in x-leapgate-probe; the access-log
// entry that brings the id back decides, and once the feed has delivered
// ids a straggler's failure is never taken for the probe. ext_proc reads the
// header from the request it sees.
func TestProbeAttributionEndToEnd(t *testing.T) {
	e := newBreakerEnv(t)
	log := accessLogger(t, e, "orders")
	expectState := func(want breaker.State) {
		t.Helper()
		if st := e.stats(ordersRule); st.State != want {
			t.Fatalf("orders breaker %v, want %v: %+v", st.State, want, st.Stats)
		}
	}
	openThenProbe := func() string {
		t.Helper()
		log(503, "")
		log(503, "")
		expectState(breaker.Open)
		if id := probeHeader(e.shouldRateLimit("destination_cluster", "orders")); id != "" {
			t.Fatalf("an open breaker's refusal carries probe %q", id)
		}
		e.clock.Advance(5 * time.Second) // open_duration
		resp := e.shouldRateLimit("destination_cluster", "orders")
		e.expectCode(resp, rlsv3.RateLimitResponse_OK, 0)
		id := probeHeader(resp)
		if len(envoyhdr.ParseProbes(id)) != 1 {
			t.Fatalf("the probe's answer adds %s: %q, want one id (headers %v)", envoyhdr.ProbeHeader, id, resp.GetRequestHeadersToAdd())
		}
		expectState(breaker.HalfOpen)
		return id
	}

	// First cycle: the probe's tagged success closes the breaker, and the
	// access-log feed is now known to carry ids.
	log(200, openThenProbe())
	expectState(breaker.Closed)
	if id := probeHeader(e.shouldRateLimit("destination_cluster", "orders")); id != "" {
		t.Fatalf("a closed breaker's answer carries probe %q", id)
	}

	// Second cycle: a straggler admitted before the breaker opened fails
	// while the probe is out. It is not the probe: the breaker stays
	// half-open until the probe's own (tagged) result.
	probe := openThenProbe()
	log(503, "")
	expectState(breaker.HalfOpen)
	log(503, "0123abcd") // an id of no outstanding probe
	expectState(breaker.HalfOpen)
	log(200, probe)
	expectState(breaker.Closed)

	// Through ext_proc: the request it sees carries the header the
	// rate-limit filter added.
	probe = openThenProbe()
	stream, err := e.extProc().Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(requestHeaders("", "orders", true, envoyhdr.ProbeHeader, probe)); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(responseHeaders("200", true)); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv = %v, want EOF", err)
	}
	expectState(breaker.Closed)
}

// TestBackoffThroughTheAccessLog: each probe that fails, as the access log
// reports it, doubles the open period up to max_open_duration, as the
// rate-limit answer's retry hint shows; a full close resets it.
func TestBackoffThroughTheAccessLog(t *testing.T) {
	e := newBreakerEnv(t)
	log := accessLogger(t, e, "backoff")
	refusedFor := func(want time.Duration) {
		t.Helper()
		e.expectCode(e.shouldRateLimit("destination_cluster", "backoff"), rlsv3.RateLimitResponse_OVER_LIMIT, want)
	}
	probe := func() string {
		t.Helper()
		resp := e.shouldRateLimit("destination_cluster", "backoff")
		e.expectCode(resp, rlsv3.RateLimitResponse_OK, 0)
		return probeHeader(resp)
	}

	log(503, "")
	refusedFor(5 * time.Second)
	for _, next := range []time.Duration{10 * time.Second, 20 * time.Second, 20 * time.Second} {
		e.clock.Advance(e.stats(backoffRule).RetryAfter)
		log(503, probe()) // the probe fails: reopened for longer
		refusedFor(next)
	}
	e.clock.Advance(20 * time.Second)
	log(200, probe()) // closes
	if st := e.stats(backoffRule); st.State != breaker.Closed {
		t.Fatalf("after the probe succeeded: %+v", st)
	}
	log(503, "")
	refusedFor(5 * time.Second) // the backoff starts over
}

// TestRampThroughTheAccessLog: a breaker with ramp_duration that closes on
// its probe's reported success lets through a rising share of rate-limit
// requests, and all of them once the ramp is over.
func TestRampThroughTheAccessLog(t *testing.T) {
	e := newBreakerEnv(t)
	log := accessLogger(t, e, "ramp")
	admitted := func(n int) int {
		t.Helper()
		ok := 0
		for range n {
			if e.shouldRateLimit("destination_cluster", "ramp").GetOverallCode() == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		return ok
	}

	log(503, "")
	e.clock.Advance(5 * time.Second)
	resp := e.shouldRateLimit("destination_cluster", "ramp")
	e.expectCode(resp, rlsv3.RateLimitResponse_OK, 0)
	log(200, probeHeader(resp)) // closes: the ramp starts
	if st := e.stats(rampRule); st.State != breaker.Closed {
		t.Fatalf("after the probe: %+v", st)
	}
	e.clock.Advance(2 * time.Second) // 20% into the ramp
	if n := admitted(100); n < 19 || n > 21 {
		t.Errorf("at 20%% of the ramp %d of 100 admitted, want 20", n)
	}
	e.clock.Advance(5 * time.Second) // 70%
	if n := admitted(100); n < 69 || n > 71 {
		t.Errorf("at 70%% of the ramp %d of 100 admitted, want 70", n)
	}
	e.clock.Advance(3 * time.Second) // the ramp is over
	if n := admitted(100); n != 100 {
		t.Errorf("after the ramp %d of 100 admitted, want all", n)
	}
}

// TestProbeMixedFleet: some Envoys forward x-leapgate-probe and others do
// not. A breaker whose probe came back tagged through the access-log feed
// (orders) says nothing about another breaker fed by an Envoy that drops
// the header (backoff): that one still takes its untagged probe's success
// as the probe's result and closes, rather than waiting for probe_timeout
// and reopening for a doubled period while the upstream is healthy.
func TestProbeMixedFleet(t *testing.T) {
	e := newBreakerEnv(t)
	forwards, drops := accessLogger(t, e, "orders"), accessLogger(t, e, "backoff")
	state := func(rule string) breaker.State { return e.stats(rule).State }
	probe := func(cluster string) string {
		t.Helper()
		resp := e.shouldRateLimit("destination_cluster", cluster)
		e.expectCode(resp, rlsv3.RateLimitResponse_OK, 0)
		return probeHeader(resp)
	}

	forwards(503, "")
	forwards(503, "")
	drops(503, "")
	if state(ordersRule) != breaker.Open || state(backoffRule) != breaker.Open {
		t.Fatalf("orders %v, backoff %v, want both open", state(ordersRule), state(backoffRule))
	}
	e.clock.Advance(5 * time.Second) // both open_durations
	forwards(200, probe("orders"))
	if got := state(ordersRule); got != breaker.Closed {
		t.Fatalf("orders after its tagged probe succeeded: %v, want closed", got)
	}
	probe("backoff")
	if got := state(backoffRule); got != breaker.HalfOpen {
		t.Fatalf("backoff after its probe was admitted: %v, want half-open", got)
	}
	drops(200, "") // the same feed, an Envoy that does not log the header
	if got := state(backoffRule); got != breaker.Closed {
		t.Fatalf("backoff after its untagged probe succeeded: %v, want closed", got)
	}
}

// TestExtProcTagsItsProbes: in blocking mode ext_proc admits a half-open
// breaker's probe itself and tags the probe's outcome with its id, so that
// once a tagged outcome came back, the failure of a request admitted
// before the breaker opened (a straggler, untagged) is not taken for the
// probe's.
func TestExtProcTagsItsProbes(t *testing.T) {
	e := newBreakerEnv(t)
	expectState := func(what string, want breaker.State) {
		t.Helper()
		if st := e.stats(ordersRule); st.State != want {
			t.Fatalf("%s: orders breaker %v, want %v: %+v", what, st.State, want, st.Stats)
		}
	}
	// admit starts a blocking-mode request that ext_proc lets through, and
	// returns a function that ends it with a response status.
	admit := func(what string) func(status string) {
		t.Helper()
		stream, err := e.extProc().Process(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(requestHeaders("", "orders", false)); err != nil {
			t.Fatal(err)
		}
		if resp, err := stream.Recv(); err != nil || resp.GetRequestHeaders() == nil {
			t.Fatalf("%s: reply %v, %v; want CONTINUE", what, resp, err)
		}
		return func(status string) {
			t.Helper()
			if err := stream.Send(responseHeaders(status, false)); err != nil {
				t.Fatal(err)
			}
			if _, err := stream.Recv(); err != nil {
				t.Fatal(err)
			}
			if err := stream.CloseSend(); err != nil {
				t.Fatal(err)
			}
			if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
				t.Fatalf("%s: end of stream: %v", what, err)
			}
		}
	}
	open := func() {
		t.Helper()
		e.observeRequest("", "orders", time.Millisecond, "503")
		e.observeRequest("", "orders", time.Millisecond, "503")
		expectState("two failures", breaker.Open)
		e.clock.Advance(5 * time.Second) // open_duration
	}

	open()
	admit("the first probe")("200") // tagged: ext_proc's outcomes carry ids
	expectState("the first probe succeeded", breaker.Closed)

	straggler := admit("a request while closed")
	open()
	probe := admit("the second probe")
	expectState("the probe is out", breaker.HalfOpen)
	straggler("503")
	expectState("the straggler failed", breaker.HalfOpen)
	probe("200")
	expectState("the second probe succeeded", breaker.Closed)
}
