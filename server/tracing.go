package server

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/stats"

	"github.com/leapgate/leapgate/config"
)

// Tracing is OpenTelemetry's, off unless asked for: by TRACING_ENABLED=true
// (envoyproxy/ratelimit's setting) or by OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (the standard ones), and never with
// OTEL_SDK_DISABLED=true. Spans are exported over OTLP/HTTP, or OTLP/gRPC
// when OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL is grpc (or, without it,
// TRACING_EXPORTER_PROTOCOL is). The exporters and the SDK read the other
// OTEL_* variables themselves (endpoint, headers, TLS, timeouts,
// OTEL_TRACES_SAMPLER, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES), which
// win over the TRACING_* ones.

// tracing is the tracer provider the server's spans go to; nil: off.
type tracing struct {
	provider trace.TracerProvider
	// shutdown flushes and stops the exporter (nil for a provider the
	// caller owns).
	shutdown func(context.Context) error
}

// tracingFromEnv builds the tracing the settings and the OTEL_* variables
// ask for.
func tracingFromEnv(ctx context.Context, t config.Tracing) (tracing, error) {
	if !tracingWanted(t, os.Getenv) {
		return tracing{}, nil
	}
	protocol := cmp.Or(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"))
	if protocol == "" && strings.EqualFold(t.ExporterProtocol, "grpc") {
		protocol = "grpc"
	}
	var exp *otlptrace.Exporter
	var err error
	switch protocol {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return tracing{}, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL: %q is neither grpc nor http/protobuf", protocol)
	}
	if err != nil {
		return tracing{}, fmt.Errorf("tracing: creating the OTLP exporter: %w", err)
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(cmp.Or(t.ServiceName, "leapgate")), semconv.ServiceVersion(Build().Version)}
	if t.ServiceNamespace != "" {
		attrs = append(attrs, semconv.ServiceNamespace(t.ServiceNamespace))
	}
	if t.ServiceInstanceID != "" {
		attrs = append(attrs, semconv.ServiceInstanceID(t.ServiceInstanceID))
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attrs...),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil {
		return tracing{}, fmt.Errorf("tracing: resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res)}
	if os.Getenv("OTEL_TRACES_SAMPLER") == "" {
		// The caller's decision is kept; new traces are sampled at the rate.
		opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(t.SamplingRate))))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	return tracing{provider: tp, shutdown: tp.Shutdown}, nil
}

// tracingWanted reports whether the settings and the environment (read
// with getenv) turn tracing on.
func tracingWanted(t config.Tracing, getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	return t.Enabled || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// propagator reads W3C trace context (and baggage) from incoming gRPC
// metadata, as Envoy's tracers send it.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// grpcOption returns the server option that traces every gRPC call and
// stream (ShouldRateLimit, ext_proc, access logs) but health checks, or nil
// with tracing off.
func (t tracing) grpcOption() grpc.ServerOption {
	if t.provider == nil {
		return nil
	}
	return grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(t.provider),
		otelgrpc.WithPropagators(propagator),
		otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool {
			return !strings.HasPrefix(info.FullMethodName, "/"+healthpb.Health_ServiceDesc.ServiceName+"/")
		}),
	))
}

// stop flushes the spans not yet exported, for at most a few seconds.
func (t tracing) stop(logger *slog.Logger) {
	if t.shutdown == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := t.shutdown(ctx); err != nil {
		logger.Warn("tracing: flushing spans at shutdown", "error", err)
	}
}
