package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/redisstore"
	"github.com/leapgate/leapgate/window"
)

// backendHealthInterval is how often health re-reads the backend's health.
const backendHealthInterval = 250 * time.Millisecond

// newRedisBackend keeps every window in Redis (package redisstore). With
// REDIS_FAILURE_MODE=local it also builds the in-memory backend, which
// answers while Redis is down. It does not wait for Redis.
//
// Health follows Redis only in failure mode error: in the other modes the
// replica still answers by design while Redis is down (the outage shows in
// the leapgate_redis_up metric and the log), and reporting NOT_SERVING
// would make Envoy and Kubernetes drop every replica at once.
//
// With REDIS_PERSECOND a second store serves the windows of one second or
// shorter (window.Split); its metrics and the main store's then carry a
// label redis="persecond" or redis="main".
func newRedisBackend(s config.Settings, reg prometheus.Registerer, logger *slog.Logger, tp trace.TracerProvider) (backend, error) {
	opts, err := redisOptions(s.Redis)
	if err != nil {
		return backend{}, err
	}
	var perSecondOpts redisstore.Options
	if s.RedisPerSecond.Enabled {
		if perSecondOpts, err = redisOptions(s.RedisPerSecond.PerSecondRedis(s.Redis)); err != nil {
			return backend{}, fmt.Errorf("REDIS_PERSECOND: %w", err)
		}
	}
	// go-redis keeps its logger in a package variable: its lines (dial
	// failures, pool events) go to the process's logger from here on.
	redisstore.RouteClientLogs(logger)
	var local backend
	if opts.FailureMode == redisstore.FailLocal {
		local = newMemoryBackend(s, reg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var stores []*redisstore.Store
	closeAll := func() {
		for _, st := range stores {
			st.Close()
		}
		cancel()
	}
	open := func(o redisstore.Options, name string) (*redisstore.Store, error) {
		o.Logger, o.Registry, o.Fallback, o.TracerProvider = logger, reg, local.limiter, tp
		if s.RedisPerSecond.Enabled {
			o.Logger = logger.With("redis", name)
			o.Registry = prometheus.WrapRegistererWith(prometheus.Labels{"redis": name}, reg)
		}
		st, err := redisstore.New(ctx, o)
		if err == nil {
			stores = append(stores, st)
		}
		return st, err
	}
	store, err := open(opts, "main")
	if err != nil {
		closeAll()
		return backend{}, err
	}
	var limiter window.Limiter = store
	if s.RedisPerSecond.Enabled {
		perSecond, err := open(perSecondOpts, "persecond")
		if err != nil {
			closeAll()
			return backend{}, fmt.Errorf("REDIS_PERSECOND: %w", err)
		}
		limiter = window.Split{Long: store, Short: perSecond, MaxShort: time.Second}
	}
	errorMode := opts.FailureMode == redisstore.FailError
	return backend{
		limiter: limiter,
		ledger:  store.QuotaLedger(),
		run: func(ctx context.Context) {
			if local.run != nil {
				local.run(ctx) // sweeps the fallback's idle counters
			}
		},
		close: closeAll,
		healthy: func() bool {
			for _, st := range stores {
				if !st.Healthy() && errorMode {
					return false
				}
			}
			return true
		},
	}, nil
}

// redisOptions maps the REDIS_* settings (already validated by config) to
// redisstore's options: the address list of each REDIS_TYPE, the user and
// password of REDIS_AUTH, the TLS files.
func redisOptions(r config.Redis) (redisstore.Options, error) {
	if err := r.Validate(); err != nil {
		return redisstore.Options{}, fmt.Errorf("redis settings: %w", err)
	}
	tlsConfig, err := redisTLS(r)
	if err != nil {
		return redisstore.Options{}, err
	}
	o := redisstore.Options{
		Network:         string(r.SocketType),
		TLS:             tlsConfig,
		PoolSize:        r.PoolSize,
		Timeout:         r.Timeout,
		KeyPrefix:       r.CacheKeyPrefix,
		LocalCacheBytes: r.LocalCacheSizeInBytes,
		Reservation:     r.Reservation,
	}
	o.Username, o.Password = splitAuth(r.Auth)
	switch r.Type {
	case config.RedisSentinel:
		parts := strings.Split(r.URL, ",")
		o.Topology = redisstore.Sentinel
		o.MasterName = strings.TrimSpace(parts[0])
		o.Addrs = trimAll(parts[1:])
		o.SentinelUsername, o.SentinelPassword = splitAuth(r.SentinelAuth)
	case config.RedisCluster:
		o.Topology = redisstore.Cluster
		o.Addrs = trimAll(strings.Split(r.URL, ","))
	default:
		o.Topology = redisstore.Single
		o.Addrs = []string{strings.TrimSpace(r.URL)}
	}
	switch r.FailureMode {
	case config.RedisFailAllow:
		o.FailureMode = redisstore.FailAllow
	case config.RedisFailDeny:
		o.FailureMode = redisstore.FailDeny
	case config.RedisFailLocal:
		o.FailureMode = redisstore.FailLocal
	default:
		o.FailureMode = redisstore.FailError
	}
	return o, nil
}

// splitAuth splits "user:pass" into its parts; a value without a colon is
// a password alone (the default user).
func splitAuth(auth string) (user, pass string) {
	if u, p, ok := strings.Cut(auth, ":"); ok {
		return u, p
	}
	return "", auth
}

func trimAll(ss []string) []string {
	out := make([]string, 0, len(ss))
	for _, s := range ss {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// redisTLS returns the TLS configuration of the REDIS_TLS* settings, nil
// without TLS.
func redisTLS(s config.Redis) (*tls.Config, error) {
	if !s.TLS {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.TLSClientCert != "" {
		cert, err := tls.LoadX509KeyPair(s.TLSClientCert, s.TLSClientKey)
		if err != nil {
			return nil, fmt.Errorf("REDIS_TLS_CLIENT_CERT/KEY: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	if s.TLSCACert != "" {
		pem, err := os.ReadFile(s.TLSCACert)
		if err != nil {
			return nil, fmt.Errorf("REDIS_TLS_CACERT: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("REDIS_TLS_CACERT: no PEM certificate in %s", s.TLSCACert)
		}
	}
	if s.TLSSkipHostnameVerification {
		// Verify the chain ourselves, without the host name: Go's
		// InsecureSkipVerify alone would accept any certificate at all.
		roots := c.RootCAs
		c.InsecureSkipVerify = true
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("redis presented no certificate")
			}
			opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
			for _, ic := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(ic)
			}
			_, err := cs.PeerCertificates[0].Verify(opts)
			return err
		}
	}
	return c, nil
}
