package redisstore

import (
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// newClient builds the go-redis client opts describe. It does not dial:
// connections are made on first use, so a Redis that is down does not
// block start-up. The second result reports whether the client is a Cluster
// client (keys of one script call must then share a hash slot).
func newClient(o Options) (redis.UniversalClient, bool, error) {
	switch {
	case len(o.Addrs) == 0:
		return nil, false, errors.New("redisstore: Options.Addrs is empty")
	case o.Topology == Sentinel && o.MasterName == "":
		return nil, false, errors.New("redisstore: Options.MasterName is required with Sentinel")
	case o.Topology > Cluster:
		return nil, false, fmt.Errorf("redisstore: unknown %v", o.Topology)
	case o.FailureMode > FailLocal:
		return nil, false, fmt.Errorf("redisstore: unknown %v", o.FailureMode)
	case strings.ContainsAny(o.KeyPrefix, "{}"):
		return nil, false, errors.New("redisstore: Options.KeyPrefix must not contain { or }")
	}
	pool := o.poolSize()
	timeout := o.timeout()
	// Each Do is one non-idempotent script call: a retry after a timeout
	// could count the hits twice, so go-redis must not retry (MaxRetries -1).
	// Cluster redirections (MOVED/ASK) are safe: the command did not run.
	common := &redis.UniversalOptions{
		Username:                 o.Username,
		Password:                 o.Password,
		Protocol:                 2,
		DialTimeout:              timeout,
		ReadTimeout:              timeout,
		WriteTimeout:             timeout,
		PoolTimeout:              timeout,
		PoolSize:                 pool,
		MaxRetries:               -1,
		ContextTimeoutEnabled:    true, // the caller's deadline bounds the call too
		DialerRetries:            1,    // one dial per attempt: a dead Redis costs one Timeout, not five
		TLSConfig:                o.TLS,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
	switch o.Topology {
	case Sentinel:
		common.MasterName = o.MasterName
		common.Addrs = o.Addrs
		common.SentinelUsername, common.SentinelPassword = o.SentinelUsername, o.SentinelPassword
		return redis.NewFailoverClient(common.Failover()), false, nil
	case Cluster:
		common.Addrs = o.Addrs
		return redis.NewClusterClient(common.Cluster()), true, nil
	default:
		opts := common.Simple()
		opts.Network = o.Network
		if opts.Network == "" {
			opts.Network = "tcp"
		}
		opts.Addr = o.Addrs[0]
		return redis.NewClient(opts), false, nil
	}
}
