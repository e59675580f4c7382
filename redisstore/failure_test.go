package redisstore

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/window"
)

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitUnhealthy waits until a health probe of every store has failed.
func waitUnhealthy(t *testing.T, stores ...*Store) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, s := range stores {
		for s.state.Load() != stateDown {
			if time.Now().After(deadline) {
				t.Fatal("store did not notice that Redis is down")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// TestFailureModes kills Redis under load, checks each REDIS_FAILURE_MODE
// while it is down, restarts it and checks that every Store recovers by
// itself.
func TestFailureModes(t *testing.T) {
	r := redistest.Start(t)
	sp := mustSpec(t, time.Hour, 60)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	mk := func(mode FailureMode, opts Options) *Store {
		st := settingsFor(r.Addr())
		st.FailureMode = mode
		st.Timeout = time.Second
		return newTestStore(t, st, opts)
	}
	local := window.NewStore(window.StoreOptions{})
	errStore := mk(FailError, Options{Registry: reg})
	allowStore := mk(FailAllow, Options{})
	denyStore := mk(FailDeny, Options{})
	localStore := mk(FailLocal, Options{Fallback: local})
	// No periodic health probes after the first: only a failed request
	// makes it probe.
	quiet := mk(FailError, Options{HealthInterval: time.Hour})
	all := []*Store{errStore, allowStore, denyStore, localStore, quiet}
	waitHealthy(t, all...)

	req := func(key string, limit uint64) []window.Request {
		return []window.Request{{Key: key, Spec: sp, Limit: limit, Hits: 1, Veto: true}}
	}
	for _, s := range all {
		res, err := s.Do(ctx, req("before", 1000))
		if err != nil || !res[0].Recorded || res[0].Bucket < 0 {
			t.Fatalf("before the outage: %+v %v", res, err)
		}
	}

	// Load on every store through the outage; each mode's promise holds
	// for every answer, whether Redis or the failure mode gave it.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var answered atomic.Int64
	for _, s := range []*Store{allowStore, denyStore, localStore} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				res, err := s.Do(ctx, req("load", 1_000_000))
				if err != nil {
					t.Errorf("mode %s returned an error: %v", s.mode, err)
					return
				}
				if s == allowStore && !res[0].Allowed {
					t.Errorf("mode allow refused: %+v", res[0])
					return
				}
				answered.Add(1)
			}
		}()
	}
	time.Sleep(50 * time.Millisecond) // let the load run against a live Redis
	r.Kill()
	waitUnhealthy(t, errStore, allowStore, denyStore, localStore)

	// error: the first request to meet the outage gets the cause, wrapped;
	// the next ones fail fast with ErrUnavailable.
	_, err := quiet.Do(ctx, req("q", 10))
	var opErr *net.OpError
	if err == nil || !errors.As(err, &opErr) {
		t.Fatalf("error mode, first failure: %v, want a wrapped *net.OpError", err)
	}
	waitUnhealthy(t, quiet) // the failure made the health check probe at once
	if _, err := quiet.Do(ctx, req("q", 10)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("error mode, while down: %v, want ErrUnavailable", err)
	}
	if _, err := errStore.Do(ctx, req("e", 10)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("error mode: %v, want ErrUnavailable", err)
	}

	// allow: everything passes, nothing counted, the limit reported.
	res, err := allowStore.Do(ctx, append(req("a", 7), req("b", 0)...))
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range res {
		if !x.Allowed || x.Recorded {
			t.Fatalf("allow mode: %+v", x)
		}
	}
	if res[0].Remaining != 7 || res[1].Remaining != 0 {
		t.Fatalf("allow mode remaining %d %d, want the limits 7 0", res[0].Remaining, res[1].Remaining)
	}

	// deny: everything refused, retry after a bucket; refunds are not
	// refused (nor applied).
	refund := window.Request{Key: "d", Spec: sp, Limit: 1000, Hits: 1, Negative: true, Algorithm: window.TokenBucket}
	res, err = denyStore.Do(ctx, append(req("d", 1000), refund))
	if err != nil || res[0].Allowed || res[0].Recorded || res[0].Reset != sp.BucketLength() {
		t.Fatalf("deny mode: %+v %v", res, err)
	}
	if !res[1].Allowed || res[1].Recorded {
		t.Fatalf("deny mode refund: %+v", res[1])
	}

	// local: this replica's windows enforce the limit alone, and Undo
	// reaches them.
	var localRes [][]window.Result
	for i := range 4 {
		res, err := localStore.Do(ctx, req("l", 3))
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Allowed != (i < 3) {
			t.Fatalf("local mode hit %d: %+v", i, res[0])
		}
		localRes = append(localRes, res)
	}
	if err := localStore.Undo(ctx, req("l", 3), localRes[0]); err != nil {
		t.Fatalf("Undo of a local result: %v", err)
	}
	if res, err := localStore.Do(ctx, req("l", 3)); err != nil || !res[0].Allowed {
		t.Fatalf("after Undo in local mode: %+v %v", res, err)
	}

	// Redis returns: every store recovers without help.
	r.Restart()
	waitHealthy(t, errStore, allowStore, denyStore, localStore)
	close(stop)
	wg.Wait()
	if answered.Load() == 0 {
		t.Fatal("the load goroutines answered nothing")
	}
	for _, s := range []*Store{errStore, allowStore, denyStore, localStore} {
		res, err := s.Do(ctx, req("after", 1000))
		if err != nil || !res[0].Recorded || res[0].Bucket < 0 {
			t.Fatalf("mode %s after recovery: %+v %v", s.mode, res, err)
		}
	}
	if got := testutil.ToFloat64(errStore.metrics.fallbacks.WithLabelValues("error")); got < 1 {
		t.Errorf("fallbacks{mode=error} = %v, want >= 1", got)
	}
	if got := testutil.ToFloat64(errStore.metrics.up); got != 1 {
		t.Errorf("redis_up = %v after recovery, want 1", got)
	}
	if n, err := testutil.GatherAndCount(reg, "leapgate_redis_call_duration_seconds"); err != nil || n == 0 {
		t.Errorf("latency histogram not exported: %d %v", n, err)
	}
}

// TestStartWithRedisDown: construction does not wait for Redis, says so in
// the log and in Healthy, answers by the failure mode, and recovers when
// Redis appears.
func TestStartWithRedisDown(t *testing.T) {
	redistest.Need(t)
	port := redistest.FreePort(t)
	var logs syncBuffer
	st := settingsFor("127.0.0.1:" + strconv.Itoa(port))
	st.Username, st.Password = "user", "s3cret-password"
	s := newTestStore(t, st, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	waitUnhealthy(t, s) // never healthy yet; wait for the first probe to fail
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "redis unreachable"); {
		if time.Now().After(deadline) {
			t.Fatalf("no warning in the log:\n%s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	sp := mustSpec(t, time.Second, 10)
	if _, err := s.Do(context.Background(), []window.Request{{Key: "k", Spec: sp, Limit: 1, Hits: 1}}); err == nil {
		t.Fatal("Do succeeded with Redis down in error mode")
	}

	redistest.StartOn(t, port, "--user", "user", "on", ">s3cret-password", "~*", "+@all")
	waitHealthy(t, s)
	if res, err := s.Do(context.Background(), []window.Request{{Key: "k", Spec: sp, Limit: 1, Hits: 1}}); err != nil || !res[0].Recorded {
		t.Fatalf("after Redis started: %+v %v", res, err)
	}
	if !strings.Contains(logs.String(), "redis reachable") {
		t.Errorf("no recovery in the log:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "s3cret") {
		t.Errorf("the password leaked into the log:\n%s", logs.String())
	}
}

// TestAuth: a password-protected Redis with REDIS_AUTH as password and as
// user:password; a wrong password is a failure, not a hang.
func TestAuth(t *testing.T) {
	r := redistest.Start(t, "--requirepass", "pw")
	sp := mustSpec(t, time.Second, 10)
	for _, tc := range []struct {
		auth string
		ok   bool
	}{{"pw", true}, {"default:pw", true}, {"wrong", false}, {"", false}} {
		st := settingsFor(r.Addr())
		st.Username, st.Password, _ = strings.Cut(tc.auth, ":")
		if !strings.Contains(tc.auth, ":") {
			st.Username, st.Password = "", tc.auth
		}
		s := newTestStore(t, st, Options{})
		_, err := s.Do(context.Background(), []window.Request{{Key: "k", Spec: sp, Limit: 5, Hits: 1}})
		if (err == nil) != tc.ok {
			t.Errorf("auth %q: err %v, want ok=%t", tc.auth, err, tc.ok)
		}
	}
}

// TestBlackholedRedis: a Redis that accepts connections but never answers
// costs a request REDIS_TIMEOUT (a timeout error, not a hang), and the
// following requests fail fast once the health probe has failed too.
func TestBlackholedRedis(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // read nothing, answer nothing
		}
	}()
	st := settingsFor(l.Addr().String())
	st.Timeout = 50 * time.Millisecond
	s := newTestStore(t, st, Options{HealthInterval: time.Hour})
	sp := mustSpec(t, time.Second, 10)
	_, err = s.Do(context.Background(), []window.Request{{Key: "k", Spec: sp, Limit: 1, Hits: 1}})
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("blackholed Redis: %v, want a wrapped timeout", err)
	}
	waitUnhealthy(t, s)
	if _, err := s.Do(context.Background(), []window.Request{{Key: "k", Spec: sp, Limit: 1, Hits: 1}}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("after the probe failed: %v, want ErrUnavailable", err)
	}
}

// TestFailedCallsProbeRedisAtOnce: a Do or an Undo that fails because Redis
// does not answer sends a health probe at once, so that the failure mode
// takes over without waiting for the next scheduled probe (an hour here).
func TestFailedCallsProbeRedisAtOnce(t *testing.T) {
	sp := mustSpec(t, time.Minute, 6)
	reqs := []window.Request{{Key: "k", Spec: sp, Limit: 10, Hits: 1}}
	for _, tt := range []struct {
		name string
		call func(s *Store, recorded []window.Result) error
	}{
		{"Do", func(s *Store, _ []window.Result) error { _, err := s.Do(context.Background(), reqs); return err }},
		{"Undo", func(s *Store, recorded []window.Result) error { return s.Undo(context.Background(), reqs, recorded) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := redistest.Start(t)
			st := settingsFor(r.Addr())
			st.Timeout = 200 * time.Millisecond
			s := newTestStore(t, st, Options{HealthInterval: time.Hour})
			waitHealthy(t, s)
			res, err := s.Do(context.Background(), reqs)
			if err != nil || !res[0].Recorded {
				t.Fatalf("Do: %+v %v", res, err)
			}
			r.Kill()
			if err := tt.call(s, res); err == nil {
				t.Fatal("a call to a dead Redis succeeded")
			}
			waitUnhealthy(t, s)
		})
	}
}
