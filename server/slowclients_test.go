package server_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/leapgate/leapgate/config"
)

// The tests of this file are the attacks of issue 13 §4: clients that hold
// connections and streams open to exhaust file descriptors and memory.

// trickle opens a connection to addr and starts a POST whose body never
// finishes arriving.
func trickle(t *testing.T, addr, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", path)
	return c
}

// A body that trickles is cut at HTTP_READ_TIMEOUT: the server closes the
// connection (Go's server answers nothing to a body it could not read).
func TestSlowUploadIsCut(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) { s.HTTPReadTimeout = 300 * time.Millisecond })
	for _, addr := range []string{ts.HTTPAddr().String(), ts.ReportAddr().String()} {
		c := trickle(t, addr, "/json")
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := io.Copy(io.Discard, c) // returns when the server closes
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Errorf("%s: a trickling upload was still open after 10 s (read %d bytes)", addr, n)
		}
	}
}

// Past HTTP_MAX_CONNECTIONS, new connections wait instead of taking file
// descriptors; gRPC is not affected; a slot frees as a connection closes.
func TestHTTPConnectionLimit(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) { s.HTTPMaxConnections = 2 })
	a := trickle(t, ts.HTTPAddr().String(), "/json")
	trickle(t, ts.HTTPAddr().String(), "/json")

	got := make(chan int, 1)
	go func() {
		resp, err := http.Get(ts.httpURL("/healthcheck"))
		if err != nil {
			got <- -1
			return
		}
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	eventually(t, "the third connection to be counted as limited", func() bool {
		return gathered(t, ts, "leapgate_http_connections_limited_total", "listener", "http") == 1
	})
	select {
	case code := <-got:
		t.Fatalf("third connection served (%d) while 2 were held", code)
	default:
	}
	h, err := healthpb.NewHealthClient(ts.conn(t)).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health while HTTP is full: %v %v", h, err)
	}
	a.Close()
	select {
	case code := <-got:
		if code != http.StatusOK {
			t.Errorf("/healthcheck once a slot freed = %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("/healthcheck still waiting after a slot freed")
	}
}

// At MAX_OBSERVATION_STREAMS open streams, ext_proc and access-log streams
// are refused; closing one lets the next in.
func TestObservationStreamLimit(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) { s.MaxObservationStreams = 2 })
	cc := ts.conn(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, err := extprocv3.NewExternalProcessorClient(cc).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := accesslogv3.NewAccessLogServiceClient(cc).StreamAccessLogs(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "two streams open", func() bool { return metricValue(t, ts, "leapgate_observation_streams") == "2" })
	third, err := extprocv3.NewExternalProcessorClient(cc).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := third.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third stream: %v, want ResourceExhausted", err)
	}
	if got := metricValue(t, ts, "leapgate_observation_streams_refused_total"); got != "1" {
		t.Errorf("refused = %s, want 1", got)
	}
	first.CloseSend()
	first.Recv()
	eventually(t, "one stream open", func() bool { return metricValue(t, ts, "leapgate_observation_streams") == "1" })
	fourth, err := extprocv3.NewExternalProcessorClient(cc).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the fourth stream admitted", func() bool { return metricValue(t, ts, "leapgate_observation_streams") == "2" })
	fourth.CloseSend()
}

// At MAX_OBSERVATION_STREAMS_PER_PEER streams from one peer (every
// loopback client is one), its next stream is refused though the server
// has room; a stream it closes frees one place for it, not more.
func TestObservationStreamsPerPeer(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) { s.MaxObservationStreamsPerPeer = 2 })
	cc := ts.conn(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(ctx context.Context) extprocv3.ExternalProcessor_ProcessClient {
		t.Helper()
		s, err := extprocv3.NewExternalProcessorClient(cc).Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	refused := func(want string) {
		t.Helper()
		// An admitted stream would wait for a message: give up after 5 s.
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := open(ctx).Recv(); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("stream over the peer's bound: %v, want ResourceExhausted", err)
		}
		if got := metricValue(t, ts, "leapgate_observation_streams_refused_per_peer_total"); got != want {
			t.Errorf("refused per peer = %s, want %s", got, want)
		}
	}
	first := open(ctx)
	open(ctx)
	eventually(t, "two streams open", func() bool { return metricValue(t, ts, "leapgate_observation_streams") == "2" })
	refused("1")
	first.CloseSend()
	first.Recv()
	eventually(t, "one stream open", func() bool { return metricValue(t, ts, "leapgate_observation_streams") == "1" })
	open(ctx)
	eventually(t, "two streams open again", func() bool { return metricValue(t, ts, "leapgate_observation_streams") == "2" })
	refused("2")
}

// A stream that sends nothing for OBSERVATION_STREAM_IDLE_TIMEOUT is
// closed with DeadlineExceeded and frees its slot.
func TestIdleObservationStreamIsClosed(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) {
		s.ObservationStreamIdleTimeout = 200 * time.Millisecond
	})
	cc := ts.conn(t)
	for _, open := range []func() (interface{ RecvMsg(any) error }, error){
		func() (interface{ RecvMsg(any) error }, error) {
			return extprocv3.NewExternalProcessorClient(cc).Process(context.Background())
		},
		func() (interface{ RecvMsg(any) error }, error) {
			return accesslogv3.NewAccessLogServiceClient(cc).StreamAccessLogs(context.Background())
		},
	} {
		stream, err := open()
		if err != nil {
			t.Fatal(err)
		}
		var m extprocv3.ProcessingResponse
		if err := stream.RecvMsg(&m); status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("idle stream: %v, want DeadlineExceeded", err)
		}
	}
	if got := metricValue(t, ts, "leapgate_observation_streams_idle_closed_total"); got != "2" {
		t.Errorf("idle closed = %s, want 2", got)
	}
	eventually(t, "no stream open", func() bool { return metricValue(t, ts, "leapgate_observation_streams") == "0" })
}

// GRPC_MAX_CONCURRENT_STREAMS bounds one connection: the client cannot
// start a stream beyond it until one ends.
func TestStreamsPerConnection(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) { s.GRPCMaxConcurrentStreams = 2 })
	cc := ts.conn(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 2 {
		if _, err := extprocv3.NewExternalProcessorClient(cc).Process(ctx); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "two streams open", func() bool { return metricValue(t, ts, "leapgate_observation_streams") == "2" })
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	if _, err := healthpb.NewHealthClient(cc).Check(short, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("a third call on the same connection: %v, want it held back (DeadlineExceeded)", err)
	}
	// Another connection is not affected.
	if _, err := healthpb.NewHealthClient(ts.conn(t)).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("a call on another connection: %v", err)
	}
}

// gathered reads a counter from the server's registry directly (its
// /metrics may be behind a full listener): the series of name whose label
// has value.
func gathered(t *testing.T, ts *testServer, name, label, value string) float64 {
	t.Helper()
	mfs, err := ts.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// Bytes that are not a protobuf message on an observation stream are the
// client's fault: InvalidArgument, not Internal.
func TestMalformedStreamMessageIsInvalidArgument(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, nil)
	cc := ts.conn(t)
	for _, method := range []string{extprocv3.ExternalProcessor_Process_FullMethodName, accesslogv3.AccessLogService_StreamAccessLogs_FullMethodName} {
		stream, err := cc.NewStream(context.Background(), &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method, grpc.ForceCodec(rawCodec{}))
		if err != nil {
			t.Fatal(err)
		}
		bad := []byte{0x0a, 0x10, 'x'} // a length beyond the message
		if err := stream.SendMsg(&bad); err != nil {
			t.Fatal(err)
		}
		var out []byte
		if err := stream.RecvMsg(&out); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s with malformed bytes: %v, want InvalidArgument", method, err)
		}
	}
}

// GRPC_REFLECTION=false leaves reflection out; the services still serve.
func TestReflectionCanBeTurnedOff(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) { s.GRPCReflection = false })
	stream, err := reflectionpb.NewServerReflectionClient(ts.conn(t)).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
	if _, err := stream.Recv(); status.Code(err) != codes.Unimplemented {
		t.Errorf("reflection with GRPC_REFLECTION=false: %v, want Unimplemented", err)
	}
	if _, err := ts.rls(t).ShouldRateLimit(context.Background(), request("test", []string{"user", "a"})); err != nil {
		t.Errorf("rate limit without reflection: %v", err)
	}
}
