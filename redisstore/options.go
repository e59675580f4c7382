package redisstore

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/leapgate/leapgate/window"
)

// Topology is how the Redis deployment is reached.
type Topology uint8

// The topologies a Store connects to.
const (
	// Single is one Redis node (or a proxy in front of several).
	Single Topology = iota
	// Sentinel follows the master that Redis Sentinel names.
	Sentinel
	// Cluster is Redis Cluster: keys are spread over hash slots.
	Cluster
)

// String names the topology as REDIS_TYPE does.
func (t Topology) String() string {
	switch t {
	case Single:
		return "single"
	case Sentinel:
		return "sentinel"
	case Cluster:
		return "cluster"
	}
	return fmt.Sprintf("Topology(%d)", uint8(t))
}

// LogValue logs the topology by name (as String), not by number.
func (t Topology) LogValue() slog.Value { return slog.StringValue(t.String()) }

// FailureMode is what requests get while Redis cannot be reached.
type FailureMode uint8

// The failure modes of a Store.
const (
	// FailError makes Do return the error (the zero value): Envoy's
	// failure_mode_deny then decides.
	FailError FailureMode = iota
	// FailAllow admits every request without counting it.
	FailAllow
	// FailDeny refuses every request (refunds are still answered OK).
	FailDeny
	// FailLocal answers from Options.Fallback, this replica's in-memory
	// windows, until Redis is back.
	FailLocal
)

// String names the mode as REDIS_FAILURE_MODE does (also the mode label of
// leapgate_redis_fallbacks_total).
func (m FailureMode) String() string {
	switch m {
	case FailError:
		return "error"
	case FailAllow:
		return "allow"
	case FailDeny:
		return "deny"
	case FailLocal:
		return "local"
	}
	return fmt.Sprintf("FailureMode(%d)", uint8(m))
}

// LogValue logs the mode by name (as String), not by number.
func (m FailureMode) LogValue() slog.Value { return slog.StringValue(m.String()) }

// DefaultPoolSize is the connections per Redis node when Options.PoolSize
// is 0.
const DefaultPoolSize = 10

// DefaultTimeout is Options.Timeout when it is 0.
const DefaultTimeout = 100 * time.Millisecond

// Options configure a Store: where Redis is, how to talk to it, and what
// requests get when it cannot be reached. Package server maps them from
// the REDIS_* settings. Only Addrs is required (and Fallback with
// FailLocal, MasterName with Sentinel).
type Options struct {
	// Topology is Single (the zero value), Sentinel or Cluster.
	Topology Topology
	// Network is "tcp" or "unix" (Single only; Addrs[0] is then the socket
	// path). If empty, tcp.
	Network string
	// Addrs are the node's address (Single), the sentinels' (Sentinel) or
	// some of the cluster's nodes (Cluster), host:port each.
	Addrs []string
	// MasterName is the name of the master the sentinels follow (Sentinel).
	MasterName string
	// Username and Password authenticate to Redis (Username empty: the
	// default user; both empty: no AUTH).
	Username, Password string
	// SentinelUsername and SentinelPassword authenticate to the sentinels.
	SentinelUsername, SentinelPassword string
	// TLS, if non-nil, is used for every connection to Redis; if nil,
	// connections are plaintext.
	TLS *tls.Config
	// PoolSize is the number of connections per Redis node; if 0,
	// DefaultPoolSize.
	PoolSize int
	// Timeout bounds dialling, each read and write, and the wait for a
	// pooled connection; if 0, DefaultTimeout.
	Timeout time.Duration
	// KeyPrefix is put in front of every key, so that deployments can share
	// a Redis. It may not contain { or } (they would change the hash slot).
	KeyPrefix string
	// LocalCacheBytes, when positive, bounds a per-replica cache of keys
	// known to be over their limit, answered without Redis until they could
	// pass again.
	LocalCacheBytes int
	// FailureMode is what requests get while Redis cannot be reached.
	FailureMode FailureMode
	// Reservation, when positive, lets this replica take blocks of a busy
	// sliding window's quota from Redis and spend them locally for up to
	// this long (at most a 32nd of the counter's window), so that keys
	// far from their limit cost Redis a call per block instead of one per
	// request (see reserve.go); if 0, every request goes to Redis.
	Reservation time.Duration
	// ReservationKeys bounds the counters this replica tracks for blocks;
	// if 0, DefaultReservationKeys.
	ReservationKeys int

	// Logger receives health transitions and errors; if nil, discarded.
	Logger *slog.Logger
	// Registry receives the Store's metrics; if nil, not registered.
	Registry prometheus.Registerer
	// TracerProvider, if not nil, traces every operation sent to Redis as
	// a span "redis do" or "redis undo", a child of the request's span; if
	// nil, nothing is traced.
	TracerProvider trace.TracerProvider
	// Fallback answers while Redis is down with FailLocal: the replica's
	// in-memory window.Store.
	Fallback window.Limiter
	// Clock is the local clock of the over-limit cache; if nil, a
	// MonotonicClock. Admission never reads it: Redis's time decides.
	Clock window.Clock
	// HealthInterval is the period of the health check; if 0,
	// DefaultHealthInterval.
	HealthInterval time.Duration
}

func (o Options) timeout() time.Duration {
	if o.Timeout > 0 {
		return o.Timeout
	}
	return DefaultTimeout
}

// poolSize is PoolSize or its default.
func (o Options) poolSize() int {
	if o.PoolSize > 0 {
		return o.PoolSize
	}
	return DefaultPoolSize
}
