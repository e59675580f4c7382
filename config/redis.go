package config

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// RedisType is a Redis deployment type (REDIS_TYPE), read in any case and
// kept in lower case.
type RedisType string

// The deployment types REDIS_TYPE accepts.
const (
	RedisSingle   RedisType = "single"
	RedisSentinel RedisType = "sentinel"
	RedisCluster  RedisType = "cluster"
)

// UnmarshalText reads a REDIS_TYPE value in any case; Validate rejects an
// unknown one.
func (t *RedisType) UnmarshalText(text []byte) error {
	*t = RedisType(strings.ToLower(strings.TrimSpace(string(text))))
	return nil
}

// RedisFailureMode is what a request gets while Redis cannot be reached
// (REDIS_FAILURE_MODE), read in any case and kept in lower case.
type RedisFailureMode string

// The failure modes REDIS_FAILURE_MODE accepts.
const (
	// RedisFailError returns an error, so that Envoy's failure_mode_deny decides.
	RedisFailError RedisFailureMode = "error"
	// RedisFailAllow admits every request without counting it.
	RedisFailAllow RedisFailureMode = "allow"
	// RedisFailDeny refuses every request.
	RedisFailDeny RedisFailureMode = "deny"
	// RedisFailLocal falls back to this replica's in-memory windows until
	// Redis is back.
	RedisFailLocal RedisFailureMode = "local"
)

// UnmarshalText reads a REDIS_FAILURE_MODE value in any case; Validate
// rejects an unknown one.
func (m *RedisFailureMode) UnmarshalText(text []byte) error {
	*m = RedisFailureMode(strings.ToLower(strings.TrimSpace(string(text))))
	return nil
}

// Redis holds the settings of the Redis backend (BACKEND_TYPE=redis). The
// names are envoyproxy/ratelimit's where the meaning is the same; the
// defaults differ where theirs hurt (REDIS_SOCKET_TYPE tcp rather than unix,
// REDIS_TIMEOUT 100ms rather than 10s).
//
// String and LogValue mask the passwords; fields tagged `secret:"true"` are
// masked by Settings.String too.
type Redis struct {
	// SocketType is tcp or unix (for unix, URL is the socket path).
	SocketType SocketType `envconfig:"REDIS_SOCKET_TYPE" default:"tcp"`
	// URL is the address: host:port (single), master,host:port,...
	// (sentinel: the master's name, then the sentinels) or host:port,...
	// (cluster: any subset of the nodes).
	URL string `envconfig:"REDIS_URL" default:"localhost:6379"`
	// Type is single, sentinel or cluster.
	Type RedisType `envconfig:"REDIS_TYPE" default:"single"`
	// Auth is the password, or user:password for an ACL user.
	Auth string `envconfig:"REDIS_AUTH" secret:"true"`
	// SentinelAuth is the sentinels' password, or user:password.
	SentinelAuth string `envconfig:"REDIS_SENTINEL_AUTH" secret:"true"`
	// TLS turns TLS on for connections to Redis.
	TLS bool `envconfig:"REDIS_TLS" default:"false"`
	// TLSClientCert and TLSClientKey are PEM files of a client certificate
	// and key presented to Redis (both or neither).
	TLSClientCert string `envconfig:"REDIS_TLS_CLIENT_CERT"`
	TLSClientKey  string `envconfig:"REDIS_TLS_CLIENT_KEY"`
	// TLSCACert is a PEM file of the CAs that sign Redis's certificate
	// (default: the system roots).
	TLSCACert string `envconfig:"REDIS_TLS_CACERT"`
	// TLSSkipHostnameVerification still verifies the certificate chain but
	// not that the certificate names the host dialled.
	TLSSkipHostnameVerification bool `envconfig:"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION" default:"false"`
	// PoolSize is the number of connections per Redis node.
	PoolSize int `envconfig:"REDIS_POOL_SIZE" default:"10"`
	// Timeout bounds dialling, each read and write, and the wait for a
	// pooled connection. Short, so that a dead Redis costs a request at most
	// this long (and, once the health check notices, nothing at all).
	Timeout time.Duration `envconfig:"REDIS_TIMEOUT" default:"100ms"`
	// CacheKeyPrefix is put in front of every key, so that several
	// deployments can share one Redis.
	CacheKeyPrefix string `envconfig:"CACHE_KEY_PREFIX"`
	// LocalCacheSizeInBytes, when positive, bounds a per-replica cache of
	// keys known to be over their limit: until the time they could pass
	// again, such a key is refused without asking Redis. 0 turns it off.
	LocalCacheSizeInBytes int `envconfig:"LOCAL_CACHE_SIZE_IN_BYTES" default:"0"`
	// FailureMode is what requests get while Redis cannot be reached:
	// error, allow, deny or local.
	FailureMode RedisFailureMode `envconfig:"REDIS_FAILURE_MODE" default:"error"`
	// Reservation is how long a replica may spend a block of a busy
	// sliding window's quota, taken from Redis, without a round trip per
	// request (at most a 32nd of the window; see docs/redis.md). 0 sends
	// every request to Redis.
	Reservation time.Duration `envconfig:"REDIS_RESERVATION" default:"2s"`
}

// Validate reports every invalid Redis setting at once, naming the variable.
func (r Redis) Validate() error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", name, fmt.Sprintf(format, args...)))
	}
	if !r.SocketType.valid() {
		bad("REDIS_SOCKET_TYPE", "%q is neither tcp nor unix", r.SocketType)
	}
	typ := r.Type
	switch typ {
	case RedisSingle, RedisSentinel, RedisCluster:
	default:
		bad("REDIS_TYPE", "%q is not single, sentinel or cluster", r.Type)
	}
	if typ != RedisSingle && r.SocketType == SocketUnix {
		bad("REDIS_SOCKET_TYPE", "unix sockets work only with REDIS_TYPE=single")
	}
	if strings.TrimSpace(r.URL) == "" {
		bad("REDIS_URL", "must not be empty")
	} else if typ == RedisSentinel && len(strings.Split(r.URL, ",")) < 2 {
		bad("REDIS_URL", "sentinel needs master-name,host:port[,host:port...], got %q", r.URL)
	}
	if r.SentinelAuth != "" && typ != RedisSentinel {
		bad("REDIS_SENTINEL_AUTH", "set but REDIS_TYPE is %q", r.Type)
	}
	if (r.TLSClientCert == "") != (r.TLSClientKey == "") {
		bad("REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together")
	}
	if !r.TLS && (r.TLSClientCert != "" || r.TLSCACert != "" || r.TLSSkipHostnameVerification) {
		bad("REDIS_TLS", "TLS options are set but REDIS_TLS is false")
	}
	if r.PoolSize < 1 {
		bad("REDIS_POOL_SIZE", "must be at least 1, got %d", r.PoolSize)
	}
	if r.Timeout <= 0 {
		bad("REDIS_TIMEOUT", "must be positive, got %v", r.Timeout)
	}
	if r.LocalCacheSizeInBytes < 0 {
		bad("LOCAL_CACHE_SIZE_IN_BYTES", "must not be negative, got %d", r.LocalCacheSizeInBytes)
	}
	if r.Reservation < 0 {
		bad("REDIS_RESERVATION", "must not be negative, got %v", r.Reservation)
	}
	if strings.ContainsAny(r.CacheKeyPrefix, "{}") {
		bad("CACHE_KEY_PREFIX", "must not contain { or } (they would change the Redis Cluster hash slot)")
	}
	switch r.FailureMode {
	case RedisFailError, RedisFailAllow, RedisFailDeny, RedisFailLocal:
	default:
		bad("REDIS_FAILURE_MODE", "%q is not error, allow, deny or local", r.FailureMode)
	}
	return errors.Join(errs...)
}

// String describes the settings with the passwords masked, so that the
// result is safe to log.
func (r Redis) String() string {
	return fmt.Sprintf("type=%s socket=%s url=%s auth=%s sentinel_auth=%s tls=%t pool=%d timeout=%v prefix=%q local_cache_bytes=%d failure_mode=%s reservation=%v",
		r.Type, r.SocketType, r.URL, mask(r.Auth), mask(r.SentinelAuth), r.TLS,
		r.PoolSize, r.Timeout, r.CacheKeyPrefix, r.LocalCacheSizeInBytes, r.FailureMode, r.Reservation)
}

// GoString masks the passwords in %#v too.
func (r Redis) GoString() string { return "config.Redis{" + r.String() + "}" }

// LogValue logs the settings with the passwords masked.
func (r Redis) LogValue() slog.Value { return slog.StringValue(r.String()) }

// mask hides a secret but says whether one is set.
func mask(secret string) string {
	if secret == "" {
		return `""`
	}
	return "<redacted>"
}

// RedisPerSecond holds envoyproxy/ratelimit's REDIS_PERSECOND settings: a
// second Redis for the limits whose window is one second or shorter, which
// take the most writes (upstream sends its SECOND-unit keys there). The
// other REDIS_* settings (TLS files, key prefix, failure mode, local cache)
// apply to both.
type RedisPerSecond struct {
	// Enabled (REDIS_PERSECOND) turns the second Redis on.
	Enabled bool `envconfig:"REDIS_PERSECOND" default:"false"`
	// SocketType, Type, URL, PoolSize, Auth, SentinelAuth, TLS and Timeout
	// are the REDIS_* settings of the same names for the second Redis.
	// URL has no default: it is required when Enabled.
	SocketType   SocketType    `envconfig:"REDIS_PERSECOND_SOCKET_TYPE" default:"tcp"`
	Type         RedisType     `envconfig:"REDIS_PERSECOND_TYPE" default:"single"`
	URL          string        `envconfig:"REDIS_PERSECOND_URL"`
	PoolSize     int           `envconfig:"REDIS_PERSECOND_POOL_SIZE" default:"10"`
	Auth         string        `envconfig:"REDIS_PERSECOND_AUTH" secret:"true"`
	SentinelAuth string        `envconfig:"REDIS_PERSECOND_SENTINEL_AUTH" secret:"true"`
	TLS          bool          `envconfig:"REDIS_PERSECOND_TLS" default:"false"`
	Timeout      time.Duration `envconfig:"REDIS_PERSECOND_TIMEOUT" default:"100ms"`
}

// PerSecondRedis returns the settings of the per-second Redis: main with
// the REDIS_PERSECOND_* values in place of their REDIS_* twins.
func (p RedisPerSecond) PerSecondRedis(main Redis) Redis {
	r := main
	r.SocketType, r.Type, r.URL, r.PoolSize = p.SocketType, p.Type, p.URL, p.PoolSize
	r.Auth, r.SentinelAuth, r.TLS, r.Timeout = p.Auth, p.SentinelAuth, p.TLS, p.Timeout
	if !p.TLS {
		r.TLSClientCert, r.TLSClientKey, r.TLSCACert, r.TLSSkipHostnameVerification = "", "", "", false
	}
	return r
}

// Validate reports every invalid per-second setting, named as REDIS_PERSECOND_*.
func (p RedisPerSecond) Validate(main Redis) error {
	if !p.Enabled {
		return nil
	}
	if strings.TrimSpace(p.URL) == "" {
		return errors.New("REDIS_PERSECOND_URL: required when REDIS_PERSECOND is true")
	}
	err := p.PerSecondRedis(main).Validate()
	if err == nil {
		return nil
	}
	// Report the errors of the per-second twins under their own names; the
	// shared settings' errors are the main Redis's, reported by it.
	var out []error
	for _, e := range flattenJoin(err) {
		name, rest, _ := strings.Cut(e.Error(), ":")
		switch name {
		case "REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_URL", "REDIS_POOL_SIZE", "REDIS_SENTINEL_AUTH", "REDIS_TIMEOUT":
			out = append(out, errors.New("REDIS_PERSECOND_"+strings.TrimPrefix(name, "REDIS_")+":"+rest))
		}
	}
	return errors.Join(out...)
}

// flattenJoin returns the errors an errors.Join holds, or err alone.
func flattenJoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
