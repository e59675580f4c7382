package server

import (
	"context"
	"log/slog"
	"runtime/debug"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// serverMetrics are the metrics of the listeners themselves (the service
// registers its per-rule metrics on the same registry).
type serverMetrics struct {
	grpcDuration *prometheus.HistogramVec
	// rlsRequests and rlsDuration are envoyproxy/ratelimit's metrics of
	// ShouldRateLimit calls, by its names (its statsd exporter mapping),
	// labelled grpc_method="ShouldRateLimit".
	rlsRequests   prometheus.Counter
	rlsDuration   prometheus.Observer
	panics        *prometheus.CounterVec
	configSuccess prometheus.Counter
	configError   prometheus.Counter
	// xdsRepeatedRejections counts xDS responses refused for the same
	// reason as the one before (logged once; see subscribe).
	xdsRepeatedRejections prometheus.Counter
	connLimited           *prometheus.CounterVec
}

func newServerMetrics(reg prometheus.Registerer) *serverMetrics {
	m := &serverMetrics{
		grpcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "leapgate_grpc_server_handling_seconds",
			Help: "Time to handle a gRPC call (for a stream: its whole life), by method and status code.",
			// 50µs .. ~3.3s: an in-memory decision takes microseconds, a
			// remote backend milliseconds.
			Buckets: prometheus.ExponentialBuckets(50e-6, 4, 9),
		}, []string{"method", "code"}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leapgate_panics_recovered_total",
			Help: "Panics recovered in request handlers; the call failed with Internal (HTTP 500) and the process kept serving.",
		}, []string{"handler"}),
		configSuccess: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_service_config_load_success",
			Help: "Rule sets loaded and put into service (start-up and reloads).",
		}),
		configError: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_service_config_load_error",
			Help: "Rule set loads rejected; the last good rules kept serving.",
		}),
		xdsRepeatedRejections: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leapgate_xds_repeated_rejections_total",
			Help: "xDS responses rejected for the same reason as the response before (logged once, counted here and in ratelimit_service_config_load_error).",
		}),
	}
	rlsRequests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_service_total_requests",
		Help: "ShouldRateLimit calls (envoyproxy/ratelimit's name; leapgate_grpc_server_handling_seconds has every method and status).",
	}, []string{"grpc_method"})
	rlsDuration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ratelimit_service_response_time_seconds",
		Help:    "Time to answer a ShouldRateLimit call (envoyproxy/ratelimit's name).",
		Buckets: prometheus.ExponentialBuckets(50e-6, 4, 9),
	}, []string{"grpc_method"})
	m.rlsRequests = rlsRequests.WithLabelValues("ShouldRateLimit")
	m.rlsDuration = rlsDuration.WithLabelValues("ShouldRateLimit")
	reg.MustRegister(rlsRequests, rlsDuration)
	m.connLimited = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leapgate_http_connections_limited_total",
		Help: "Connections that waited in the accept queue because the listener held HTTP_MAX_CONNECTIONS.",
	}, []string{"listener"})
	reg.MustRegister(m.grpcDuration, m.panics, m.configSuccess, m.configError, m.xdsRepeatedRejections, m.connLimited)
	// The series alerts read exist from the start, at 0.
	m.panics.WithLabelValues(rlsv3.RateLimitService_ShouldRateLimit_FullMethodName)
	return m
}

// recoverTo turns a panic into err = Internal, logging the stack and
// counting it. Call it deferred.
func recoverTo(err *error, handler string, logger *slog.Logger, m *serverMetrics) {
	r := recover()
	if r == nil {
		return
	}
	m.panics.WithLabelValues(handler).Inc()
	logger.Error("panic in handler recovered", "handler", handler, "panic", r, "stack", string(debug.Stack()))
	*err = status.Errorf(codes.Internal, "internal error in %s", handler)
}

// unaryInterceptor records latency and recovers panics of unary calls.
func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	start := time.Now()
	defer func() {
		took := time.Since(start).Seconds()
		s.metrics.grpcDuration.WithLabelValues(info.FullMethod, status.Code(err).String()).Observe(took)
		if info.FullMethod == rlsv3.RateLimitService_ShouldRateLimit_FullMethodName {
			s.metrics.rlsRequests.Inc()
			s.metrics.rlsDuration.Observe(took)
		}
	}()
	defer recoverTo(&err, info.FullMethod, s.logger, s.metrics)
	return handler(ctx, req)
}

// watchGrace is how long a health Watch stream stays open once shutdown
// begins: long enough to deliver NOT_SERVING, short enough not to hold the
// drain.
const watchGrace = 200 * time.Millisecond

// streamInterceptor records the duration and recovers panics of streams,
// and keeps the observation streams (ext_proc, access log) within
// s.streams's bounds. It also ends health Watch streams shortly after
// shutdown begins: they never
// end by themselves (gRPC clients with health checking keep one open), so
// they would otherwise hold the drain until DRAIN_TIMEOUT.
func (s *Server) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	if info.FullMethod == healthpb.Health_Watch_FullMethodName {
		ctx, cancel := context.WithCancel(ss.Context())
		defer cancel()
		go func() {
			select {
			case <-s.stopping:
				select {
				case <-time.After(watchGrace):
					cancel()
				case <-ctx.Done():
				}
			case <-ctx.Done():
			}
		}()
		ss = streamWithContext{ServerStream: ss, ctx: ctx}
	}
	start := time.Now()
	defer func() {
		s.metrics.grpcDuration.WithLabelValues(info.FullMethod, status.Code(err).String()).Observe(time.Since(start).Seconds())
	}()
	defer recoverTo(&err, info.FullMethod, s.logger, s.metrics)
	switch info.FullMethod {
	case extprocv3.ExternalProcessor_Process_FullMethodName, accesslogv3.AccessLogService_StreamAccessLogs_FullMethodName:
		// The guard runs the handler in a goroutine of its own, which
		// recovers its own panics.
		return s.streams.serve(ss, func(ss grpc.ServerStream) (err error) {
			defer recoverTo(&err, info.FullMethod, s.logger, s.metrics)
			return handler(srv, ss)
		})
	}
	return handler(srv, ss)
}

// streamWithContext is a ServerStream with its context replaced.
type streamWithContext struct {
	grpc.ServerStream
	ctx context.Context
}

func (s streamWithContext) Context() context.Context { return s.ctx }
