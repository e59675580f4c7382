package server

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
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
)

// Tracing is OpenTelemetry's, configured by its standard environment
// variables and off unless they ask for it: with OTEL_EXPORTER_OTLP_ENDPOINT
// or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set (and OTEL_SDK_DISABLED not
// true), spans are exported over OTLP, gRPC unless
// OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL is http/protobuf. The exporters and
// the SDK read the other OTEL_* variables themselves (headers, TLS,
// timeouts, OTEL_TRACES_SAMPLER, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES).

// tracing is the tracer provider the server's spans go to; nil: off.
type tracing struct {
	provider trace.TracerProvider
	// shutdown flushes and stops the exporter (nil for a provider the
	// caller owns).
	shutdown func(context.Context) error
}

// tracingFromEnv builds the tracing the OTEL_* variables ask for.
func tracingFromEnv(ctx context.Context) (tracing, error) {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") ||
		(os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "") {
		return tracing{}, nil
	}
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exp *otlptrace.Exporter
	var err error
	switch protocol {
	case "", "grpc":
		exp, err = otlptracegrpc.New(ctx)
	case "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	default:
		return tracing{}, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL: %q is neither grpc nor http/protobuf", protocol)
	}
	if err != nil {
		return tracing{}, fmt.Errorf("tracing: creating the OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("leapgate"), semconv.ServiceVersion(Build().Version)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil {
		return tracing{}, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tracing{provider: tp, shutdown: tp.Shutdown}, nil
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
