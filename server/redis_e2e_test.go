package server_test

import (
	"context"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leapgate/leapgate/config"
)

// redisProc is a redis-server child process on a fixed loopback port.
type redisProc struct {
	port int
	dir  string
	cmd  *exec.Cmd
}

// startRedisServer starts redis-server on a free port (the test is skipped
// when redis-server is not installed) and kills it when the test ends.
func startRedisServer(t *testing.T) *redisProc {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed (apt-get install -y redis-server); skipping the Redis end-to-end test")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &redisProc{port: l.Addr().(*net.TCPAddr).Port, dir: t.TempDir()}
	l.Close()
	r.start(t)
	t.Cleanup(r.kill)
	return r
}

func (r *redisProc) addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

func (r *redisProc) start(t *testing.T) {
	t.Helper()
	r.cmd = exec.Command("redis-server", "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir)
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "redis-server listening", func() bool {
		c, err := net.DialTimeout("tcp", r.addr(), 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// kill ends the server abruptly (a crash).
func (r *redisProc) kill() {
	if r.cmd != nil && r.cmd.Process != nil {
		r.cmd.Process.Kill()
		r.cmd.Wait()
		r.cmd = nil
	}
}

const redisRules = `domain: shared
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 25
`

// TestRedisBackendTwoReplicas: two servers with BACKEND_TYPE=redis on one
// Redis enforce one limit over gRPC under concurrent load; health follows
// Redis (failure mode error): NOT_SERVING and errors while it is down, back
// to SERVING and answers when it returns.
func TestRedisBackendTwoReplicas(t *testing.T) {
	r := startRedisServer(t)
	mod := func(s *config.Settings) {
		s.BackendType = config.BackendRedis
		s.Redis.URL = r.addr()
		s.Redis.Timeout = 2 * time.Second // a busy shared test machine
	}
	a := start(t, map[string]string{"rules.yaml": redisRules}, mod)
	b := start(t, map[string]string{"rules.yaml": redisRules}, mod)
	clients := []rlsv3.RateLimitServiceClient{a.rls(t), b.rls(t)}
	for _, ts := range []*testServer{a, b} {
		cc := ts.conn(t)
		eventually(t, "SERVING with Redis up", func() bool {
			return healthStatus(t, cc, "") == healthpb.HealthCheckResponse_SERVING
		})
	}
	ctx := context.Background()

	var ok, over atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				resp, err := clients[w%2].ShouldRateLimit(ctx, request("shared", []string{"user", "carol"}))
				if err != nil {
					t.Error(err)
					return
				}
				switch resp.GetOverallCode() {
				case rlsv3.RateLimitResponse_OK:
					ok.Add(1)
				case rlsv3.RateLimitResponse_OVER_LIMIT:
					over.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 25 || over.Load() != 55 {
		t.Fatalf("two replicas admitted %d and refused %d of 80, want 25 and 55", ok.Load(), over.Load())
	}

	r.kill()
	// Both replicas must have seen the outage before Redis returns: a
	// replica whose health watcher has not yet noticed would still report
	// SERVING below and make "SERVING after Redis returns" pass too early.
	for _, ts := range []*testServer{a, b} {
		eventually(t, "NOT_SERVING with Redis down", func() bool {
			code, _ := get(t, ts.httpURL("/healthcheck"))
			return code == http.StatusInternalServerError &&
				healthStatus(t, ts.conn(t), "") == healthpb.HealthCheckResponse_NOT_SERVING
		})
	}
	if _, err := clients[0].ShouldRateLimit(ctx, request("shared", []string{"user", "dave"})); err == nil {
		t.Fatal("ShouldRateLimit answered with Redis down in failure mode error")
	}

	r.start(t)
	eventually(t, "SERVING after Redis returns", func() bool {
		code, _ := get(t, b.httpURL("/healthcheck"))
		return code == http.StatusOK
	})
	resp, err := clients[1].ShouldRateLimit(ctx, request("shared", []string{"user", "dave"}))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after recovery: %v %v", resp, err)
	}
	if got := metricValue(t, b, "leapgate_redis_up"); got != "1" {
		t.Errorf("leapgate_redis_up = %q, want 1", got)
	}
}
