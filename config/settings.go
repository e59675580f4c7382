// Package config holds the process settings, read from environment variables
// with github.com/kelseyhightower/envconfig. Names follow envoyproxy/ratelimit
// wherever the meaning is the same, so existing deployments carry over.
package config

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"time"
)

// Settings is the complete configuration of one server process. Load reads it
// from the environment; the zero value is not valid, use Load or Defaults.
//
// A field tagged `secret:"true"` is never printed by String.
type Settings struct {
	// Listeners.

	// GRPCHost and GRPCPort are the address of the gRPC listener
	// (RateLimitService, health, reflection).
	GRPCHost string `envconfig:"GRPC_HOST" default:"0.0.0.0"`
	GRPCPort int    `envconfig:"GRPC_PORT" default:"8081"`
	// GRPCUDS, when set, is the path of a Unix domain socket the gRPC
	// listener serves on instead of GRPCHost:GRPCPort (a stale socket file
	// left by a previous process is replaced).
	GRPCUDS string `envconfig:"GRPC_UDS"`
	// Host and Port are the address of the HTTP listener (/healthcheck,
	// /json, /metrics).
	Host string `envconfig:"HOST" default:"0.0.0.0"`
	Port int    `envconfig:"PORT" default:"8080"`
	// DebugHost and DebugPort are the address of the debug listener
	// (/rlconfig, pprof). Loopback by default: the rule dump and pprof are
	// not for the network.
	DebugHost string `envconfig:"DEBUG_HOST" default:"127.0.0.1"`
	DebugPort int    `envconfig:"DEBUG_PORT" default:"6070"`
	// ReportHost and ReportPort are the address of the report listener
	// (POST /report: observations that open and close circuit breakers).
	// Loopback by default, for a caller in the same pod or host: anyone who
	// can post reports can open breakers. A host that is not a loopback
	// address requires ReportToken.
	ReportHost string `envconfig:"REPORT_HOST" default:"127.0.0.1"`
	ReportPort int    `envconfig:"REPORT_PORT" default:"8082"`
	// ReportToken, when set, is the shared secret every report must carry
	// as "Authorization: Bearer <token>"; others get 401.
	ReportToken string `envconfig:"REPORT_TOKEN" secret:"true"`

	// UsePrometheus also serves the metrics on PrometheusAddr at
	// PrometheusPath, where envoyproxy/ratelimit's USE_PROMETHEUS serves
	// them, so that existing scrape configurations keep working. The HTTP
	// listener's /metrics serves them either way.
	UsePrometheus  bool   `envconfig:"USE_PROMETHEUS" default:"false"`
	PrometheusAddr string `envconfig:"PROMETHEUS_ADDR" default:":9090"`
	PrometheusPath string `envconfig:"PROMETHEUS_PATH" default:"/metrics"`

	// GRPCMaxConnectionAge and GRPCMaxConnectionAgeGrace bound the life of a
	// gRPC connection so that clients rebalance over time.
	GRPCMaxConnectionAge      time.Duration `envconfig:"GRPC_MAX_CONNECTION_AGE" default:"24h"`
	GRPCMaxConnectionAgeGrace time.Duration `envconfig:"GRPC_MAX_CONNECTION_AGE_GRACE" default:"1h"`

	// GRPCReflection serves gRPC server reflection on the gRPC listener, so
	// that grpcurl can list and call the services without proto files. It
	// tells a caller nothing the public Envoy protos do not, but turn it
	// off where the listener faces untrusted clients.
	GRPCReflection bool `envconfig:"GRPC_REFLECTION" default:"true"`
	// GRPCMaxConcurrentStreams is the most calls and streams one gRPC
	// connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS);
	// Envoy opens another connection beyond it.
	GRPCMaxConcurrentStreams int `envconfig:"GRPC_MAX_CONCURRENT_STREAMS" default:"1024"`
	// GRPCMaxConnections caps the gRPC listener's open connections; 0 (the
	// default) is half the process's file-descriptor limit (64 to 65536).
	// At the cap a connection that has sent nothing for a second is
	// closed to make room, else new ones wait in the accept queue.
	GRPCMaxConnections int `envconfig:"GRPC_MAX_CONNECTIONS" default:"0"`
	// GRPCConnectionTimeout bounds a new gRPC connection's handshake (TLS
	// and the HTTP/2 preface): a client that sends nothing is closed after
	// it.
	GRPCConnectionTimeout time.Duration `envconfig:"GRPC_CONNECTION_TIMEOUT" default:"5s"`
	// GRPCMaxConnectionIdle closes (GOAWAY) a gRPC connection with no call
	// or stream for this long, counted from its last one or its start;
	// Envoy reconnects when it next needs one.
	GRPCMaxConnectionIdle time.Duration `envconfig:"GRPC_MAX_CONNECTION_IDLE" default:"30s"`
	// MaxObservationStreams is the most ext_proc and access-log streams
	// open at once, over all connections; a stream beyond it is refused
	// with RESOURCE_EXHAUSTED (counted in
	// leapgate_observation_streams_refused_total). Envoy opens one ext_proc
	// stream per request in flight, so size it for the mesh's concurrent
	// requests (an idle stream costs about 12 KiB).
	MaxObservationStreams int `envconfig:"MAX_OBSERVATION_STREAMS" default:"16384"`
	// MaxObservationStreamsPerPeer is the most of those streams one peer
	// (one IP address; every Unix-socket client is one peer) may hold, so
	// that one client cannot take every stream and blind the breakers.
	MaxObservationStreamsPerPeer int `envconfig:"MAX_OBSERVATION_STREAMS_PER_PEER" default:"4096"`
	// FeedToken, when set, is the shared secret a peer needs to feed the
	// breakers: every ext_proc or access-log stream must carry the gRPC
	// metadata "authorization: Bearer <token>" (Envoy's grpc_service
	// initial_metadata), from loopback too (behind a sidecar every peer is
	// loopback). Without it, a feed stream is accepted only from a loopback
	// or Unix-socket peer. A peer with a verified client certificate
	// (mutual TLS, GRPC_CLIENT_TLS_CACERT) is accepted either way. Any
	// other is refused with UNAUTHENTICATED, since observations open and
	// close breakers.
	FeedToken string `envconfig:"FEED_TOKEN" secret:"true"`
	// FeedAllowAnyPeer accepts feed streams from any peer without a token:
	// only for a gRPC port that nothing but Envoy can reach (a warning at
	// start-up says so).
	FeedAllowAnyPeer bool `envconfig:"FEED_ALLOW_ANY_PEER" default:"false"`
	// ObservationStreamIdleTimeout closes an ext_proc or access-log stream
	// that has sent nothing for this long (DEADLINE_EXCEEDED, counted in
	// leapgate_observation_streams_idle_closed_total).
	ObservationStreamIdleTimeout time.Duration `envconfig:"OBSERVATION_STREAM_IDLE_TIMEOUT" default:"10m"`

	// RLQSEnabled serves Envoy's Rate Limit Quota Service
	// (envoy.service.rate_limit_quota.v3) on the gRPC port, from the same
	// rules as the rate-limit service. Its streams follow the feeds' trust
	// model (FEED_TOKEN, mutual TLS, loopback), since a stream claims a
	// share of every limit it reports on.
	RLQSEnabled bool `envconfig:"RLQS_ENABLED" default:"true"`
	// RLQSTick is how often RLQS divides every limit anew by demand.
	RLQSTick time.Duration `envconfig:"RLQS_TICK" default:"500ms"`
	// RLQSAssignmentTTL is the time to live of every RLQS assignment,
	// whole seconds of at least 2 s and two ticks: assignments are refreshed
	// once half of it has passed, and a closed stream's share is freed when
	// it ends.
	RLQSAssignmentTTL time.Duration `envconfig:"RLQS_ASSIGNMENT_TTL" default:"4s"`
	// RLQSBucketIdle abandons an RLQS bucket that has reported no request
	// for this long.
	RLQSBucketIdle time.Duration `envconfig:"RLQS_BUCKET_IDLE" default:"1m"`
	// RLQSMaxBucketsPerStream and RLQSMaxBucketsPerDomain bound the RLQS
	// buckets tracked; a bucket past either is answered (DENY_ALL under a
	// limiting rule, ALLOW_ALL otherwise) but takes no share.
	RLQSMaxBucketsPerStream int `envconfig:"RLQS_MAX_BUCKETS_PER_STREAM" default:"1000"`
	RLQSMaxBucketsPerDomain int `envconfig:"RLQS_MAX_BUCKETS_PER_DOMAIN" default:"200000"`
	// MaxRLQSStreams is the most RLQS streams open at once (one per Envoy
	// and domain), MaxRLQSStreamsPerPeer the most one peer may hold.
	MaxRLQSStreams        int `envconfig:"MAX_RLQS_STREAMS" default:"4096"`
	MaxRLQSStreamsPerPeer int `envconfig:"MAX_RLQS_STREAMS_PER_PEER" default:"64"`
	// RLQSStreamIdleTimeout closes an RLQS stream that has sent nothing
	// for this long (Envoy reports every 5 s).
	RLQSStreamIdleTimeout time.Duration `envconfig:"RLQS_STREAM_IDLE_TIMEOUT" default:"1m"`

	// HTTPReadTimeout bounds reading one HTTP request, body included, on
	// the HTTP, report and debug listeners; HTTPWriteTimeout bounds writing
	// its answer (HTTP and report listeners: the debug listener's profiles
	// take as long as asked); HTTPIdleTimeout closes an idle keep-alive
	// connection. HTTPMaxConnections is the most connections each HTTP
	// listener holds at once: beyond it new connections wait in the
	// kernel's queue (counted in leapgate_http_connections_limited_total),
	// so slow clients cannot take every file descriptor.
	HTTPReadTimeout    time.Duration `envconfig:"HTTP_READ_TIMEOUT" default:"10s"`
	HTTPWriteTimeout   time.Duration `envconfig:"HTTP_WRITE_TIMEOUT" default:"10s"`
	HTTPIdleTimeout    time.Duration `envconfig:"HTTP_IDLE_TIMEOUT" default:"2m"`
	HTTPMaxConnections int           `envconfig:"HTTP_MAX_CONNECTIONS" default:"512"`

	// DrainTimeout bounds graceful shutdown: after SIGTERM, in-flight calls
	// get this long to finish before connections are closed.
	DrainTimeout time.Duration `envconfig:"DRAIN_TIMEOUT" default:"20s"`

	// TLS on the gRPC listener (the HTTP and debug listeners are plain text).

	// GRPCServerUseTLS turns TLS on for the gRPC listener.
	GRPCServerUseTLS bool `envconfig:"GRPC_SERVER_USE_TLS" default:"false"`
	// GRPCServerTLSCert and GRPCServerTLSKey are PEM files of the server
	// certificate chain and its key; both are re-read when they change.
	GRPCServerTLSCert string `envconfig:"GRPC_SERVER_TLS_CERT"`
	GRPCServerTLSKey  string `envconfig:"GRPC_SERVER_TLS_KEY"`
	// GRPCClientTLSCACert, when set, turns on mutual TLS: clients must
	// present a certificate signed by one of these PEM CA certificates.
	GRPCClientTLSCACert string `envconfig:"GRPC_CLIENT_TLS_CACERT"`
	// GRPCClientTLSSAN, when set, additionally requires the client
	// certificate to carry this subject alternative name (DNS, URI, IP or
	// e-mail).
	GRPCClientTLSSAN string `envconfig:"GRPC_CLIENT_TLS_SAN"`

	// Request limits. They bound what one call may cost; none of them lets
	// a request through unlimited (see docs/operations.md, "Hostile input").

	// MaxRequestBytes is the largest gRPC message (and /json body) accepted;
	// gRPC refuses a larger message with ResourceExhausted. A rate-limit
	// request is a few hundred bytes, and Envoy's own header limits (60 KiB
	// by default) keep any request it builds far below this bound; the
	// bound leaves room for access-log batches (Envoy buffers 16 KiB by
	// default) and ext_proc headers.
	MaxRequestBytes int `envconfig:"MAX_REQUEST_BYTES" default:"1048576"`
	// MaxDescriptors is the most descriptors in one RateLimitRequest; a
	// request with more is answered OVER_LIMIT for every descriptor.
	MaxDescriptors int `envconfig:"MAX_DESCRIPTORS_PER_REQUEST" default:"64"`

	// Rules.

	// RuntimeRoot, RuntimeSubdirectory and RuntimeAppDirectory are joined
	// into the rule directory (see ConfigDir).
	RuntimeRoot         string `envconfig:"RUNTIME_ROOT" default:"/srv/runtime_data/current"`
	RuntimeSubdirectory string `envconfig:"RUNTIME_SUBDIRECTORY"`
	RuntimeAppDirectory string `envconfig:"RUNTIME_APPDIRECTORY" default:"config"`
	// RuntimeWatchRoot also reloads the rules when RUNTIME_ROOT itself is
	// replaced (the symlink swap of a Lyft-style deploy), as upstream's
	// default does; the rule directory is watched either way.
	RuntimeWatchRoot bool `envconfig:"RUNTIME_WATCH_ROOT" default:"true"`
	// MergeDomainConfig lets several rule files define descriptors of one
	// domain; their descriptors are merged (a descriptor defined twice is
	// still an error). Off, a domain defined twice is an error.
	MergeDomainConfig bool `envconfig:"MERGE_DOMAIN_CONFIG" default:"false"`
	// DefaultCharge is the charge of every rate limit that does not set
	// one: "when_allowed" (a refused hit consumes nothing) or "always" (every
	// hit is recorded, even one that does not fit, for usage charged after
	// the response), on the algorithms that can count beyond their limit
	// (sliding_window, fixed_window). For rules, such as xDS ones, that
	// cannot say charge themselves.
	DefaultCharge Charge `envconfig:"DEFAULT_CHARGE" default:"when_allowed"`
	// ExampleRules serves the embedded example rules (domain "example")
	// instead of the rule directory, for trying the service out. Off, a
	// rule directory that does not exist stops start-up with an error.
	ExampleRules bool `envconfig:"EXAMPLE_RULES" default:"false"`
	// HealthyWithAtLeastOneConfigLoaded reports the service healthy only
	// while a rule set with at least one domain is loaded. Off (upstream's
	// default), it is healthy from start-up, even while no valid rules are
	// loaded and every call answers Unavailable; turn it on so that a pod
	// with a bad or empty rule set is not Ready.
	HealthyWithAtLeastOneConfigLoaded bool `envconfig:"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED" default:"false"`
	// ForceStartWithoutInitialConfig, with CONFIG_TYPE=GRPC_XDS_SOTW,
	// reports the service healthy before the first rule snapshot arrives
	// (calls answer Unavailable until it does). Off, it stays NOT_SERVING
	// until then, as upstream does not listen until then.
	ForceStartWithoutInitialConfig bool `envconfig:"FORCE_START_WITHOUT_INITIAL_CONFIG" default:"false"`
	// ReloadDebounce is how long the rule directory must stay quiet after a
	// change before the rules are reloaded (one edit often makes several
	// file-system events).
	ReloadDebounce time.Duration `envconfig:"CONFIG_RELOAD_DEBOUNCE" default:"250ms"`

	// Logging.

	// LogLevel is the least severe level logged (see LogLevel).
	LogLevel LogLevel `envconfig:"LOG_LEVEL" default:"info"`
	// LogFormat is text or json.
	LogFormat LogFormat `envconfig:"LOG_FORMAT" default:"text"`

	// Limiting.

	// ShadowMode answers OK to every request while still counting and
	// reporting what would have been refused.
	ShadowMode bool `envconfig:"SHADOW_MODE" default:"false"`
	// QuotaMode puts every descriptor in quota mode, as the rule option
	// quota_mode does for one: over its limit a descriptor is OVER_LIMIT in
	// its status, and the request is refused only when every one of its
	// descriptors in quota mode is over (as envoyproxy/ratelimit answers).
	QuotaMode bool `envconfig:"QUOTA_MODE" default:"false"`
	// NearLimitRatio is the fraction of a limit above which hits are
	// counted as near_limit in the metrics.
	NearLimitRatio float64 `envconfig:"NEAR_LIMIT_RATIO" default:"0.8"`
	// WindowBuckets is the number of buckets per window of time_buckets
	// rules that do not choose one (the default sliding_window has no
	// buckets). It must divide one second (in nanoseconds) exactly, so that
	// every unit's window splits evenly.
	WindowBuckets int `envconfig:"WINDOW_BUCKETS" default:"20"`
	// Answers.

	// LimitResponseHeaders selects the rate-limit headers added to answers:
	// false (none), true or draft03 (RateLimit-Limit/-Remaining/-Reset, as
	// upstream), draft11 (RateLimit-Policy and RateLimit, with Retry-After
	// on refusals).
	LimitResponseHeaders HeaderMode `envconfig:"LIMIT_RESPONSE_HEADERS_ENABLED" default:"false"`
	// RefusalHeaders adds "x-ratelimit-reason: rate-limited" and an honest
	// Retry-After to every refusal by a rate limit (a circuit breaker's
	// refusal always carries "x-ratelimit-reason: circuit-open" and
	// Retry-After). Off by default, as upstream adds neither.
	RefusalHeaders bool `envconfig:"REFUSAL_HEADERS" default:"false"`
	// LimitLimitHeader, LimitRemainingHeader and LimitResetHeader rename
	// the draft03 headers.
	LimitLimitHeader     string `envconfig:"LIMIT_LIMIT_HEADER" default:"RateLimit-Limit"`
	LimitRemainingHeader string `envconfig:"LIMIT_REMAINING_HEADER" default:"RateLimit-Remaining"`
	LimitResetHeader     string `envconfig:"LIMIT_RESET_HEADER" default:"RateLimit-Reset"`
	// ResponseDynamicMetadata fills each answer's dynamic_metadata as
	// upstream does (domain, descriptors, hitsAddend, quotaModeViolations,
	// quotaModeEnabled), with the matched rules' metadata under "metadata".
	ResponseDynamicMetadata bool `envconfig:"RESPONSE_DYNAMIC_METADATA" default:"false"`

	// Circuit breakers: how an observed response (ext_proc, access log,
	// /report) becomes descriptor entries.

	// BreakerClusterKey and BreakerRouteKey are the entry keys of the
	// upstream cluster and the route name.
	BreakerClusterKey string `envconfig:"BREAKER_CLUSTER_KEY" default:"destination_cluster"`
	BreakerRouteKey   string `envconfig:"BREAKER_ROUTE_KEY" default:"route"`
	// BreakerHeaders maps request headers to entry keys:
	// "x-user-id=user,x-tenant" (a bare header keeps its own name).
	BreakerHeaders string `envconfig:"BREAKER_HEADERS"`

	// MaxKeys bounds the number of counters the in-memory backend holds;
	// beyond it the least recently used is evicted (counted in
	// leapgate_memory_evictions_total). 0 means no bound.
	MaxKeys int `envconfig:"MAX_KEYS" default:"1000000"`
	// MaxMemoryBytes bounds the bytes the in-memory backend's counters take
	// (leapgate_memory_bytes): a sliding-window key costs 320 bytes, a
	// sliding_log key 8 per unit of its limit. Beyond it the least recently
	// used are evicted, as for MAX_KEYS. The default, 128 MiB, holds about
	// 400,000 sliding-window keys; the process's heap is larger by the
	// garbage collector's headroom (GOGC). 0 means no bound.
	MaxMemoryBytes int `envconfig:"MAX_MEMORY_BYTES" default:"134217728"`
	// SweepInterval is how often the in-memory backend reclaims counters
	// with nothing left inside their window.
	SweepInterval time.Duration `envconfig:"SWEEP_INTERVAL" default:"10s"`
	// BackendType chooses where windows live: "memory" (this process) or
	// "redis" (shared by all replicas; see Redis). Unset, it is "redis"
	// when REDIS_URL or REDIS_SOCKET_TYPE is set (as upstream, whose
	// default is Redis, would use it), else "memory"; see Load.
	BackendType BackendType `envconfig:"BACKEND_TYPE" default:"memory"`
	// Redis configures BACKEND_TYPE=redis (REDIS_* variables, config/redis.go).
	// It is embedded so that envconfig names its variables without a prefix.
	Redis
	// RedisPerSecond configures a second Redis for windows of one second
	// or shorter (REDIS_PERSECOND_* variables, config/redis.go).
	RedisPerSecond
	// XDS chooses the rule source (CONFIG_TYPE) and configures the xDS one
	// (CONFIG_GRPC_XDS_* variables, config/xds.go).
	XDS
	// Tracing holds the TRACING_* variables (config/tracing.go).
	Tracing

	// backendInferred records that Load chose BackendType from the Redis
	// settings (see BackendReason).
	backendInferred bool
}

// ConfigDir returns the rule directory: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
func (s Settings) ConfigDir() string {
	return filepath.Join(s.RuntimeRoot, s.RuntimeSubdirectory, s.RuntimeAppDirectory)
}

// GRPCAddr, HTTPAddr and DebugAddr return the listener addresses in the form
// net.Listen accepts.
func (s Settings) GRPCAddr() string  { return joinHostPort(s.GRPCHost, s.GRPCPort) }
func (s Settings) HTTPAddr() string  { return joinHostPort(s.Host, s.Port) }
func (s Settings) DebugAddr() string { return joinHostPort(s.DebugHost, s.DebugPort) }

// ReportAddr is the report listener's address.
func (s Settings) ReportAddr() string { return joinHostPort(s.ReportHost, s.ReportPort) }

// isLoopback reports whether host names only the loopback interface:
// "localhost" or a loopback IP.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

func joinHostPort(host string, port int) string {
	if strings.Contains(host, ":") && !strings.HasPrefix(host, "[") {
		host = "[" + host + "]"
	}
	return fmt.Sprintf("%s:%d", host, port)
}

// NewLogger returns a logger writing to w in the configured format and level.
func (s Settings) NewLogger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: slog.Level(s.LogLevel)}
	if s.LogFormat == LogJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// String lists every setting as NAME=value in declaration order, with the
// value of every field tagged `secret:"true"` replaced by "<redacted>"
// (left empty when unset), so the result is safe to log.
func (s Settings) String() string {
	var b strings.Builder
	for _, a := range settingAttrs(reflect.ValueOf(s), nil) {
		fmt.Fprintf(&b, "%s=%s ", a.Key, a.Value.String())
	}
	return strings.TrimSuffix(b.String(), " ")
}

// GoString is String for %#v, so that no secret is printed that way either
// (and the embedded Redis's GoString is not taken for the whole).
func (s Settings) GoString() string { return "config.Settings{" + s.String() + "}" }

// LogValue implements slog.LogValuer: a group of NAME=value attributes with
// secrets redacted as in String.
func (s Settings) LogValue() slog.Value {
	return slog.GroupValue(settingAttrs(reflect.ValueOf(s), nil)...)
}

// settingAttrs appends one attribute per field of the struct v (recursing
// into nested structs), named by its envconfig tag.
func settingAttrs(v reflect.Value, attrs []slog.Attr) []slog.Attr {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f, fv := t.Field(i), v.Field(i)
		if !f.IsExported() {
			continue
		}
		if fv.Kind() == reflect.Struct {
			attrs = settingAttrs(fv, attrs)
			continue
		}
		name := f.Tag.Get("envconfig")
		if name == "" {
			name = f.Name
		}
		value := fmt.Sprint(fv.Interface())
		if f.Tag.Get("secret") == "true" && !fv.IsZero() {
			value = "<redacted>"
		}
		attrs = append(attrs, slog.String(name, value))
	}
	return attrs
}
