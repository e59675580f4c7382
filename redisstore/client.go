package redisstore

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/leapgate/leapgate/config"
)

// newClient builds the go-redis client the settings describe. It does not
// dial: connections are made on first use, so a Redis that is down does not
// block start-up. The second result reports whether the client is a Cluster
// client (keys of one script call must then share a hash slot).
func newClient(s config.Redis) (redis.UniversalClient, bool, error) {
	if err := s.Validate(); err != nil {
		return nil, false, fmt.Errorf("redis settings: %w", err)
	}
	tlsConfig, err := tlsConfig(s)
	if err != nil {
		return nil, false, err
	}
	user, pass := splitAuth(s.Auth)
	// Each Do is one non-idempotent script call: a retry after a timeout
	// could count the hits twice, so go-redis must not retry (MaxRetries -1).
	// Cluster redirections (MOVED/ASK) are safe: the command did not run.
	common := &redis.UniversalOptions{
		Username:                 user,
		Password:                 pass,
		Protocol:                 2,
		DialTimeout:              s.Timeout,
		ReadTimeout:              s.Timeout,
		WriteTimeout:             s.Timeout,
		PoolTimeout:              s.Timeout,
		PoolSize:                 s.PoolSize,
		MaxRetries:               -1,
		ContextTimeoutEnabled:    true, // the caller's deadline bounds the call too
		DialerRetries:            1,    // one dial per attempt: a dead Redis costs one Timeout, not five
		TLSConfig:                tlsConfig,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
	switch strings.ToLower(s.Type) {
	case config.RedisSentinel:
		parts := strings.Split(s.URL, ",")
		common.MasterName = strings.TrimSpace(parts[0])
		common.Addrs = trimAll(parts[1:])
		common.SentinelUsername, common.SentinelPassword = splitAuth(s.SentinelAuth)
		return redis.NewFailoverClient(common.Failover()), false, nil
	case config.RedisCluster:
		common.Addrs = trimAll(strings.Split(s.URL, ","))
		return redis.NewClusterClient(common.Cluster()), true, nil
	default:
		opts := common.Simple()
		opts.Network = strings.ToLower(s.SocketType)
		opts.Addr = strings.TrimSpace(s.URL)
		return redis.NewClient(opts), false, nil
	}
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

// tlsConfig returns the TLS configuration of the settings, nil without TLS.
func tlsConfig(s config.Redis) (*tls.Config, error) {
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
