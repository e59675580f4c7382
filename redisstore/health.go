package redisstore

import (
	"context"
	"errors"
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

func (s *Store) probe(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
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
	s.metrics.latency.WithLabelValues("ping").Observe(time.Since(start).Seconds())
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return // shutting down
	}
	if err != nil {
		s.metrics.errors.WithLabelValues("ping").Inc()
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
