package config

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// Validate reports every invalid setting at once, naming the variable.
func (s Settings) Validate() error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", name, fmt.Sprintf(format, args...)))
	}
	for _, p := range []struct {
		name string
		port int
	}{{"GRPC_PORT", s.GRPCPort}, {"PORT", s.Port}, {"DEBUG_PORT", s.DebugPort}, {"REPORT_PORT", s.ReportPort}} {
		if p.port < 0 || p.port > 65535 {
			bad(p.name, "port %d is outside 0..65535", p.port)
		}
	}
	if s.ReportToken == "" && !isLoopback(s.ReportHost) {
		bad("REPORT_HOST", "%q is not a loopback address: set REPORT_TOKEN, or anyone who reaches the port can open circuit breakers", s.ReportHost)
	}
	if s.GRPCMaxConnections < 0 {
		bad("GRPC_MAX_CONNECTIONS", "must be 0 (half the file-descriptor limit) or positive, got %d", s.GRPCMaxConnections)
	}
	if s.FeedAllowAnyPeer && s.FeedToken != "" {
		bad("FEED_ALLOW_ANY_PEER", "true with FEED_TOKEN set: the token would not be required; set one or the other")
	}
	if s.UsePrometheus {
		if _, _, err := net.SplitHostPort(s.PrometheusAddr); err != nil {
			bad("PROMETHEUS_ADDR", "%q is not host:port: %v", s.PrometheusAddr, err)
		}
		if !strings.HasPrefix(s.PrometheusPath, "/") {
			bad("PROMETHEUS_PATH", "%q does not start with /", s.PrometheusPath)
		}
	}
	if !s.DefaultCharge.valid() {
		bad("DEFAULT_CHARGE", "%q is not when_allowed or always", s.DefaultCharge)
	}
	if s.GRPCMaxConnectionAge <= 0 {
		bad("GRPC_MAX_CONNECTION_AGE", "must be positive, got %v", s.GRPCMaxConnectionAge)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"OBSERVATION_STREAM_IDLE_TIMEOUT", s.ObservationStreamIdleTimeout},
		{"RLQS_TICK", s.RLQSTick}, {"RLQS_BUCKET_IDLE", s.RLQSBucketIdle}, {"RLQS_STREAM_IDLE_TIMEOUT", s.RLQSStreamIdleTimeout},
		{"GRPC_CONNECTION_TIMEOUT", s.GRPCConnectionTimeout}, {"GRPC_MAX_CONNECTION_IDLE", s.GRPCMaxConnectionIdle}, {"HTTP_READ_TIMEOUT", s.HTTPReadTimeout},
		{"HTTP_WRITE_TIMEOUT", s.HTTPWriteTimeout}, {"HTTP_IDLE_TIMEOUT", s.HTTPIdleTimeout}} {
		if d.v <= 0 {
			bad(d.name, "must be positive, got %v", d.v)
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"GRPC_MAX_CONCURRENT_STREAMS", s.GRPCMaxConcurrentStreams}, {"MAX_OBSERVATION_STREAMS", s.MaxObservationStreams},
		{"MAX_OBSERVATION_STREAMS_PER_PEER", s.MaxObservationStreamsPerPeer},
		{"MAX_RLQS_STREAMS", s.MaxRLQSStreams}, {"MAX_RLQS_STREAMS_PER_PEER", s.MaxRLQSStreamsPerPeer},
		{"RLQS_MAX_BUCKETS_PER_STREAM", s.RLQSMaxBucketsPerStream}, {"RLQS_MAX_BUCKETS_PER_DOMAIN", s.RLQSMaxBucketsPerDomain},
		{"HTTP_MAX_CONNECTIONS", s.HTTPMaxConnections}} {
		if n.v < 1 {
			bad(n.name, "must be at least 1, got %d", n.v)
		}
	}
	if s.RLQSAssignmentTTL%time.Second != 0 || s.RLQSAssignmentTTL < 2*time.Second || s.RLQSAssignmentTTL < 2*s.RLQSTick {
		bad("RLQS_ASSIGNMENT_TTL", "must be whole seconds, at least 2s and at least two RLQS_TICKs (Envoy reads whole seconds), got %v", s.RLQSAssignmentTTL)
	}
	if s.GRPCMaxConnectionAgeGrace < 0 {
		bad("GRPC_MAX_CONNECTION_AGE_GRACE", "must not be negative, got %v", s.GRPCMaxConnectionAgeGrace)
	}
	if s.DrainTimeout < 0 {
		bad("DRAIN_TIMEOUT", "must not be negative, got %v", s.DrainTimeout)
	}
	if s.ReloadDebounce < 0 {
		bad("CONFIG_RELOAD_DEBOUNCE", "must not be negative, got %v", s.ReloadDebounce)
	}
	if s.GRPCServerUseTLS {
		if s.GRPCServerTLSCert == "" {
			bad("GRPC_SERVER_TLS_CERT", "required when GRPC_SERVER_USE_TLS is true")
		}
		if s.GRPCServerTLSKey == "" {
			bad("GRPC_SERVER_TLS_KEY", "required when GRPC_SERVER_USE_TLS is true")
		}
	} else if s.GRPCClientTLSCACert != "" {
		bad("GRPC_CLIENT_TLS_CACERT", "mutual TLS needs GRPC_SERVER_USE_TLS=true")
	}
	if s.GRPCClientTLSSAN != "" && s.GRPCClientTLSCACert == "" {
		bad("GRPC_CLIENT_TLS_SAN", "a client SAN check needs GRPC_CLIENT_TLS_CACERT (client certificates)")
	}
	for _, l := range []struct {
		name  string
		value int
	}{
		{"MAX_REQUEST_BYTES", s.MaxRequestBytes},
		{"MAX_DESCRIPTORS_PER_REQUEST", s.MaxDescriptors},
	} {
		if l.value < 1 {
			bad(l.name, "must be at least 1, got %d", l.value)
		}
	}
	if s.RuntimeRoot == "" {
		bad("RUNTIME_ROOT", "must not be empty")
	}
	if !s.LimitResponseHeaders.valid() {
		bad("LIMIT_RESPONSE_HEADERS_ENABLED", "%q is not false, true, draft03 or draft11", s.LimitResponseHeaders)
	}
	for _, h := range []struct{ name, value string }{
		{"LIMIT_LIMIT_HEADER", s.LimitLimitHeader},
		{"LIMIT_REMAINING_HEADER", s.LimitRemainingHeader},
		{"LIMIT_RESET_HEADER", s.LimitResetHeader},
		{"BREAKER_CLUSTER_KEY", s.BreakerClusterKey},
		{"BREAKER_ROUTE_KEY", s.BreakerRouteKey},
	} {
		if strings.TrimSpace(h.value) == "" {
			bad(h.name, "must not be empty")
		}
	}
	if !s.LogFormat.valid() {
		bad("LOG_FORMAT", "%q is neither text nor json", s.LogFormat)
	}
	if !(s.NearLimitRatio > 0 && s.NearLimitRatio <= 1) {
		bad("NEAR_LIMIT_RATIO", "%v is outside (0, 1]", s.NearLimitRatio)
	}
	if s.MaxKeys < 0 {
		bad("MAX_KEYS", "must not be negative, got %d", s.MaxKeys)
	}
	if s.MaxMemoryBytes < 0 {
		bad("MAX_MEMORY_BYTES", "must not be negative, got %d", s.MaxMemoryBytes)
	}
	if s.SweepInterval <= 0 {
		bad("SWEEP_INTERVAL", "must be positive, got %v", s.SweepInterval)
	}
	if s.WindowBuckets < 1 || int64(time.Second)%int64(s.WindowBuckets) != 0 {
		bad("WINDOW_BUCKETS", "%d does not divide one second into equal buckets", s.WindowBuckets)
	}
	if err := s.XDS.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := s.Tracing.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch s.BackendType {
	case BackendMemory:
	case BackendRedis:
		if err := s.Redis.Validate(); err != nil {
			errs = append(errs, err)
		}
		if err := s.RedisPerSecond.Validate(s.Redis); err != nil {
			errs = append(errs, err)
		}
		if s.WindowBuckets > 0 && 1_000_000%s.WindowBuckets != 0 {
			bad("WINDOW_BUCKETS", "%d buckets per second are not whole microseconds, as the Redis backend needs", s.WindowBuckets)
		}
	default:
		bad("BACKEND_TYPE", "unknown backend %q (want %s or %s)", s.BackendType, BackendMemory, BackendRedis)
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid settings: %w", errors.Join(errs...))
	}
	return nil
}
