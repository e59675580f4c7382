package redisstore

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/window"
)

// TestClientOptions: the go-redis client never retries a call (a retried
// script call could count its hits twice), and Timeout and PoolSize of 0
// are their defaults.
func TestClientOptions(t *testing.T) {
	for _, tt := range []struct {
		name    string
		opts    Options
		timeout time.Duration
		pool    int
	}{
		{"defaults", Options{Addrs: []string{"127.0.0.1:1"}}, DefaultTimeout, DefaultPoolSize},
		{"set", Options{Addrs: []string{"127.0.0.1:1"}, Timeout: time.Second, PoolSize: 3}, time.Second, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, _, err := newClient(tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			o := c.(*redis.Client).Options()
			if o.MaxRetries != 0 || o.ReadTimeout != tt.timeout || o.DialTimeout != tt.timeout || o.PoolSize != tt.pool {
				t.Errorf("retries %d, timeouts %v/%v, pool %d; want 0, %v, %d", o.MaxRetries, o.ReadTimeout, o.DialTimeout, o.PoolSize, tt.timeout, tt.pool)
			}
		})
	}
	c, _, err := newClient(Options{Topology: Cluster, Addrs: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n := c.(*redis.ClusterClient).Options().MaxRetries; n > 0 {
		t.Errorf("cluster client retries %d times, want none (0 or -1)", n)
	}
}

// TestUnixSocket: Network "unix" reaches a redis-server on its socket.
func TestUnixSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "redis.sock")
	redistest.Start(t, "--unixsocket", sock)
	st := settingsFor(sock)
	st.Network = "unix"
	s := newTestStore(t, st, Options{})
	waitHealthy(t, s)
	res, err := s.Do(context.Background(), []window.Request{{Key: "unix", Spec: mustSpec(t, time.Minute, 1), Limit: 1, Hits: 1}})
	if err != nil || !res[0].Allowed || res[0].Bucket < 0 {
		t.Fatalf("over a unix socket: %+v %v", res, err)
	}
}

// TestHitsBeyondTheLimit: hits beyond window.MaxLimit (a hostile
// hits_addend) are refused under the largest limit, not wrapped or cut
// to fit.
func TestHitsBeyondTheLimit(t *testing.T) {
	r := redistest.Start(t)
	s := newTestStore(t, settingsFor(r.Addr()), Options{})
	waitHealthy(t, s)
	sp := mustSpec(t, time.Minute, 1)
	for _, hits := range []uint64{window.MaxLimit + 1, window.MaxLimit + 2, math.MaxUint64} {
		res, err := s.Do(context.Background(), []window.Request{{Key: fmt.Sprint("huge-", hits), Spec: sp, Limit: window.MaxLimit, Hits: hits}})
		if err != nil || res[0].Allowed {
			t.Errorf("%d hits under a limit of %d: %+v %v, want refused", hits, uint64(window.MaxLimit), res, err)
		}
	}
}

// TestNewLogsSettings: New logs, before reaching Redis, the settings an
// operator checks first: where it connects, whether with TLS, the key
// prefix, what happens when Redis fails and the local cache's size.
func TestNewLogsSettings(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts Options
		want map[string]any
	}{
		{"plain", Options{Addrs: []string{"127.0.0.1:1"}},
			map[string]any{"topology": "single", "tls": false, "key_prefix": "", "failure_mode": "error", "local_cache_bytes": 0.0}},
		{"tls", Options{Addrs: []string{"127.0.0.1:1"}, TLS: &tls.Config{}, KeyPrefix: "lg:", FailureMode: FailDeny, LocalCacheBytes: 4096},
			map[string]any{"tls": true, "key_prefix": "lg:", "failure_mode": "deny", "local_cache_bytes": 4096.0}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var logs syncBuffer
			opts := tt.opts
			opts.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
			opts.Registry = prometheus.NewRegistry()
			opts.HealthInterval = time.Hour
			s, err := New(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var line map[string]any
			for _, l := range strings.Split(logs.String(), "\n") {
				if strings.Contains(l, "redis backend configured") {
					if err := json.Unmarshal([]byte(l), &line); err != nil {
						t.Fatal(err)
					}
				}
			}
			if line == nil {
				t.Fatalf("no configuration line in:\n%s", logs.String())
			}
			for k, v := range tt.want {
				if line[k] != v {
					t.Errorf("%s = %v (%T), want %v", k, line[k], line[k], v)
				}
			}
		})
	}
}
