package redisstore

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// settingsFor returns the options of a single Redis at addr.
func settingsFor(addr string) Options {
	return Options{
		Addrs:   []string{addr},
		Timeout: 2 * time.Second, // generous: the test machine is shared and busy
	}
}

// newTestStore builds a Store on the connection options of s and the
// collaborators of opts (Logger, Registry, Fallback, Clock, HealthInterval)
// and closes it when the test ends.
func newTestStore(t testing.TB, s Options, opts Options) *Store {
	t.Helper()
	s.Logger, s.Registry, s.Fallback, s.Clock, s.HealthInterval = opts.Logger, opts.Registry, opts.Fallback, opts.Clock, opts.HealthInterval
	if s.HealthInterval == 0 {
		s.HealthInterval = 20 * time.Millisecond
	}
	st, err := New(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// waitHealthy waits until every store reports Healthy.
func waitHealthy(t testing.TB, stores ...*Store) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, s := range stores {
		for !s.Healthy() {
			if time.Now().After(deadline) {
				t.Fatal("store did not become healthy")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// roundTrips counts the commands and pipelines a client sends, except the
// handshake of a new connection: each is one round trip to Redis (a Cluster pipeline is one round trip per node, in
// parallel).
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "hello" { // a new connection's handshake, not a call
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// countRoundTrips installs a roundTrips hook on the store's client.
// Health-check PINGs go through the hook too; stop them by a long interval.
func countRoundTrips(s *Store) *roundTrips {
	h := &roundTrips{}
	s.client.AddHook(h)
	return h
}
