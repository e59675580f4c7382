package redisstore

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leapgate/leapgate/config"
)

// redisServer is a real redis-server child process on a free loopback port.
type redisServer struct {
	t    testing.TB
	port int
	dir  string
	args []string
	cmd  *exec.Cmd
}

// needRedis skips the test when redis-server is not installed.
func needRedis(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (apt-get install -y redis-server redis-tools); skipping the Redis integration test")
	}
}

// startRedis starts redis-server with extra arguments and waits until it
// answers PING. It is killed when the test ends.
func startRedis(t testing.TB, extra ...string) *redisServer {
	t.Helper()
	needRedis(t)
	r := &redisServer{t: t, port: freePort(t), dir: t.TempDir(), args: extra}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

// start (re)starts the server on its port.
func (r *redisServer) start() {
	r.t.Helper()
	args := append([]string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir}, r.args...)
	r.cmd = exec.Command("redis-server", args...)
	if err := r.cmd.Start(); err != nil {
		r.t.Fatalf("starting redis-server: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", r.addr(), 100*time.Millisecond)
		if err == nil {
			fmt.Fprint(c, "PING\r\n")
			buf := make([]byte, 64)
			c.SetReadDeadline(time.Now().Add(time.Second))
			n, _ := c.Read(buf)
			c.Close()
			if strings.HasPrefix(string(buf[:n]), "+PONG") || strings.HasPrefix(string(buf[:n]), "-NOAUTH") {
				return
			}
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("redis-server on %s did not start: %v", r.addr(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop kills the server (SIGKILL: a crash, not a shutdown) and waits for it.
func (r *redisServer) stop() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	r.cmd.Process.Kill()
	r.cmd.Wait()
	r.cmd = nil
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// settingsFor returns default settings pointing at addr.
func settingsFor(addr string) config.Redis {
	return config.Redis{
		SocketType:  "tcp",
		URL:         addr,
		Type:        config.RedisSingle,
		PoolSize:    10,
		Timeout:     2 * time.Second, // generous: the test machine is shared and busy
		FailureMode: config.RedisFailError,
	}
}

// newTestStore builds a Store on s and closes it when the test ends.
func newTestStore(t testing.TB, s config.Redis, opts Options) *Store {
	t.Helper()
	if opts.HealthInterval == 0 {
		opts.HealthInterval = 20 * time.Millisecond
	}
	st, err := New(context.Background(), s, opts)
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

// roundTrips counts the commands and pipelines a client sends: each is one
// round trip to Redis (a Cluster pipeline is one round trip per node, in
// parallel).
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
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
