package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/leapgate/leapgate/internal/redistest"
)

// The comparison (-compare): Leapgate in memory, Leapgate on Redis and
// envoyproxy/ratelimit on the same redis-server, next to the empty-handler
// ceiling, under one load, in interleaved rounds so that drift in the
// machine's speed touches every target alike.

// peerModule is envoyproxy/ratelimit's Go module; peerRunner its service's
// entry point, which the generated main calls.
const (
	peerModule = "github.com/envoyproxy/ratelimit"
	peerRunner = peerModule + "/src/service_cmd/runner"
)

// comparedRules is a rule set both services read (the peer knows no
// Leapgate extension).
const comparedRules = `domain: bench
descriptors:
  - key: generic_key
    value: hot
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
`

// target is one service the comparison measures.
type target struct {
	name  string
	addr  string
	http  string // Leapgate's HTTP listener, for /metrics; "" for the others
	pid   int
	redis bool // runs on the shared redis-server: its CPU is measured
}

// buildPeer builds envoyproxy/ratelimit at version into dir, from a module
// of its own so that the main module never depends on it.
func buildPeer(dir, version string) (string, error) {
	mod := filepath.Join(dir, "peer")
	if err := os.MkdirAll(mod, 0o755); err != nil {
		return "", err
	}
	main := fmt.Sprintf(`package main

import (
	"%s"
	"%s/src/settings"
)

func main() {
	r := runner.NewRunner(settings.NewSettings())
	r.Run()
}
`, peerRunner, peerModule)
	if err := os.WriteFile(filepath.Join(mod, "main.go"), []byte(main), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte("module peer\n\ngo 1.24\n"), 0o644); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "ratelimit-peer")
	for _, args := range [][]string{{"get", peerModule + "@" + version}, {"mod", "tidy"}, {"build", "-o", bin, "."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = mod
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go %s (building %s@%s): %w\n%s", strings.Join(args, " "), peerModule, version, err, out)
		}
	}
	return bin, nil
}

// comparedScenarios are the two loads of the comparison: 1,000 distinct
// keys (the common case) and one hot key (a global limit).
func comparedScenarios() []scenario {
	keyed := make([]*rlsv3.RateLimitRequest, 1000)
	for i := range keyed {
		keyed[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "u"+strconv.Itoa(i))}}
	}
	hot := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("generic_key", "hot")}}
	return []scenario{
		{name: "1,000 keys", request: func(i uint64) *rlsv3.RateLimitRequest { return keyed[i%uint64(len(keyed))] }},
		{name: "hot key", request: func(uint64) *rlsv3.RateLimitRequest { return hot }},
	}
}

// runCompare runs the comparison and prints its table.
func runCompare(cfg config, binary, candidate, peerVersion string, rounds int) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "leapgate-compare-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if binary, err = buildRatelimit(dir, binary); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "building %s@%s ...\n", peerModule, peerVersion)
	peer, err := buildPeer(dir, peerVersion)
	if err != nil {
		return err
	}
	// envoyproxy/ratelimit reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config;
	// so does Leapgate.
	if err := writeRuleFile(filepath.Join(dir, "runtime", "ratelimit", "config"), comparedRules); err != nil {
		return err
	}

	rs, redisAddr, err := redistest.Spawn(ctx)
	if err != nil {
		return err
	}
	defer stop(rs)
	rc := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rc.Close()

	self, err := os.Executable()
	if err != nil {
		return err
	}
	var targets []target
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			stop(p)
		}
	}()
	start := func(name string, redisBacked bool, path string, env []string, args ...string) error {
		grpcAddr, httpAddr, listen := listenerEnv()
		if path == self {
			args = []string{"-serve-empty", grpcAddr}
		}
		env = append(env, listen...)
		p, err := startProcess(ctx, path, env, args...)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		procs = append(procs, p)
		if path == self {
			err = waitTCP(grpcAddr, 10*time.Second)
		} else {
			err = waitServing(ctx, grpcAddr, 30*time.Second)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		tg := target{name: name, addr: grpcAddr, pid: p.Process.Pid, redis: redisBacked}
		if path == binary || path == candidate {
			tg.http = httpAddr
		}
		targets = append(targets, tg)
		return nil
	}
	runtimeEnv := []string{"RUNTIME_ROOT=" + filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "LOG_LEVEL=warn"}
	redisEnv := []string{"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=single", "REDIS_URL=" + redisAddr}
	if err := start("empty handler (ceiling)", false, self, nil); err != nil {
		return err
	}
	if err := start("Leapgate, in memory", false, binary, append(runtimeEnv, "BACKEND_TYPE=memory")); err != nil {
		return err
	}
	if err := start("Leapgate, Redis", true, binary, append(runtimeEnv, redisEnv...)); err != nil {
		return err
	}
	// The same binary with every request sent to Redis: what blocks of
	// quota (REDIS_RESERVATION, docs/redis.md) save.
	if err := start("Leapgate, Redis, no blocks", true, binary, append(runtimeEnv, append(redisEnv, "REDIS_RESERVATION=0")...)); err != nil {
		return err
	}
	if candidate != "" {
		if err := start("candidate, Redis", true, candidate, append(runtimeEnv, redisEnv...)); err != nil {
			return err
		}
	}
	if err := start("envoyproxy/ratelimit, Redis", true, peer, append(runtimeEnv, append(redisEnv, "USE_STATSD=false", "RUNTIME_WATCH_ROOT=false")...)); err != nil {
		return err
	}

	// rows[scenario][target] collects one measurement per round.
	type sample struct {
		rps      float64
		p99      time.Duration
		cpuPer1k time.Duration // Redis CPU per 1,000 requests
		svcPer1k time.Duration // the service's own CPU per 1,000 requests
	}
	scs := comparedScenarios()
	rows := make([][][]sample, len(scs))
	for s := range rows {
		rows[s] = make([][]sample, len(targets))
	}
	for round := range rounds {
		for s, sc := range scs {
			for t, tg := range targets {
				before, err := redisCPU(ctx, rc)
				if err != nil {
					return err
				}
				svcBefore := processCPU(tg.pid)
				r, err := measure(ctx, cfg, tg.addr, sc, tg.name)
				if err != nil {
					return fmt.Errorf("round %d, %s, %s: %w", round+1, sc.name, tg.name, err)
				}
				after, err := redisCPU(ctx, rc)
				if err != nil {
					return err
				}
				var cpu time.Duration
				if tg.redis && r.totalRequests > 0 {
					cpu = (after - before) * 1000 / time.Duration(r.totalRequests)
				}
				svc := (processCPU(tg.pid) - svcBefore) * 1000 / time.Duration(max(r.totalRequests, 1))
				rows[s][t] = append(rows[s][t], sample{rps: r.rps, p99: r.p99, cpuPer1k: cpu, svcPer1k: svc})
				fmt.Fprintf(os.Stderr, "round %d/%d: %-14s %-30s %8.0f req/s  p99 %v%s\n", round+1, rounds, sc.name, tg.name, r.rps, round2(r.p99), pipelineShare(tg))
			}
		}
	}

	w := io.Writer(os.Stdout)
	fmt.Fprintf(w, "Machine: %d CPUs, %s %s/%s; load generator, services and redis-server share it.\n",
		runtime.NumCPU(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(w, "%d concurrent callers over %d gRPC connection(s); %v measured per target and scenario after %v warm-up; %d interleaved rounds, medians shown. envoyproxy/ratelimit %s, default settings.\n\n",
		cfg.concurrency, cfg.connections, cfg.duration, cfg.warmup, rounds, peerVersion)
	fmt.Fprintln(w, "| scenario | target | req/s | share of ceiling | vs envoyproxy/ratelimit | p99 | service CPU per 1,000 requests | Redis CPU per 1,000 requests | Redis CPU vs envoyproxy/ratelimit |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|")
	median := func(xs []float64) float64 {
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	for s, sc := range scs {
		med := make([]float64, len(targets))
		for t := range targets {
			var xs []float64
			for _, m := range rows[s][t] {
				xs = append(xs, m.rps)
			}
			med[t] = median(xs)
		}
		ceiling, peerRPS := med[0], med[len(med)-1]
		redisCPU := func(t int) float64 {
			var cpus []float64
			for _, m := range rows[s][t] {
				cpus = append(cpus, float64(m.cpuPer1k))
			}
			return median(cpus)
		}
		peerCPU := redisCPU(len(targets) - 1)
		for t, tg := range targets {
			var p99s, svcs []float64
			for _, m := range rows[s][t] {
				p99s = append(p99s, float64(m.p99))
				svcs = append(svcs, float64(m.svcPer1k))
			}
			cpu, vsPeer := "-", "-"
			if tg.redis {
				cpu = round2(time.Duration(redisCPU(t))).String()
				if peerCPU > 0 {
					vsPeer = fmt.Sprintf("%.2f", redisCPU(t)/peerCPU)
				}
			}
			fmt.Fprintf(w, "| %s | %s | %.0f | %.2f | %.2f | %v | %v | %s | %s |\n", sc.name, tg.name, med[t], med[t]/ceiling, med[t]/peerRPS,
				round2(time.Duration(median(p99s))), round2(time.Duration(median(svcs))), cpu, vsPeer)
		}
	}
	return nil
}

// pipelineShare reads Leapgate's leapgate_redis_pipeline_operations
// histogram (cumulative since start) and describes it, or "".
func pipelineShare(tg target) string {
	if tg.http == "" || !tg.redis {
		return ""
	}
	resp, err := http.Get("http://" + tg.http + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var sum, count float64
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "leapgate_redis_pipeline_operations_sum "); ok {
			sum, _ = strconv.ParseFloat(v, 64)
		}
		if v, ok := strings.CutPrefix(line, "leapgate_redis_pipeline_operations_count "); ok {
			count, _ = strconv.ParseFloat(v, 64)
		}
	}
	if count == 0 {
		return ""
	}
	return fmt.Sprintf("  (so far %.1f operations per round trip)", sum/count)
}

// redisCPU is the CPU time redis-server has used (INFO cpu: system plus
// user, main thread and children).
func redisCPU(ctx context.Context, rc *redis.Client) (time.Duration, error) {
	info, err := rc.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO cpu: %w", err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu %s=%q: %w", k, v, err)
		}
		total += f
	}
	return time.Duration(total * float64(time.Second)), nil
}

// processCPU is the CPU time (user plus system) process pid has used, from
// /proc/pid/stat; 0 where there is no /proc.
func processCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the command name (which may hold spaces) in
	// parentheses: utime and stime are the 12th and 13th, in clock ticks.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/pid/stat times (100
// on every Linux architecture Go supports).
const clockTicks = 100

// round2 rounds d for a table: to 10 µs above a millisecond, else to 1 µs.
func round2(d time.Duration) time.Duration {
	if d >= time.Millisecond {
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}
