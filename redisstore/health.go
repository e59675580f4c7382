package redisstore

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Healthy reports whether the last health check of Redis succeeded. It is
// false until the first PING answers.
func (s *Store) Healthy() bool { return s.state.Load() == stateUp }

// healthLoop PINGs Redis every interval (every master on Cluster) until ctx
// is done, logging every change of reachability.
func (s *Store) healthLoop(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.probe(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.nudge:
		}
	}
}

func (s *Store) probe(parent context.Context) {
	ctx, cancel := context.WithTimeout(parent, s.timeout)
	defer cancel()
	start := time.Now()
	var err error
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Ping(ctx).Err()
		})
	} else {
		err = s.client.Ping(ctx).Err()
	}
	ping := s.metrics.op("ping")
	ping.latency.Observe(time.Since(start).Seconds())
	if parent.Err() != nil {
		return // shutting down: the answer, if any, says nothing of Redis
	}
	if err != nil {
		ping.errors.Inc()
		s.metrics.up.Set(0)
		if old := s.state.Swap(stateDown); old != stateDown {
			s.log.Warn("redis unreachable: answering with REDIS_FAILURE_MODE until it is back",
				"mode", s.mode, "err", err)
		}
		return
	}
	if s.state.Load() != stateUp {
		// Load the scripts now so that the first requests need no second
		// round trip for NOSCRIPT (they would still work without).
		s.loadScripts(ctx)
	}
	if (!s.pipe.functions.Load() || s.pipe.reload.Load()) && !s.pipe.refused.Load() {
		s.loadFunctions(ctx)
	}
	s.metrics.up.Set(1)
	if old := s.state.Swap(stateUp); old != stateUp {
		s.log.Info("redis reachable")
	}
}

// loadScripts loads the scripts on Redis (every master on Cluster).
func (s *Store) loadScripts(ctx context.Context) {
	load := func(ctx context.Context, c redis.Scripter) error {
		return errors.Join(allowScript.Load(ctx, c).Err(), undoScript.Load(ctx, c).Err())
	}
	var err error
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return load(ctx, c) })
	} else {
		err = load(ctx, s.client)
	}
	if err != nil {
		s.log.Warn("loading the redis scripts failed (they will be sent on first use)", "err", err)
	}
}

// loadFunctions loads allowLibrary on Redis (every master on Cluster; one
// loaded already is fine) and then sends merged allow calls as FCALLs. A
// Redis that refuses function libraries (before Redis 7: an unknown
// command; an ACL without FUNCTION) keeps EVALSHA and is not asked again.
// Any other failure leaves EVALSHA in use until a later health check loads
// the library.
func (s *Store) loadFunctions(ctx context.Context) {
	load := func(ctx context.Context, c redis.Cmdable) error {
		err := c.FunctionLoad(ctx, allowLibrary).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return err
	}
	var err error
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return load(ctx, c) })
	} else {
		err = load(ctx, s.client)
	}
	switch {
	case err == nil:
		s.pipe.reload.Store(false)
		if !s.pipe.functions.Swap(true) {
			s.log.Debug("redis: admission calls are FCALLs of a function library", "function", allowFunction)
		}
	case refusesFunctions(err):
		s.pipe.refused.Store(true)
		s.pipe.functions.Store(false)
		s.log.Info("redis refuses function libraries: admission calls stay EVALSHAs", "err", err)
	default:
		s.pipe.functions.Store(false)
		s.log.Warn("loading the redis function library failed (EVALSHA until it loads)", "err", err)
	}
}

// refusesFunctions reports whether err says that Redis does not serve, or
// does not allow, FUNCTION LOAD.
func refusesFunctions(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "unknown command") || strings.Contains(msg, "unknown subcommand") || strings.HasPrefix(msg, "NOPERM")
}

// suspect reacts to a failed request: unless Redis answered (a command
// error, not an outage), the health check probes at once. If the probe
// fails too, requests take the failure mode without trying Redis until a
// probe succeeds; one slow call alone does not switch them over.
func (s *Store) suspect(err error) {
	var reply redis.Error
	if errors.As(err, &reply) {
		return // Redis answered: it is up, the command failed
	}
	select {
	case s.nudge <- struct{}{}:
	default: // a probe is already due
	}
}
