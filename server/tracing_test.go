package server_test

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/server"
)

const (
	traceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentID = "00f067aa0ba902b7"
)

// TestTracing: with a tracer provider, ShouldRateLimit, its Redis calls and
// ext_proc streams are spans, continuing the W3C trace context the caller
// sent in its gRPC metadata; health checks are not traced.
func TestTracing(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	r := redistest.Start(t)
	ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) {
		s.BackendType, s.Redis.URL, s.Redis.Timeout = config.BackendRedis, r.Addr(), 2*time.Second
	}, server.WithTracerProvider(tp))
	cc := ts.conn(t)
	eventually(t, "SERVING", func() bool { return healthStatus(t, cc, "") == healthpb.HealthCheckResponse_SERVING })
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+traceID+"-"+parentID+"-01")
	if _, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, request("test", []string{"user", "alice"})); err != nil {
		t.Fatal(err)
	}
	stream, err := extprocv3.NewExternalProcessorClient(cc).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{ObservabilityMode: true,
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}}); err != nil {
		t.Fatal(err)
	}
	stream.CloseSend()
	stream.Recv() // the stream's end
	healthStatus(t, cc, "")

	byName := map[string]tracetest.SpanStub{}
	// A server span ends after its response is sent, so the client can
	// see the answer before the span is exported: wait for both.
	eventually(t, "the ShouldRateLimit and ext_proc spans", func() bool {
		for _, s := range exp.GetSpans() {
			byName[s.Name] = s
		}
		_, ep := byName["envoy.service.ext_proc.v3.ExternalProcessor/Process"]
		_, rls := byName["envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"]
		return ep && rls
	})
	rls, ok := byName["envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"]
	if !ok {
		t.Fatalf("no ShouldRateLimit span among %v", names(exp.GetSpans()))
	}
	if rls.SpanContext.TraceID().String() != traceID || rls.Parent.SpanID().String() != parentID || rls.SpanKind != trace.SpanKindServer {
		t.Errorf("ShouldRateLimit span in trace %s under %s (%v), want trace %s under the caller's span %s",
			rls.SpanContext.TraceID(), rls.Parent.SpanID(), rls.SpanKind, traceID, parentID)
	}
	attrs := map[string]string{}
	for _, a := range rls.Attributes {
		attrs[string(a.Key)] = a.Value.String()
	}
	if attrs["ratelimit.domain"] != "test" || attrs["ratelimit.descriptors"] != "1" || attrs["ratelimit.overall_code"] != "OK" {
		t.Errorf("ShouldRateLimit span attributes %v", attrs)
	}
	redisSpan, ok := byName["redis do"]
	if !ok {
		t.Fatalf("no Redis span among %v", names(exp.GetSpans()))
	}
	if redisSpan.Parent.SpanID() != rls.SpanContext.SpanID() || redisSpan.SpanContext.TraceID() != rls.SpanContext.TraceID() {
		t.Errorf("the Redis span is not a child of ShouldRateLimit's")
	}
	if ep := byName["envoy.service.ext_proc.v3.ExternalProcessor/Process"]; ep.SpanContext.TraceID().String() != traceID {
		t.Errorf("ext_proc span in trace %s, want %s", ep.SpanContext.TraceID(), traceID)
	}
	for name := range byName {
		if name == "grpc.health.v1.Health/Check" {
			t.Error("a health check was traced")
		}
	}
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

// collector is an OTLP trace collector that keeps the span names and the
// service names it receives.
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu       sync.Mutex
	names    []string
	services []string
}

func (c *collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				c.services = append(c.services, a.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.names = append(c.names, s.GetName())
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// TestTracingFromEnvironment: the standard OTEL_* variables, or
// envoyproxy/ratelimit's TRACING_* settings, turn tracing on and point it
// at a collector (here over OTLP/gRPC); the spans reach it, at the latest
// when the server stops.
func TestTracingFromEnvironment(t *testing.T) {
	for _, tt := range []struct {
		name    string
		env     map[string]string
		mod     func(*config.Settings)
		service string
	}{
		{"OTEL variables", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_SERVICE_NAME": "leapgate-test"}, nil, "leapgate-test"},
		{"upstream's TRACING settings", nil, func(s *config.Settings) {
			s.Tracing.Enabled, s.Tracing.ExporterProtocol, s.Tracing.ServiceName = true, "grpc", "RateLimit"
		}, "RateLimit"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			col := &collector{}
			g := grpc.NewServer()
			collectortrace.RegisterTraceServiceServer(g, col)
			go g.Serve(lis)
			defer g.Stop()
			if tt.mod == nil {
				t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+lis.Addr().String())
			} else {
				// TRACING_ENABLED turns it on; the endpoint alone is OTEL's.
				t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://"+lis.Addr().String())
			}
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			ts := start(t, map[string]string{"rules.yaml": limitRules}, tt.mod)
			if _, err := ts.rls(t).ShouldRateLimit(context.Background(), request("test", []string{"user", "bob"})); err != nil {
				t.Fatal(err)
			}
			ts.stop()
			<-ts.done
			ts.done <- nil // for the cleanup's wait
			col.mu.Lock()
			defer col.mu.Unlock()
			if !slices.Contains(col.names, "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit") {
				t.Errorf("the collector received %v, want the ShouldRateLimit span", col.names)
			}
			if !slices.Contains(col.services, tt.service) {
				t.Errorf("service names %v, want %s", col.services, tt.service)
			}
		})
	}
}
