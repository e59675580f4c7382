package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/internal/redistest"
)

// soakDuration is LEAPGATE_SOAK (`make soak` sets minutes); unset, the soak
// runs a few seconds so that every `make test` exercises it.
func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv("LEAPGATE_SOAK")
	if v == "" {
		return 3 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("LEAPGATE_SOAK: %v", err)
	}
	return d
}

const totalLimit = 1_000_000_000

// soakRules limits each user to perUser a second; every request also
// counts against one huge "total" limit, whose count must equal the number
// of requests answered OK (an OVER_LIMIT answer records nothing).
func soakRules(perUser int) string {
	return fmt.Sprintf(`domain: soak
descriptors:
  - key: total
    value: all
    rate_limit: {unit: hour, requests_per_unit: %d}
  - key: user
    rate_limit: {unit: second, requests_per_unit: %d}
`, totalLimit, perUser)
}

const soakBreakerRules = `domain: breaker
descriptors:
  - key: destination_cluster
    value: backend
    circuit_breaker:
      strategy: error_ratio
      threshold: 0.9
      min_requests: 1000000
      window: 10s
      buckets: 10
      open_duration: 1s
      half_open_probes: 1
      probe_timeout: 1s
`

// soakStats are the outcomes the load saw.
type soakStats struct {
	ok, over, extproc atomic.Int64
	// okSince counts OK answers to calls started after since (unix nanos).
	since   atomic.Int64
	okSince atomic.Int64

	mu   sync.Mutex
	errs map[codes.Code]int
}

func (s *soakStats) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.errs == nil {
		s.errs = map[codes.Code]int{}
	}
	s.errs[status.Code(err)]++
}

// TestSoak drives a server with ShouldRateLimit, /json and ext_proc load
// while the rules are reloaded every few seconds (and, with Redis, Redis is
// restarted once), then checks the failure policy held, the heap stayed
// flat and the global count is exact.
func TestSoak(t *testing.T) {
	d := soakDuration(t)
	t.Run("memory", func(t *testing.T) {
		stats, final, heapMid, heapEnd := soak(t, d, nil, nil)
		if len(stats.errs) != 0 {
			t.Errorf("errors with the in-memory backend: %v", stats.errs)
		}
		if want := uint32(totalLimit - stats.ok.Load()); final != want {
			t.Errorf("total remaining %d, want %d (limit %d - %d answered OK): a count was lost or invented",
				final, want, totalLimit, stats.ok.Load())
		}
		checkHeap(t, heapMid, heapEnd)
	})
	t.Run("redis", func(t *testing.T) {
		r := redistest.Start(t)
		mod := func(s *config.Settings) {
			s.BackendType, s.Redis.URL, s.Redis.Timeout = config.BackendRedis, r.Addr(), 2*time.Second
		}
		stats, final, heapMid, heapEnd := soak(t, d, mod, r)
		// Failure mode error: calls fail only while Redis is down, with
		// Unavailable (or a deadline on an in-flight call when it died).
		for code := range stats.errs {
			if code != codes.Unavailable && code != codes.DeadlineExceeded {
				t.Errorf("unexpected errors: %v", stats.errs)
			}
		}
		// Redis lost its counts when it was killed (no persistence): the
		// count is at least every OK answer to a call started after it
		// came back, and at most every OK answer.
		used := int64(totalLimit) - int64(final)
		if used < stats.okSince.Load() || used > stats.ok.Load() {
			t.Errorf("Redis counted %d, want between %d (OK since the restart) and %d (all OK)", used, stats.okSince.Load(), stats.ok.Load())
		}
		checkHeap(t, heapMid, heapEnd)
	})
}

func checkHeap(t *testing.T, mid, end uint64) {
	t.Helper()
	t.Logf("heap after GC: %d KiB at a quarter of the run, %d KiB at the end", mid>>10, end>>10)
	if end > 2*mid+32<<20 {
		t.Errorf("heap grew from %d KiB to %d KiB", mid>>10, end>>10)
	}
}

func heapNow() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// soak runs the load for d and returns what it saw and the remaining quota
// of the total limit afterwards.
func soak(t *testing.T, d time.Duration, mod func(*config.Settings), r *redistest.Server) (st *soakStats, final uint32, heapMid, heapEnd uint64) {
	ts := start(t, map[string]string{"rules.yaml": soakRules(5), "breaker.yaml": soakBreakerRules}, mod)
	cc := ts.conn(t)
	eventually(t, "SERVING", func() bool { return healthStatus(t, cc, "") == healthpb.HealthCheckResponse_SERVING })
	client := rlsv3.NewRateLimitServiceClient(cc)
	st = &soakStats{}
	st.since.Store(time.Now().UnixNano())

	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	count := func(code rlsv3.RateLimitResponse_Code, started int64) {
		switch code {
		case rlsv3.RateLimitResponse_OK:
			st.ok.Add(1)
			if started > st.since.Load() {
				st.okSince.Add(1)
			}
		case rlsv3.RateLimitResponse_OVER_LIMIT:
			st.over.Add(1)
		}
	}
	for w := range 4 { // ShouldRateLimit
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for ctx.Err() == nil {
				started := time.Now().UnixNano()
				resp, err := client.ShouldRateLimit(context.Background(),
					request("soak", []string{"total", "all"}, []string{"user", fmt.Sprint("u", rng.IntN(50))}))
				if err != nil {
					st.fail(err)
					continue
				}
				count(resp.GetOverallCode(), started)
			}
		})
	}
	wg.Go(func() { // /json
		for i := 0; ctx.Err() == nil; i++ {
			started := time.Now().UnixNano()
			code, body := post(t, ts.httpURL("/json"), fmt.Sprintf(
				`{"domain":"soak","descriptors":[{"entries":[{"key":"total","value":"all"}]},{"entries":[{"key":"user","value":"j%d"}]}]}`, i%50))
			switch code {
			case 200:
				count(rlsv3.RateLimitResponse_OK, started)
			case 429:
				count(rlsv3.RateLimitResponse_OVER_LIMIT, started)
			case 503:
				st.fail(status.Error(codes.Unavailable, body))
			default:
				st.fail(status.Errorf(codes.Unknown, "/json %d %s", code, body))
			}
		}
	})
	for range 2 { // ext_proc streams in observability mode
		wg.Go(func() {
			epc := extprocv3.NewExternalProcessorClient(cc)
			for ctx.Err() == nil {
				if err := oneExtProcStream(epc); err != nil {
					st.fail(err)
					continue
				}
				st.extproc.Add(1)
			}
		})
	}
	wg.Go(func() { // reloads
		every := min(max(d/10, 200*time.Millisecond), 3*time.Second)
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-time.After(every):
			}
			writeRules(t, ts.ruleDir, "rules.yaml", soakRules(5+i%3))
		}
	})
	select {
	case <-ctx.Done():
	case <-time.After(d / 4):
	}
	heapMid = heapNow()
	if r != nil {
		select {
		case <-ctx.Done():
		case <-time.After(d / 4):
		}
		r.Kill()
		r.Restart()
		eventually(t, "SERVING after Redis restarted", func() bool {
			return healthStatus(t, cc, "") == healthpb.HealthCheckResponse_SERVING
		})
		st.since.Store(time.Now().UnixNano())
		st.okSince.Store(0)
	}
	wg.Wait()
	heapEnd = heapNow()

	check := request("soak", []string{"total", "all"})
	check.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
	resp, err := client.ShouldRateLimit(context.Background(), check)
	if err != nil {
		t.Fatalf("final check: %v", err)
	}
	final = resp.GetStatuses()[0].GetLimitRemaining()
	t.Logf("%v: %d OK, %d OVER_LIMIT, %d ext_proc streams, errors %v", d, st.ok.Load(), st.over.Load(), st.extproc.Load(), st.errs)
	if st.ok.Load() == 0 || st.over.Load() == 0 || st.extproc.Load() == 0 {
		t.Errorf("the load did not exercise every path")
	}
	return st, final, heapMid, heapEnd
}

// oneExtProcStream plays one request through ext_proc as Envoy does in
// observability mode: request headers, then response headers, then close.
func oneExtProcStream(c extprocv3.ExternalProcessorClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := c.Process(ctx)
	if err != nil {
		return err
	}
	attrs := map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{
		"xds.cluster_name": structpb.NewStringValue("backend"),
		"xds.route_name":   structpb.NewStringValue("soak"),
	}}}
	msgs := []*extprocv3.ProcessingRequest{
		{ObservabilityMode: true, Attributes: attrs, Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}},
		{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}},
		}}},
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}
