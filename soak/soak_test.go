// Package soak_test is Leapgate's soak test: a real server (package server,
// in-process, loopback ports) on a real, persistent redis-server, loaded for
// SOAK_DURATION with ShouldRateLimit calls, ext_proc streams, rule reloads
// (one of them bad) and one crash and restart of Redis; it then checks the
// error policy, exact global counts, the heap and goroutines.
package soak_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/server"
)

// defaultDuration is the load time when SOAK_DURATION is unset (CI).
const defaultDuration = 20 * time.Second

// heapGrowthBound is the most HeapInuse (after GC) may grow between a
// quarter of the run and its end. The live state of the run (rules, a few
// counters and breakers, gRPC connections) is bounded and reached within
// the first quarter, so growth beyond buffer churn means a leak. 16 MiB is
// generous: on the CI run the heap is a few MiB.
const heapGrowthBound = 16 << 20

// soakKey is one limited descriptor value (descriptor key "key").
type soakKey struct {
	name  string
	limit uint64
	// kind says how the load treats the key around the Redis restart.
	kind keyKind

	ok, over    atomic.Int64 // answers over the whole run
	okAfterKill atomic.Int64 // OK answers to calls started after the kill
	inflight    atomic.Int64 // calls in flight now
	// ambiguous counts calls that were in flight when Redis was killed and
	// failed: Redis may have recorded their hit without the answer arriving.
	ambiguous atomic.Int64
}

type keyKind int

const (
	// exhaustedEarly keys run out before the kill: after the restart they
	// must stay refused (their counts survived).
	exhaustedEarly keyKind = iota
	// crossing keys are consumed to half their limit before the kill, are
	// left idle across it, and are exhausted after the restart.
	crossing
	// unbounded has a limit the run never reaches: its count, read back at
	// the end, must equal its OK answers (up to ambiguous calls).
	unbounded
)

func newKeys() []*soakKey {
	return []*soakKey{
		{name: "early-a", limit: 30, kind: exhaustedEarly},
		{name: "early-b", limit: 80, kind: exhaustedEarly},
		{name: "cross-a", limit: 150, kind: crossing},
		{name: "cross-b", limit: 400, kind: crossing},
		{name: "open", limit: 1_000_000_000, kind: unbounded},
	}
}

// rulesVersion renders the rule file: version 1 or 2 differ only in rules
// the load does not use, so the limited rules stay identical.
func rulesVersion(keys []*soakKey, version int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# soak rules, version %d\ndomain: soak\ndescriptors:\n", version)
	for _, k := range keys {
		fmt.Fprintf(&b, "  - key: key\n    value: %s\n    rate_limit: {unit: day, requests_per_unit: %d}\n", k.name, k.limit)
	}
	b.WriteString(`  - key: destination_cluster
    value: flaky
    circuit_breaker:
      strategy: error_ratio
      threshold: 0.5
      min_requests: 20
      window: 10s
      buckets: 10
      open_duration: 300ms
      half_open_probes: 2
      probe_timeout: 1s
`)
	fmt.Fprintf(&b, "  - key: version\n    value: v%d\n    rate_limit: {unlimited: true}\n", version)
	if version == 2 {
		b.WriteString("  - key: path\n    value: /v2-only\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
	}
	return b.String()
}

// badRules is malformed YAML: it must be rejected while the last good rules
// keep serving.
const badRules = "domain: soak\ndescriptors:\n  - key: key\n    value: [unclosed\n    rate_limit: {unit: day\n"

// startPersistentRedis starts redis-server with an append-only file
// fsynced on every write, in its own directory; it is killed when the test
// ends.
//
// A SIGKILL of the process loses nothing Redis has write(2)n to the AOF: the
// kernel keeps it. appendfsync always matters for a crash of the host
// (power loss), which this test cannot cause; with appendfsync everysec the
// soak passes too, and with appendonly no it fails (counts lost).
func startPersistentRedis(t *testing.T) *redistest.Server {
	return redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
}

// writeAtomic replaces dir/name by a rename, as a ConfigMap update does, so
// the loader never sees a half-written file.
func writeAtomic(t *testing.T, dir, name, content string) {
	t.Helper()
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Error(err)
		return
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Error(err)
	}
}

// metricSum gathers reg and sums every series of the metric name.
func metricSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Errorf("gather: %v", err)
		return 0
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// errorLog tallies gRPC errors by code and by phase of the run.
type errorLog struct {
	mu sync.Mutex
	// byClass counts errors by "code/phase".
	byClass map[string]int
	// samples keeps the first few messages of each class.
	samples map[string][]string
}

func (e *errorLog) add(err error, phase string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.byClass == nil {
		e.byClass, e.samples = map[string]int{}, map[string][]string{}
	}
	class := status.Code(err).String() + "/" + phase
	e.byClass[class]++
	if len(e.samples[class]) < 3 {
		e.samples[class] = append(e.samples[class], err.Error())
	}
}

func (e *errorLog) sample(class string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.samples[class]...)
}

func (e *errorLog) snapshot() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]int, len(e.byClass))
	for k, v := range e.byClass {
		out[k] = v
	}
	return out
}

// outage records when Redis was killed and when the server was serving
// again; times are unix nanoseconds, 0 while not yet reached.
type outage struct {
	killedAt, servingAt atomic.Int64
}

// phase classifies a call by its start and end: "outage" if it overlapped
// the window from the kill until health said SERVING again.
func (o *outage) phase(start, end time.Time) string {
	k := o.killedAt.Load()
	if k == 0 || end.UnixNano() < k {
		return "before-outage"
	}
	if s := o.servingAt.Load(); s != 0 && start.UnixNano() > s {
		return "after-outage"
	}
	return "outage"
}

func request(descs ...[2]string) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "soak"}
	for _, kv := range descs {
		req.Descriptors = append(req.Descriptors, &rlcommonv3.RateLimitDescriptor{
			Entries: []*rlcommonv3.RateLimitDescriptor_Entry{{Key: kv[0], Value: kv[1]}},
		})
	}
	return req
}

// TestSoak is the soak described in the package comment.
func TestSoak(t *testing.T) {
	redistest.Need(t)
	d := defaultDuration
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d < 4*time.Second {
			t.Fatalf("SOAK_DURATION=%q: want a duration of at least 4s (%v)", v, err)
		}
	}
	baseline := goleak.IgnoreCurrent()
	setupStart := time.Now()

	redis := startPersistentRedis(t) // killed explicitly below on success

	keys := newKeys()
	ruleDir := filepath.Join(t.TempDir(), "config")
	if err := os.MkdirAll(ruleDir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, ruleDir, "rules.yaml", rulesVersion(keys, 1))

	s := config.Defaults()
	s.GRPCHost, s.Host, s.DebugHost = "127.0.0.1", "127.0.0.1", "127.0.0.1"
	s.GRPCPort, s.Port, s.DebugPort, s.ReportPort = 0, 0, 0, 0
	s.RuntimeRoot, s.RuntimeSubdirectory, s.RuntimeAppDirectory = filepath.Dir(ruleDir), "", filepath.Base(ruleDir)
	s.ReloadDebounce = 20 * time.Millisecond
	s.DrainTimeout = 10 * time.Second
	s.BackendType = config.BackendRedis
	s.Redis.URL = redis.Addr()
	s.Redis.FailureMode = config.RedisFailError
	// REDIS_TIMEOUT is generous: on a busy, shared 2-core machine under
	// -race a reply can take over a second, and a call that times out is
	// answered Unavailable although Redis may have recorded its hit (see
	// the README section), which would blur the exact counts. The crash
	// makes calls fail at once (connection reset or refused), not by timeout.
	s.Redis.Timeout = 5 * time.Second
	logs := &logTally{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv, err := server.New(s, logger)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	runCtx, stopServer := context.WithCancel(context.Background())
	defer stopServer()
	runErr := make(chan error, 1)
	go func() { runErr <- srv.Run(runCtx) }()

	cc, err := grpc.NewClient(srv.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	health := healthpb.NewHealthClient(cc)
	serving := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
	}
	waitFor(t, "the server SERVING with Redis up", 10*time.Second, serving)
	t.Logf("set-up took %v; load for %v", time.Since(setupStart).Round(time.Millisecond), d)

	rls := rlsv3.NewRateLimitServiceClient(cc)
	epc := extprocv3.NewExternalProcessorClient(cc)
	reg := srv.Registry()
	var (
		errs      errorLog
		out       outage
		killed    atomic.Bool
		calls     atomic.Int64
		ext       extStats
		reloads   reloadStats
		heapMid   uint64
		loadStart = time.Now()
	)
	loadCtx, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { // on a fatal failure: no goroutine may outlive the test
		stopLoad()
		wg.Wait()
	}()

	// ShouldRateLimit callers.
	const rlsWorkers = 12
	for w := range rlsWorkers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for loadCtx.Err() == nil {
				k := pickKey(rng, keys, killed.Load())
				if k == nil {
					time.Sleep(time.Millisecond)
					continue
				}
				k.inflight.Add(1)
				wasKilled := killed.Load()
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				resp, err := rls.ShouldRateLimit(ctx, request([2]string{"key", k.name}))
				cancel()
				end := time.Now()
				calls.Add(1)
				if err != nil {
					k.inflight.Add(-1)
					if !wasKilled && killed.Load() {
						k.ambiguous.Add(1)
					}
					errs.add(err, out.phase(start, end))
					time.Sleep(5 * time.Millisecond) // a client backs off on errors
					continue
				}
				switch resp.GetOverallCode() {
				case rlsv3.RateLimitResponse_OK:
					k.ok.Add(1)
					if wasKilled {
						k.okAfterKill.Add(1)
					}
				case rlsv3.RateLimitResponse_OVER_LIMIT:
					k.over.Add(1)
				default:
					t.Errorf("key %s: answer code %v", k.name, resp.GetOverallCode())
				}
				k.inflight.Add(-1)
			}
		})
	}

	// ext_proc streams feeding the breaker of cluster "flaky": two in
	// observability mode, two in blocking mode.
	for w := range 4 {
		blocking := w%2 == 1
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			for loadCtx.Err() == nil {
				status503 := rng.IntN(10) < 6
				var err error
				if blocking {
					err = blockingStream(epc, status503, &ext)
				} else {
					err = observingStream(epc, status503)
					ext.observed.Add(1)
				}
				if err != nil {
					ext.errors.Add(1)
					errs.add(err, "ext_proc")
				}
			}
		})
	}

	// Rule reloads: every few seconds alternate two good versions; the
	// third write is a bad file, which must be rejected.
	wg.Go(func() {
		every := min(max(d/8, time.Second), 3*time.Second)
		for i := 1; ; i++ {
			select {
			case <-loadCtx.Done():
				return
			case <-time.After(every):
			}
			before := metricSum(t, reg, "ratelimit_service_config_load_success")
			beforeErr := metricSum(t, reg, "ratelimit_service_config_load_error")
			if i == 3 {
				writeAtomic(t, ruleDir, "rules.yaml", badRules)
				if !poll(loadCtx, 5*time.Second, func() bool {
					return metricSum(t, reg, "ratelimit_service_config_load_error") > beforeErr
				}) && loadCtx.Err() == nil {
					t.Errorf("the bad rule file was not reported by ratelimit_service_config_load_error")
				}
				// The last good rules still serve: the limit of a key is
				// still the configured one.
				open := keys[len(keys)-1]
				check := request([2]string{"key", open.name})
				check.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
				resp, err := rls.ShouldRateLimit(loadCtx, check)
				switch {
				case err != nil && !killed.Load() && loadCtx.Err() == nil:
					t.Errorf("with the bad rule file: %v", err)
				case err == nil && resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != uint32(open.limit):
					t.Errorf("with the bad rule file, key %s answered %v: the last good rules are not serving", open.name, resp)
				}
				reloads.bad.Add(1)
				continue
			}
			writeAtomic(t, ruleDir, "rules.yaml", rulesVersion(keys, 1+i%2))
			if !poll(loadCtx, 5*time.Second, func() bool {
				return metricSum(t, reg, "ratelimit_service_config_load_success") > before
			}) && loadCtx.Err() == nil {
				t.Errorf("rule version %d was not loaded", 1+i%2)
			}
			reloads.good.Add(1)
		}
	})

	// A quarter in: the heap sample.
	sleepCtx(loadCtx, d/4)
	heapMid = heapInuse()

	// Half-way (once the early keys are exhausted and the crossing keys
	// are half used and idle): kill Redis, leave it down a moment, restart
	// it on the same port.
	sleepCtx(loadCtx, d/4)
	ready := poll(loadCtx, d/4, func() bool { return readyToKill(keys) })
	if !ready {
		t.Logf("killing Redis before the keys were ready (slow machine; the checks per key kind are skipped, exact counts are not): %s", keyState(keys))
	}
	killedAt := time.Now()
	out.killedAt.Store(killedAt.UnixNano())
	killed.Store(true)
	redis.Kill()
	if !poll(context.Background(), 10*time.Second, func() bool { return !serving() }) {
		t.Errorf("health did not turn NOT_SERVING with Redis down (failure mode error)")
	}
	time.Sleep(time.Second) // Redis stays down: calls meet the failure mode
	redis.Restart()
	restartedAt := time.Now()
	waitFor(t, "the server SERVING after Redis restarted", 10*time.Second, serving)
	out.servingAt.Store(time.Now().UnixNano())
	servingAgain := time.Now()

	// The end: after d, or up to d/2 later while a limited key has not
	// been refused yet (a slow machine).
	sleepCtx(context.Background(), time.Until(loadStart.Add(d)))
	if !poll(context.Background(), d/2, func() bool { return allRefused(keys) }) {
		t.Logf("load ended at %v without every limited key refused", d+d/2)
	}
	stopLoad()
	wg.Wait()
	loadTime := time.Since(loadStart)
	heapEnd := heapInuse()

	// Counts read back from Redis through the server (hits_addend 0 only
	// checks), after the load.
	remaining := make(map[string]uint32, len(keys))
	for _, k := range keys {
		check := request([2]string{"key", k.name})
		check.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
		resp, err := rls.ShouldRateLimit(context.Background(), check)
		if err != nil {
			t.Fatalf("final check of %s: %v", k.name, err)
		}
		remaining[k.name] = resp.GetStatuses()[0].GetLimitRemaining()
	}
	panics := metricSum(t, reg, "leapgate_panics_recovered_total")
	loadErrors := metricSum(t, reg, "ratelimit_service_config_load_error")
	loadOK := metricSum(t, reg, "ratelimit_service_config_load_success")

	// Shutdown: Run must return nil, then every goroutine must end.
	stopServer()
	select {
	case err := <-runErr:
		if err != nil {
			t.Errorf("Run returned %v, want nil after a requested shutdown", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("server did not shut down within 30s")
	}
	cc.Close()
	redis.Kill()

	// Report.
	var total int64
	t.Logf("load %v (%d ShouldRateLimit calls, %.0f/s); Redis killed at +%v, restarted at +%v, server SERVING again at +%v",
		loadTime.Round(time.Millisecond), calls.Load(), float64(calls.Load())/loadTime.Seconds(),
		killedAt.Sub(loadStart).Round(time.Millisecond), restartedAt.Sub(loadStart).Round(time.Millisecond),
		servingAgain.Sub(loadStart).Round(time.Millisecond))
	for _, k := range keys {
		total += k.ok.Load() + k.over.Load()
		t.Logf("key %-8s limit %10d: %6d OK (%d after the kill), %6d OVER_LIMIT, %d ambiguous, remaining %d",
			k.name, k.limit, k.ok.Load(), k.okAfterKill.Load(), k.over.Load(), k.ambiguous.Load(), remaining[k.name])
	}
	classes := errs.snapshot()
	t.Logf("answers %d; errors by class: %s", total, formatClasses(classes))
	t.Logf("ext_proc: %d observability streams, %d blocking streams (%d continued, %d refused by the open breaker), %d errors",
		ext.observed.Load(), ext.continued.Load()+ext.refused.Load(), ext.continued.Load(), ext.refused.Load(), ext.errors.Load())
	t.Logf("reloads: %d good and %d bad written; config loads %v OK, %v rejected", reloads.good.Load(), reloads.bad.Load(), loadOK, loadErrors)
	t.Logf("heap in use after GC: %d KiB at a quarter, %d KiB at the end (bound: +%d KiB)", heapMid>>10, heapEnd>>10, heapGrowthBound>>10)
	t.Logf("Redis append-only files: %d bytes", dirSize(redis.Dir))
	t.Logf("server log: %d warnings, %d errors", logs.warn.Load(), logs.err.Load())
	for _, line := range logs.errorLines() {
		t.Logf("server error log: %s", line)
	}

	// Errors: only Unavailable, and only for calls overlapping the outage.
	for class, n := range classes {
		if class != codes.Unavailable.String()+"/outage" {
			t.Errorf("%d unexpected errors of class %s (allowed: Unavailable during the Redis outage), e.g. %q", n, class, errs.sample(class))
		}
	}
	if classes[codes.Unavailable.String()+"/outage"] == 0 {
		t.Errorf("no call failed during the Redis outage: the outage was not exercised")
	}
	if panics != 0 {
		t.Errorf("%v panics recovered", panics)
	}

	// Exact counts.
	for _, k := range keys {
		ok, amb := uint64(k.ok.Load()), uint64(k.ambiguous.Load())
		used := k.limit - uint64(remaining[k.name])
		switch k.kind {
		case exhaustedEarly, crossing:
			if k.over.Load() == 0 {
				t.Errorf("key %s: never refused: demand did not exceed the limit %d (machine too slow?)", k.name, k.limit)
			}
			// With the keys ready at the kill, no call that could record a
			// hit was cut by it (early keys refuse, crossing keys idle):
			// the count must be exact. Otherwise a cut call may have been
			// recorded without its answer arriving.
			exact := amb == 0 || ready
			if exact && ok != k.limit {
				t.Errorf("key %s: %d OK answers over the run, want exactly the limit %d", k.name, ok, k.limit)
			}
			if !exact && (ok > k.limit || ok+amb < k.limit) {
				t.Errorf("key %s: %d OK answers and %d calls cut by the kill, want OK in [limit-%d, limit] = [%d, %d]",
					k.name, ok, amb, amb, k.limit-amb, k.limit)
			}
			if remaining[k.name] != 0 {
				t.Errorf("key %s: %d remaining at the end, want 0", k.name, remaining[k.name])
			}
		case unbounded:
			// Calls cut by the kill may have been recorded without an
			// answer; nothing else may differ.
			if used < ok || used > ok+amb {
				t.Errorf("key %s: Redis counted %d hits, want the %d OK answers (+ up to %d calls cut by the kill)", k.name, used, ok, amb)
			}
		}
		if !ready {
			continue
		}
		if k.kind == exhaustedEarly && k.okAfterKill.Load() != 0 {
			t.Errorf("key %s: %d OK answers after the restart to a key exhausted before it: counts were lost", k.name, k.okAfterKill.Load())
		}
		if k.kind == crossing && (k.okAfterKill.Load() == 0 || k.ok.Load()-k.okAfterKill.Load() == 0) {
			t.Errorf("key %s: %d OK before and %d after the kill: the key did not cross the restart", k.name, k.ok.Load()-k.okAfterKill.Load(), k.okAfterKill.Load())
		}
	}

	// ext_proc: never an error (it does not touch Redis); both answers of
	// blocking mode seen.
	if ext.observed.Load() == 0 || ext.continued.Load() == 0 || ext.refused.Load() == 0 {
		t.Errorf("ext_proc load did not exercise every path: %d observed, %d continued, %d refused", ext.observed.Load(), ext.continued.Load(), ext.refused.Load())
	}

	// Reloads: the bad file rejected once, every good version loaded.
	if loadErrors != float64(reloads.bad.Load()) {
		t.Errorf("ratelimit_service_config_load_error = %v, want %d (the bad file)", loadErrors, reloads.bad.Load())
	}
	if reloads.good.Load() < 2 || reloads.bad.Load() != 1 {
		t.Errorf("%d good and %d bad rule writes: the run was too short to exercise reloads", reloads.good.Load(), reloads.bad.Load())
	}

	// Heap.
	if heapEnd > heapMid && heapEnd-heapMid > heapGrowthBound {
		t.Errorf("heap in use grew from %d KiB to %d KiB (bound +%d KiB)", heapMid>>10, heapEnd>>10, heapGrowthBound>>10)
	}

	// Goroutines back to the baseline.
	if err := goleak.Find(baseline); err != nil {
		t.Errorf("goroutines left after shutdown: %v", err)
	}
}

// pickKey chooses a key for the next call, or nil if none may be called
// now: before the kill, crossing keys are used only up to half their limit;
// after it, they get most calls (to be exhausted in the time left).
func pickKey(rng *rand.Rand, keys []*soakKey, killed bool) *soakKey {
	for range 2 * len(keys) {
		k := keys[rng.IntN(len(keys))]
		if killed && k.kind != crossing && rng.IntN(3) != 0 {
			continue
		}
		if !killed && k.kind == crossing && uint64(k.ok.Load()) >= k.limit/2 {
			continue
		}
		return k
	}
	return nil
}

// readyToKill reports whether a Redis crash now cannot blur the exact
// counts: early keys exhausted (their in-flight calls are refused, which
// records nothing), crossing keys half used and idle.
func readyToKill(keys []*soakKey) bool {
	for _, k := range keys {
		switch k.kind {
		case exhaustedEarly:
			if k.over.Load() == 0 {
				return false
			}
		case crossing:
			if uint64(k.ok.Load()) < k.limit/2 || k.inflight.Load() != 0 {
				return false
			}
		}
	}
	return true
}

// allRefused reports whether every limited key has been refused at least
// once: demand exceeded its limit.
func allRefused(keys []*soakKey) bool {
	for _, k := range keys {
		if k.kind != unbounded && k.over.Load() == 0 {
			return false
		}
	}
	return true
}

func keyState(keys []*soakKey) string {
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d/%d OK, %d refused, %d in flight", k.name, k.ok.Load(), k.limit, k.over.Load(), k.inflight.Load()))
	}
	return strings.Join(parts, "; ")
}

func formatClasses(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

type extStats struct {
	observed, continued, refused, errors atomic.Int64
}

type reloadStats struct {
	good, bad atomic.Int64
}

// logTally counts the server's warning and error log lines and keeps the
// first few errors.
type logTally struct {
	warn, err atomic.Int64
	mu        sync.Mutex
	errs      []string
}

func (l *logTally) errorLines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.errs...)
}

func (l *logTally) Write(p []byte) (int, error) {
	s := string(p)
	switch {
	case strings.Contains(s, "level=ERROR"):
		l.err.Add(1)
		l.mu.Lock()
		if len(l.errs) < 10 {
			l.errs = append(l.errs, strings.TrimSpace(s))
		}
		l.mu.Unlock()
	case strings.Contains(s, "level=WARN"):
		l.warn.Add(1)
	}
	return len(p), nil
}

var flakyAttrs = map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{
	"xds.cluster_name": structpb.NewStringValue("flaky"),
	"xds.route_name":   structpb.NewStringValue("soak"),
}}}

func responseHeaders(status503 bool) *extprocv3.HttpHeaders {
	code := "200"
	if status503 {
		code = "503"
	}
	return &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(code)}}}}
}

// observingStream plays one request as Envoy does in observability mode:
// request headers, response headers, close; nothing comes back.
func observingStream(c extprocv3.ExternalProcessorClient, status503 bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := c.Process(ctx)
	if err != nil {
		return err
	}
	for _, m := range []*extprocv3.ProcessingRequest{
		{ObservabilityMode: true, Attributes: flakyAttrs, Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}},
		{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: responseHeaders(status503)}},
	} {
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	return drain(stream)
}

// blockingStream plays one request in blocking mode: request headers are
// answered CONTINUE (then the response headers are sent and answered) or,
// with the breaker open, by an immediate 503.
func blockingStream(c extprocv3.ExternalProcessorClient, status503 bool, st *extStats) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := c.Process(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Attributes: flakyAttrs,
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}}); err != nil {
		return err
	}
	resp, err := stream.Recv()
	if err != nil {
		return err
	}
	switch r := resp.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		if got := r.ImmediateResponse.GetStatus().GetCode(); got != 503 {
			return status.Errorf(codes.Unknown, "immediate response %v, want 503", got)
		}
		st.refused.Add(1)
		stream.CloseSend()
		return drain(stream)
	case *extprocv3.ProcessingResponse_RequestHeaders:
	default:
		return status.Errorf(codes.Unknown, "unexpected answer to request headers: %T", r)
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: responseHeaders(status503)}}); err != nil {
		return err
	}
	if resp, err = stream.Recv(); err != nil {
		return err
	}
	if resp.GetResponseHeaders() == nil {
		return status.Errorf(codes.Unknown, "unexpected answer to response headers: %T", resp.GetResponse())
	}
	st.continued.Add(1)
	if err := stream.CloseSend(); err != nil {
		return err
	}
	return drain(stream)
}

// drain reads the stream to its end; io.EOF is a clean end.
func drain(stream extprocv3.ExternalProcessor_ProcessClient) error {
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// dirSize returns the total size of the regular files under dir.
func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, e os.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			if fi, err := e.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// heapInuse returns HeapInuse after a full collection.
func heapInuse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// sleepCtx waits for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// poll checks cond every 10ms until it holds (true), ctx ends or max
// passes (false). It waits for asynchronous events, never for time-window
// edges.
func poll(ctx context.Context, max time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(max)
	for !cond() {
		if ctx.Err() != nil || time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// waitFor polls cond until it holds or fails the test after max.
func waitFor(t *testing.T, what string, max time.Duration, cond func() bool) {
	t.Helper()
	if !poll(context.Background(), max, cond) {
		t.Fatalf("timed out after %v waiting for %s", max, what)
	}
}
