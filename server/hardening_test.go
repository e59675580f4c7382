package server_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/server"
	"github.com/leapgate/leapgate/window"
)

// hookLimiter wraps a Limiter, calling before (if set) at the start of Do.
type hookLimiter struct {
	window.Limiter
	before func()
}

func (h hookLimiter) Do(ctx context.Context, reqs []window.Request) ([]window.Result, error) {
	h.before()
	return h.Limiter.Do(ctx, reqs)
}

func withHook(before func()) server.Option {
	return server.WithLimiterWrapper(func(l window.Limiter) window.Limiter { return hookLimiter{Limiter: l, before: before} })
}

func TestPanicIsRecovered(t *testing.T) {
	var panicking atomic.Bool
	panicking.Store(true)
	ts := start(t, map[string]string{"rules.yaml": limitRules}, nil, withHook(func() {
		if panicking.Load() {
			panic("limiter exploded")
		}
	}))
	client := ts.rls(t)
	_, err := client.ShouldRateLimit(context.Background(), request("test", []string{"user", "a"}))
	if status.Code(err) != codes.Internal {
		t.Fatalf("panicking call: %v, want Internal", err)
	}
	if code, _ := post(t, ts.httpURL("/json"), `{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`); code != http.StatusInternalServerError {
		t.Errorf("panicking /json = %d, want 500", code)
	}
	const method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	if got := metricValue(t, ts, `leapgate_panics_recovered_total{handler="`+method+`"}`); got != "1" {
		t.Errorf("gRPC panics counted = %q, want 1", got)
	}
	if got := metricValue(t, ts, `leapgate_panics_recovered_total{handler="/json"}`); got != "1" {
		t.Errorf("/json panics counted = %q, want 1", got)
	}
	// The process keeps serving.
	panicking.Store(false)
	resp, err := client.ShouldRateLimit(context.Background(), request("test", []string{"user", "a"}))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("call after the panic: %v %v", resp, err)
	}
}

// blockingLimiter holds every Do until released, reporting each entry.
type blockingLimiter struct {
	window.Limiter
	entered chan struct{}
	release chan struct{}
}

func (b *blockingLimiter) Do(ctx context.Context, reqs []window.Request) ([]window.Result, error) {
	b.entered <- struct{}{}
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return b.Limiter.Do(ctx, reqs)
}

func newBlocking() (*blockingLimiter, server.Option) {
	b := &blockingLimiter{entered: make(chan struct{}, 16), release: make(chan struct{})}
	return b, server.WithLimiterWrapper(func(l window.Limiter) window.Limiter { b.Limiter = l; return b })
}

func TestGracefulShutdownFinishesCallsInFlight(t *testing.T) {
	blocker, opt := newBlocking()
	ts := start(t, map[string]string{"rules.yaml": limitRules}, nil, opt)
	cc := ts.conn(t)

	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	watch, err := healthpb.NewHealthClient(cc).Watch(watchCtx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := watch.Recv(); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health before shutdown: %v %v", st, err)
	}

	type result struct {
		resp *rlsv3.RateLimitResponse
		err  error
	}
	inflight := make(chan result, 2)
	go func() {
		resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(context.Background(), request("test", []string{"user", "a"}))
		inflight <- result{resp, err}
	}()
	<-blocker.entered // the call is inside the limiter

	ts.stop() // what SIGTERM does in cmd/ratelimit

	if st, err := watch.Recv(); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health after shutdown began: %v %v, want NOT_SERVING", st, err)
	}
	stopWatch()
	eventually(t, "new connections refused", func() bool {
		fresh, err := grpc.NewClient(ts.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer fresh.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(fresh).Check(ctx, &healthpb.HealthCheckRequest{})
		return status.Code(err) == codes.Unavailable
	})
	select {
	case err := <-ts.done:
		t.Fatalf("Run returned (%v) with a call in flight", err)
	default:
	}

	close(blocker.release)
	r := <-inflight
	if r.err != nil || r.resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("in-flight call: %v %v, want it to finish OK", r.resp, r.err)
	}
	if err := <-ts.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	ts.done <- nil // for the cleanup
}

func TestDrainTimeoutBoundsShutdown(t *testing.T) {
	blocker, opt := newBlocking()
	defer close(blocker.release)
	ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) { s.DrainTimeout = 50 * time.Millisecond }, opt)
	client := ts.rls(t)
	errc := make(chan error, 1)
	go func() {
		_, err := client.ShouldRateLimit(context.Background(), request("test", []string{"user", "a"}))
		errc <- err
	}()
	<-blocker.entered
	ts.stop()
	if err := <-ts.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	ts.done <- nil
	if err := <-errc; status.Code(err) != codes.Unavailable && !errors.Is(err, context.Canceled) {
		t.Errorf("call cut by the drain timeout: %v, want Unavailable", err)
	}
}

// TestHealthWatchDoesNotHoldShutdown: a client's health Watch stream (gRPC
// client-side health checking keeps one open) is told NOT_SERVING and then
// ended, so shutdown does not wait for the drain timeout.
func TestHealthWatchDoesNotHoldShutdown(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) { s.DrainTimeout = 10 * time.Minute })
	watch, err := healthpb.NewHealthClient(ts.conn(t)).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := watch.Recv(); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v %v", st, err)
	}
	ts.stop()
	if st, err := watch.Recv(); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch after shutdown began: %v %v, want NOT_SERVING", st, err)
	}
	if _, err := watch.Recv(); err == nil {
		t.Error("watch stream still open after shutdown")
	}
	select {
	case err := <-ts.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		ts.done <- nil
	case <-time.After(time.Minute):
		t.Fatal("an open health Watch stream held the shutdown")
	}
}

// TestNoGoroutineLeaks runs a server through calls, a health watch, a
// reload and a shutdown, then checks every goroutine it started has ended.
func TestNoGoroutineLeaks(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Run("server", func(t *testing.T) {
		ts := start(t, map[string]string{"rules.yaml": limitRules}, nil)
		client := ts.rls(t)
		callUser(t, client, "a")
		watch, err := healthpb.NewHealthClient(ts.conn(t)).Watch(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := watch.Recv(); err != nil {
			t.Fatal(err)
		}
		post(t, ts.httpURL("/json"), `{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"b"}]}]}`)
		writeRules(t, ts.ruleDir, "rules.yaml", rulesPerMinute("5"))
		waitRules(t, ts, "requests_per_unit=5")
	})
	http.DefaultClient.CloseIdleConnections()
	goleak.VerifyNone(t, before)
}

// TestShutdownLetsOpenExtProcStreamsFinish: an ext_proc stream opened
// before SIGTERM (request headers sent, response pending) completes during
// the drain, and Run returns once it has.
func TestShutdownLetsOpenExtProcStreamsFinish(t *testing.T) {
	ts := start(t, map[string]string{"breaker.yaml": breakerRules}, nil)
	cc := ts.conn(t)
	stream, err := extprocv3.NewExternalProcessorClient(cc).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	attrs := map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{
		"xds.cluster_name": structpb.NewStringValue("backend"),
	}}}
	if err := stream.Send(&extprocv3.ProcessingRequest{ObservabilityMode: true, Attributes: attrs,
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}}); err != nil {
		t.Fatal(err)
	}
	// HTTP/2 frames arrive in order: once a later call on the same
	// connection is answered, the server has registered the stream.
	healthStatus(t, cc, "")
	ts.stop()
	eventually(t, "the listener to close", func() bool {
		_, err := http.Get(ts.httpURL("/healthcheck"))
		return err != nil
	})
	select {
	case err := <-ts.done:
		t.Fatalf("Run returned (%v) with an ext_proc stream open", err)
	default:
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{ObservabilityMode: true,
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("503")}}},
		}}}); err != nil {
		t.Fatalf("sending response headers during the drain: %v", err)
	}
	stream.CloseSend()
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("stream end during the drain: %v, want a clean end", err)
	}
	if err := <-ts.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	ts.done <- nil
}
