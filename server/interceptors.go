package server

import (
	"context"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// serverMetrics are the metrics of the listeners themselves (the service
// registers its per-rule metrics on the same registry).
type serverMetrics struct {
	grpcDuration  *prometheus.HistogramVec
	panics        *prometheus.CounterVec
	configSuccess prometheus.Counter
	configError   prometheus.Counter
	// xdsRepeatedRejections counts xDS responses refused for the same
	// reason as the one before (logged once; see subscribe).
	xdsRepeatedRejections prometheus.Counter
	connLimited           *prometheus.CounterVec
	grpcConnLimited       prometheus.Counter
	connEvicted           *prometheus.CounterVec
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
	m.connLimited = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leapgate_http_connections_limited_total",
		Help: "Connections that waited in the accept queue because the listener held HTTP_MAX_CONNECTIONS.",
	}, []string{"listener"})
	m.grpcConnLimited = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "leapgate_grpc_connections_limited_total",
		Help: "gRPC connections that found the listener at GRPC_MAX_CONNECTIONS (one that could go was evicted, else they waited in the accept queue).",
	})
	m.connEvicted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "leapgate_connections_evicted_total",
		Help: "Connections closed at a listener's connection cap to make room: idle keep-alive ones, or ones that had not sent a whole request within a second.",
	}, []string{"listener"})
	reg.MustRegister(m.grpcDuration, m.panics, m.configSuccess, m.configError, m.xdsRepeatedRejections, m.connLimited, m.grpcConnLimited, m.connEvicted)
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
		s.metrics.grpcDuration.WithLabelValues(info.FullMethod, status.Code(err).String()).Observe(time.Since(start).Seconds())
	}()
	defer recoverTo(&err, info.FullMethod, s.logger, s.metrics)
	return handler(ctx, req)
}

// watchGrace is how long a health Watch stream stays open once shutdown
// begins: long enough to deliver NOT_SERVING, short enough not to hold the
// drain.
const watchGrace = 200 * time.Millisecond

// streamInterceptor records the duration and recovers panics of streams,
// and keeps the streams of a service with a stream budget
// (grpcservice.StreamPolicy) within its guard's bounds. It also ends health Watch streams shortly after
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
	if g, ok := s.streams[info.FullMethod]; ok {
		// The guard runs the handler in a goroutine of its own, which
		// recovers its own panics.
		return g.serve(ss, func(ss grpc.ServerStream) (err error) {
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
