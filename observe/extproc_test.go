package observe

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/leapgate/leapgate/breaker"
	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/envoyhdr"
	"github.com/leapgate/leapgate/internal/ruletest"
	"github.com/leapgate/leapgate/service"
	"github.com/leapgate/leapgate/window"

	"github.com/leapgate/leapgate/internal/testclock"
)

// breakerRules are the circuit-breaker rules of the ingestion tests.
const breakerRules = `
domain: breaker
descriptors:
  - key: route
    value: checkout
    descriptors:
      - key: destination_cluster
        value: backend
        circuit_breaker:
          strategy: slow_request_ratio
          threshold: 0.5
          max_response_time: 100ms
          min_requests: 2
          open_duration: 5s
          half_open_probes: 2
          probe_timeout: 2s
      - key: destination_cluster
        value: dual
        circuit_breaker:
          strategy: slow_request_ratio
          threshold: 0.5
          max_response_time: 300ms
  - key: destination_cluster
    value: dual
    circuit_breaker:
      strategy: slow_request_ratio
      threshold: 0.5
      max_response_time: 100ms
  - key: destination_cluster
    value: orders
    circuit_breaker:
      strategy: error_ratio
      threshold: 0.5
      min_requests: 2
      open_duration: 5s
  - key: user
    circuit_breaker:
      strategy: error_count
      threshold: 1
      open_duration: 5s
  - key: destination_cluster
    value: backoff
    circuit_breaker:
      strategy: error_count
      threshold: 1
      open_duration: 5s
      max_open_duration: 20s
  - key: destination_cluster
    value: ramp
    circuit_breaker:
      strategy: error_count
      threshold: 1
      open_duration: 5s
      ramp_duration: 10s
  - key: destination_cluster
    value: tail
    circuit_breaker:
      strategy: latency_percentile
      threshold: 0.9
      max_response_time: 100ms
      min_requests: 10
      open_duration: 5s
`

const (
	slowRule    = "breaker.route_checkout.destination_cluster_backend"
	ordersRule  = "breaker.destination_cluster_orders"
	userRule    = "breaker.user"
	tailRule    = "breaker.destination_cluster_tail"
	backoffRule = "breaker.destination_cluster_backoff"
	rampRule    = "breaker.destination_cluster_ramp"
)

// The breaker registry is the service's Breakers.
var _ service.Breakers = (*breaker.Registry)(nil)

// armedTimer is one timer the ext_proc handler asked for.
type armedTimer struct {
	d  time.Duration
	ch chan time.Time
}

// breakerEnv is a breaker registry and the ingestion handlers served over
// real gRPC on a loopback port.
type breakerEnv struct {
	t      testing.TB
	clock  *testclock.Clock
	reg    *breaker.Registry
	prom   *prometheus.Registry
	set    *descriptors.Set
	timers chan armedTimer
	conn   *grpc.ClientConn
	svc    *service.Service // the rate-limit service, with reg as its Breakers
}

// newBreakerEnv starts a gRPC server on 127.0.0.1:0 with the ext_proc,
// access-log and rate-limit services, on a clock and timers moved by the
// test. It checks for leaked goroutines when the test ends, after the
// server and connection are closed.
func newBreakerEnv(t *testing.T) *breakerEnv {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs last
	return startBreakerEnv(t, false)
}

// startBreakerEnv starts the server; with realTime it runs on the
// monotonic clock and real timers (benchmarks).
func startBreakerEnv(t testing.TB, realTime bool) *breakerEnv {
	t.Helper()
	e := &breakerEnv{t: t, clock: &testclock.Clock{}, prom: prometheus.NewRegistry(), timers: make(chan armedTimer, 64)}
	e.clock.Advance(time.Hour)
	var clock window.Clock = e.clock
	if realTime {
		clock = window.NewMonotonicClock()
	}
	reg, err := breaker.NewRegistry(breaker.Options{
		Clock:   clock,
		Metrics: e.prom,
		Mapping: breaker.Mapping{Headers: []breaker.HeaderKey{{Header: "x-user-id", Key: "user"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.reg = reg
	e.set = ruletest.Parse(t, descriptors.Options{}, breakerRules)
	if err := reg.SetRules(e.set); err != nil {
		t.Fatal(err)
	}
	after := func(d time.Duration) <-chan time.Time {
		ch := make(chan time.Time, 1)
		e.timers <- armedTimer{d, ch}
		return ch
	}
	if realTime {
		after = nil
	}
	svc, err := service.New(service.Options{Limiter: window.NewStore(window.StoreOptions{Clock: clock}), Registry: e.prom, Breakers: reg, DefaultBuckets: 10})
	if err != nil {
		t.Fatal(err)
	}
	svc.SetRules(e.set)
	e.svc = svc

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, NewExtProc(Options{Registry: reg, Clock: clock, After: after}))
	accesslogv3.RegisterAccessLogServiceServer(srv, NewAccessLog(Options{Registry: reg}))
	rlsv3.RegisterRateLimitServiceServer(srv, svc)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	e.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.conn.Close()
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return e
}

func (e *breakerEnv) extProc() extprocv3.ExternalProcessorClient {
	return extprocv3.NewExternalProcessorClient(e.conn)
}

// stats returns the snapshot of the breakers of rule.
func (e *breakerEnv) stats(rule string) breaker.Snapshot {
	e.t.Helper()
	for _, b := range e.reg.Snapshot() {
		if b.Rule == rule {
			return b
		}
	}
	e.t.Fatalf("no breaker for %s", rule)
	return breaker.Snapshot{}
}

// eventually polls cond (for effects of a stream the test cannot join on,
// such as a cancelled one); it never waits on a window edge.
func (e *breakerEnv) eventually(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// nextTimer returns the next timer the handler armed.
func (e *breakerEnv) nextTimer() armedTimer {
	e.t.Helper()
	select {
	case tm := <-e.timers:
		return tm
	case <-time.After(5 * time.Second):
		e.t.Fatal("no timer armed")
		return armedTimer{}
	}
}

func headerMap(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

func requestHeaders(route, cluster string, observe bool, kv ...string) *extprocv3.ProcessingRequest {
	attrs, err := structpb.NewStruct(map[string]any{AttrRouteName: route, AttrClusterName: cluster})
	if err != nil {
		panic(err)
	}
	return &extprocv3.ProcessingRequest{
		ObservabilityMode: observe,
		Attributes:        map[string]*structpb.Struct{ExtProcFilterName: attrs},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(append([]string{":method", "GET", ":path", "/api"}, kv...)...),
		}},
	}
}

func responseHeaders(statusCode string, observe bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		ObservabilityMode: observe,
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(":status", statusCode, "content-type", "text/plain"),
		}},
	}
}

// observeRequest plays one observability-mode request taking rt with the
// given status, as Envoy does: request headers, response headers, then the
// server closes the stream without a reply.
func (e *breakerEnv) observeRequest(route, cluster string, rt time.Duration, statusCode string) {
	e.t.Helper()
	stream, err := e.extProc().Process(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	if err := stream.Send(requestHeaders(route, cluster, true)); err != nil {
		e.t.Fatal(err)
	}
	if route == "checkout" {
		e.nextTimer() // the handler has taken t0 once it arms the slow timer
	}
	e.clock.Advance(rt)
	if err := stream.Send(responseHeaders(statusCode, true)); err != nil {
		e.t.Fatal(err)
	}
	if msg, err := stream.Recv(); !errors.Is(err, io.EOF) {
		e.t.Fatalf("observability mode: Recv = %v, %v; want no reply and EOF", msg, err)
	}
}

func TestExtProcObservabilityMode(t *testing.T) {
	e := newBreakerEnv(t)
	e.observeRequest("checkout", "backend", 20*time.Millisecond, "200")
	e.observeRequest("checkout", "backend", 100*time.Millisecond, "200") // at the max: not slow
	if st := e.stats(slowRule); st.Failed != 0 || st.Total != 2 || st.State != breaker.Closed {
		t.Fatalf("after fast requests: %+v", st.Stats)
	}
	e.observeRequest("checkout", "backend", 150*time.Millisecond, "200")
	if st := e.stats(slowRule); st.Failed != 1 || st.Total != 3 || st.State != breaker.Closed {
		t.Fatalf("after one slow request: %+v", st.Stats)
	}
	e.observeRequest("checkout", "backend", 101*time.Millisecond, "200")
	if st := e.stats(slowRule); st.State != breaker.Open {
		t.Fatalf("2 of 4 slow did not open: %+v", st.Stats)
	}
	// Status codes reach error breakers through the same path.
	e.observeRequest("", "orders", time.Millisecond, "503")
	e.observeRequest("", "orders", time.Millisecond, "502")
	if st := e.stats(ordersRule); st.State != breaker.Open || st.Failed != 2 {
		t.Fatalf("orders after two 5xx: %+v", st.Stats)
	}
}

func TestExtProcBlockingMode(t *testing.T) {
	e := newBreakerEnv(t)
	// A full exchange: every message gets its CONTINUE.
	stream, err := e.extProc().Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		req  *extprocv3.ProcessingRequest
		want func(*extprocv3.ProcessingResponse) bool
	}{
		{requestHeaders("", "orders", false), func(r *extprocv3.ProcessingResponse) bool { return r.GetRequestHeaders() != nil }},
		{&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("x"), EndOfStream: true}}},
			func(r *extprocv3.ProcessingResponse) bool { return r.GetRequestBody() != nil }},
		{&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}},
			func(r *extprocv3.ProcessingResponse) bool { return r.GetRequestTrailers() != nil }},
		{responseHeaders("503", false), func(r *extprocv3.ProcessingResponse) bool { return r.GetResponseHeaders() != nil }},
		{&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{EndOfStream: true}}},
			func(r *extprocv3.ProcessingResponse) bool { return r.GetResponseBody() != nil }},
		{&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}},
			func(r *extprocv3.ProcessingResponse) bool { return r.GetResponseTrailers() != nil }},
	}
	for i, s := range steps {
		if err := stream.Send(s.req); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil || !s.want(resp) {
			t.Fatalf("step %d: reply %v, %v", i, resp, err)
		}
		if cr := resp.GetRequestHeaders().GetResponse(); cr != nil && cr.GetStatus() != extprocv3.CommonResponse_CONTINUE {
			t.Fatalf("step %d: status %v", i, cr.GetStatus())
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("end of stream: %v", err)
	}
	// A second 503 opens the orders breaker (ratio 0.5, min 2).
	e.observeRequest("", "orders", time.Millisecond, "503")
	if st := e.stats(ordersRule); st.State != breaker.Open {
		t.Fatalf("orders: %+v", st.Stats)
	}
	// Blocking mode now answers request headers with a 503.
	e.clock.Advance(800 * time.Millisecond)
	resp := blockingRequest(t, e, "orders")
	ir := resp.GetImmediateResponse()
	if ir == nil {
		t.Fatalf("reply %v, want an ImmediateResponse", resp)
	}
	got := map[string]string{}
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		got[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
	}
	if ir.GetStatus().GetCode() != typev3.StatusCode_ServiceUnavailable || ir.GetDetails() != CircuitOpenDetails ||
		got["retry-after"] != "5" || got[envoyhdr.ReasonHeader] != envoyhdr.ReasonCircuitOpen {
		t.Errorf("immediate response %v (headers %v); want 503, retry-after 5 (4.2s rounded up), %s", ir, got, envoyhdr.ReasonCircuitOpen)
	}
	// Half-open after open_duration: the probe is let through on its own
	// stream, whose response (200) then closes the breaker.
	e.clock.Advance(4200 * time.Millisecond)
	probe, err := e.extProc().Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := probe.Send(requestHeaders("", "orders", false)); err != nil {
		t.Fatal(err)
	}
	if resp, err := probe.Recv(); err != nil || resp.GetRequestHeaders() == nil {
		t.Fatalf("half-open: reply %v, %v; want CONTINUE", resp, err)
	}
	// A second request finds the only probe slot taken.
	if resp := blockingRequest(t, e, "orders"); resp.GetImmediateResponse() == nil {
		t.Fatalf("second request while half-open: %v, want a 503", resp)
	}
	if err := probe.Send(responseHeaders("200", false)); err != nil {
		t.Fatal(err)
	}
	if resp, err := probe.Recv(); err != nil || resp.GetResponseHeaders() == nil {
		t.Fatalf("response headers: reply %v, %v", resp, err)
	}
	if err := probe.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := probe.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("end of probe stream: %v", err)
	}
	if st := e.stats(ordersRule); st.State != breaker.Closed {
		t.Fatalf("after the probe succeeded: %+v", st.Stats)
	}
	if resp := blockingRequest(t, e, "orders"); resp.GetRequestHeaders() == nil {
		t.Errorf("closed: reply %v, want CONTINUE", resp)
	}
}

// blockingRequest sends blocking-mode request headers for cluster and
// returns the reply, then ends the stream.
func blockingRequest(t testing.TB, e *breakerEnv, cluster string) *extprocv3.ProcessingResponse {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := e.extProc().Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(requestHeaders("", cluster, false)); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestExtProcAbortCounts(t *testing.T) {
	e := newBreakerEnv(t)
	// Client closes its side before response headers: aborted.
	stream, err := e.extProc().Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(requestHeaders("", "orders", true)); err != nil {
		t.Fatal(err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv: %v", err)
	}
	if st := e.stats(ordersRule); st.Failed != 1 || st.Total != 1 {
		t.Fatalf("after an abandoned stream: %+v", st.Stats)
	}
	// Client cancels the stream (reset) after the request went upstream
	// (blocking mode, so the CONTINUE tells the handler has started): aborted
	// too, which opens the breaker (2 of 2 failed).
	ctx, cancel := context.WithCancel(context.Background())
	stream, err = e.extProc().Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(requestHeaders("", "orders", false)); err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || resp.GetRequestHeaders() == nil {
		t.Fatalf("reply %v, %v", resp, err)
	}
	cancel()
	e.eventually("the cancelled stream to count as aborted", func() bool { return e.stats(ordersRule).State == breaker.Open })
}

func TestExtProcInFlightSlow(t *testing.T) {
	e := newBreakerEnv(t)
	stream, err := e.extProc().Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(requestHeaders("checkout", "backend", true)); err != nil {
		t.Fatal(err)
	}
	tm := e.nextTimer()
	if tm.d != 100*time.Millisecond+1 {
		t.Fatalf("timer armed for %v, want just past max_response_time 100ms", tm.d)
	}
	// A timer firing early (before the clock passed the max) re-arms.
	e.clock.Advance(60 * time.Millisecond)
	tm.ch <- time.Time{}
	if tm = e.nextTimer(); tm.d != 40*time.Millisecond+1 {
		t.Fatalf("re-armed for %v, want 40ms+1ns", tm.d)
	}
	if st := e.stats(slowRule); st.Total != 0 {
		t.Fatalf("counted before max_response_time: %+v", st.Stats)
	}
	// At exactly the max: not slow yet ("slow" is strictly above it).
	e.clock.Advance(40 * time.Millisecond)
	tm.ch <- time.Time{}
	if tm = e.nextTimer(); tm.d != 1 {
		t.Fatalf("at the max, re-armed for %v, want 1ns", tm.d)
	}
	if st := e.stats(slowRule); st.Total != 0 {
		t.Fatalf("counted at exactly max_response_time: %+v", st.Stats)
	}
	// Past the max: counted as slow at once, while the request is open.
	e.clock.Advance(10 * time.Millisecond)
	tm.ch <- time.Time{}
	e.eventually("the in-flight request to count as slow", func() bool { return e.stats(slowRule).Failed == 1 })
	// Its response, much later, is not counted again.
	e.clock.Advance(2 * time.Second)
	if err := stream.Send(responseHeaders("200", true)); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv: %v", err)
	}
	if st := e.stats(slowRule); st.Failed != 1 || st.Total != 1 {
		t.Errorf("after the response: %+v, want counted once", st.Stats)
	}
	select {
	case tm := <-e.timers:
		t.Errorf("timer re-armed after the only breaker counted: %v", tm.d)
	default:
	}
}

// TestExtProcArmsTheEarliestMax: a request two timed breakers watch arms
// its timer for the earlier max_response_time, then for the later one.
func TestExtProcArmsTheEarliestMax(t *testing.T) {
	e := newBreakerEnv(t)
	stream, err := e.extProc().Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(requestHeaders("checkout", "dual", true)); err != nil {
		t.Fatal(err)
	}
	tm := e.nextTimer()
	if tm.d != 100*time.Millisecond+1 {
		t.Fatalf("timer armed for %v, want just past the earlier max, 100ms", tm.d)
	}
	e.clock.Advance(100*time.Millisecond + 1)
	tm.ch <- time.Time{}
	if tm = e.nextTimer(); tm.d != 200*time.Millisecond {
		t.Fatalf("re-armed for %v, want just past the later max, 300ms (200ms on)", tm.d)
	}
	if err := stream.Send(responseHeaders("200", true)); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv: %v", err)
	}
}

func TestExtProcHeadersAndStatusFallback(t *testing.T) {
	e := newBreakerEnv(t)
	// x-user-id in value (not raw_value), status only in response.code.
	stream, err := e.extProc().Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	req := requestHeaders("", "", true)
	req.GetRequestHeaders().Headers.Headers = append(req.GetRequestHeaders().Headers.Headers, &corev3.HeaderValue{Key: "x-user-id", Value: "alice"})
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	code, _ := structpb.NewStruct(map[string]any{AttrResponseCode: 500})
	if err := stream.Send(&extprocv3.ProcessingRequest{
		ObservabilityMode: true,
		Attributes:        map[string]*structpb.Struct{ExtProcFilterName: code},
		Request:           &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv: %v", err)
	}
	snap := e.reg.Snapshot()
	found := false
	for _, b := range snap {
		if b.Rule == userRule && b.Resource == "user=alice" {
			found = b.State == breaker.Open
		}
	}
	if !found {
		t.Errorf("user=alice breaker not open: %+v", snap)
	}
}

func TestExtProcInvalidMessage(t *testing.T) {
	e := newBreakerEnv(t)
	stream, err := e.extProc().Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty message: %v, want InvalidArgument", err)
	}
}

// TestAbandonedStreamsLeaveNoGoroutines abandons ext_proc streams (one with
// the in-flight timer and its receiving goroutine running) and an access-log
// stream, and checks, while the server keeps running, that every goroutine
// they started has ended.
func TestAbandonedStreamsLeaveNoGoroutines(t *testing.T) {
	e := newBreakerEnv(t)
	e.observeRequest("", "orders", time.Millisecond, "200") // the connection is up
	ignore := goleak.IgnoreCurrent()

	ctx, cancel := context.WithCancel(context.Background())
	slow, err := e.extProc().Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := slow.Send(requestHeaders("checkout", "backend", true)); err != nil {
		t.Fatal(err)
	}
	e.nextTimer() // timer armed: the handler now receives on a second goroutine
	plain, err := e.extProc().Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Send(requestHeaders("", "orders", false)); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Recv(); err != nil {
		t.Fatal(err)
	}
	als, err := accesslogv3.NewAccessLogServiceClient(e.conn).StreamAccessLogs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := als.Send(&accesslogv3.StreamAccessLogsMessage{}); err != nil {
		t.Fatal(err)
	}
	cancel()
	goleak.VerifyNone(t, ignore)
	// Both abandoned ext_proc requests counted as aborted.
	e.eventually("aborts counted", func() bool {
		return e.stats(slowRule).Failed == 1 && e.stats(ordersRule).Failed == 1
	})
}
