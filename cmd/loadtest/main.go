// Command loadtest drives the real ratelimit binary over loopback gRPC and
// reports requests per second and latency percentiles per scenario, next to
// a ceiling: the same kind of gRPC server whose handler does nothing.
//
// It builds ./cmd/ratelimit (unless -binary is given), starts it with a
// generated rule directory on free loopback ports, runs each scenario for
// -duration after a warm-up, and prints a markdown table. With -backend
// redis (or both) it also starts a redis-server on a free port.
//
//	go run ./cmd/loadtest -duration 10s -concurrency 32
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/leapgate/leapgate/internal/redistest"
)

// rules is the rule set the service under test serves. Limits are high so
// the load measures the decision path, not refusals.
const rules = `domain: bench
descriptors:
  - key: generic_key
    value: hot
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: destination_cluster
    value: backend
    circuit_breaker:
      strategy: slow_request_ratio
      max_response_time: 1s
      threshold: 0.9
      min_requests: 1000000
`

func main() {
	var (
		binary      = flag.String("binary", "", "ratelimit binary to test (default: build ./cmd/ratelimit)")
		duration    = flag.Duration("duration", 10*time.Second, "measured time per scenario")
		warmup      = flag.Duration("warmup", 2*time.Second, "unmeasured time before each scenario")
		concurrency = flag.Int("concurrency", 32, "concurrent callers")
		backends    = flag.String("backend", "memory", "memory, redis or both")
		extprocRate = flag.Int("extproc-workers", 4, "concurrent ext_proc stream openers in the +ext_proc scenarios")
		connections = flag.Int("connections", 4, "gRPC connections the callers share")
		compare     = flag.Bool("compare", false, "compare Leapgate (memory, Redis) with envoyproxy/ratelimit on one redis-server, in interleaved rounds")
		rounds      = flag.Int("rounds", 3, "rounds of the -compare measurements")
		candidate   = flag.String("candidate", "", "another ratelimit binary that -compare also measures on Redis, interleaved (an A/B of a change)")
		peerVersion = flag.String("peer-version", "v1.4.1-0.20260122083618-3fb702589d36", "version of github.com/envoyproxy/ratelimit that -compare builds")
		serveEmpty  = flag.String("serve-empty", "", "internal: serve the empty-handler ceiling on this address")
	)
	flag.Parse()
	if *serveEmpty != "" {
		if err := runEmptyServer(*serveEmpty); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	cfg := config{duration: *duration, warmup: *warmup, concurrency: *concurrency, connections: max(*connections, 1), extprocWorkers: *extprocRate}
	if *compare {
		if err := runCompare(cfg, *binary, *candidate, *peerVersion, max(*rounds, 1)); err != nil {
			fmt.Fprintln(os.Stderr, "loadtest:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(cfg, *binary, *backends); err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

type config struct {
	duration, warmup time.Duration
	concurrency      int
	connections      int
	extprocWorkers   int
}

// scenario is one kind of request stream.
type scenario struct {
	name    string
	extproc bool
	request func(i uint64) *rlsv3.RateLimitRequest
}

func descriptor(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func scenarios() []scenario {
	hot := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("generic_key", "hot")}}
	three := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		descriptor("generic_key", "hot"), descriptor("user", "alice"), descriptor("path", "/api/orders"),
	}}
	// 100k distinct values, pre-built so the client does not allocate them
	// on the measured path.
	keyed := make([]*rlsv3.RateLimitRequest, 100_000)
	for i := range keyed {
		keyed[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "u"+strconv.Itoa(i))}}
	}
	return []scenario{
		{name: "1 descriptor, hot key", request: func(uint64) *rlsv3.RateLimitRequest { return hot }},
		{name: "1 descriptor, 100k keys", request: func(i uint64) *rlsv3.RateLimitRequest { return keyed[i%uint64(len(keyed))] }},
		{name: "3 descriptors", request: func(uint64) *rlsv3.RateLimitRequest { return three }},
		{name: "1 descriptor, hot key + ext_proc streams", extproc: true, request: func(uint64) *rlsv3.RateLimitRequest { return hot }},
	}
}

// result is what one scenario measured.
type result struct {
	scenario, backend string
	requests, errors  uint64
	totalRequests     uint64 // calls made, warm-up included
	rps               float64
	p50, p99, p999    time.Duration
	streams           uint64 // ext_proc streams completed alongside
}

func run(cfg config, binary, backends string) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "leapgate-loadtest-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if binary, err = buildRatelimit(dir, binary); err != nil {
		return err
	}
	if err := writeRuleFile(filepath.Join(dir, "runtime", "config"), rules); err != nil {
		return err
	}

	var results []result

	// The ceiling: this program re-executed as an empty-handler server.
	self, err := os.Executable()
	if err != nil {
		return err
	}
	ceilAddr, err := freeAddr()
	if err != nil {
		return err
	}
	ceil, err := startProcess(ctx, self, nil, "-serve-empty", ceilAddr)
	if err != nil {
		return err
	}
	if err := waitTCP(ceilAddr, 10*time.Second); err != nil {
		stop(ceil)
		return err
	}
	hot := scenarios()[0]
	r, err := measure(ctx, cfg, ceilAddr, scenario{name: "ceiling: empty handler, 1 descriptor", request: hot.request}, "-")
	stop(ceil)
	if err != nil {
		return fmt.Errorf("ceiling: %w", err)
	}
	results = append(results, r)
	ceiling := r.rps

	for _, backend := range strings.Split(backendList(backends), ",") {
		env := []string{
			"RUNTIME_ROOT=" + filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=", "RUNTIME_APPDIRECTORY=config",
			"LOG_LEVEL=warn", "BACKEND_TYPE=" + backend,
		}
		var redis *exec.Cmd
		if backend == "redis" {
			var addr string
			var err error
			if redis, addr, err = redistest.Spawn(ctx); err != nil {
				return err
			}
			env = append(env, "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+addr, "REDIS_TYPE=single")
		}
		grpcAddr, _, listen := listenerEnv()
		env = append(env, listen...)
		svc, err := startProcess(ctx, binary, env)
		if err != nil {
			stop(redis)
			return err
		}
		if err := waitServing(ctx, grpcAddr, 30*time.Second); err != nil {
			stop(svc)
			stop(redis)
			return err
		}
		for _, sc := range scenarios() {
			r, err := measure(ctx, cfg, grpcAddr, sc, backend)
			if err != nil {
				stop(svc)
				stop(redis)
				return fmt.Errorf("%s/%s: %w", sc.name, backend, err)
			}
			results = append(results, r)
		}
		stop(svc)
		stop(redis)
	}
	printTable(os.Stdout, cfg, results, ceiling)
	return nil
}

func backendList(s string) string {
	if s == "both" {
		return "memory,redis"
	}
	return s
}

func hostPort(prefix, addr string) []string {
	host, port, _ := net.SplitHostPort(addr)
	p := prefix
	if p != "" {
		p += "_"
	}
	return []string{p + "HOST=" + host, p + "PORT=" + port}
}

// measure runs one scenario against addr: a warm-up, then cfg.duration of
// measured calls from cfg.concurrency callers spread over four connections.
func measure(ctx context.Context, cfg config, addr string, sc scenario, backend string) (result, error) {
	conns := make([]*grpc.ClientConn, cfg.connections)
	for i := range conns {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return result{}, err
		}
		defer c.Close()
		conns[i] = c
	}
	var streams atomic.Uint64
	stopExtProc := make(chan struct{})
	var extWG sync.WaitGroup
	if sc.extproc {
		for i := 0; i < cfg.extprocWorkers; i++ {
			extWG.Add(1)
			go func(conn *grpc.ClientConn) {
				defer extWG.Done()
				client := extprocv3.NewExternalProcessorClient(conn)
				for {
					select {
					case <-stopExtProc:
						return
					default:
					}
					if err := oneExtProcStream(ctx, client); err == nil {
						streams.Add(1)
					}
				}
			}(conns[i%len(conns)])
		}
	}

	var (
		counter  atomic.Uint64
		measured atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		all      []time.Duration
		errs     atomic.Uint64
		firstErr atomic.Value
	)
	deadline := time.Now().Add(cfg.warmup + cfg.duration)
	var measureStart time.Time
	time.AfterFunc(cfg.warmup, func() {
		measured.Store(true)
		streams.Store(0)
	})
	measureStart = time.Now().Add(cfg.warmup)
	for w := 0; w < cfg.concurrency; w++ {
		wg.Add(1)
		go func(client rlsv3.RateLimitServiceClient) {
			defer wg.Done()
			lat := make([]time.Duration, 0, 1<<16)
			for time.Now().Before(deadline) {
				i := counter.Add(1)
				start := time.Now()
				_, err := client.ShouldRateLimit(ctx, sc.request(i))
				took := time.Since(start)
				if !measured.Load() {
					continue
				}
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				lat = append(lat, took)
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		}(rlsv3.NewRateLimitServiceClient(conns[w%len(conns)]))
	}
	wg.Wait()
	elapsed := time.Since(measureStart)
	close(stopExtProc)
	extWG.Wait()
	if len(all) == 0 {
		msg, _ := firstErr.Load().(string)
		return result{}, fmt.Errorf("no successful call (%d errors; first: %s)", errs.Load(), msg)
	}
	slices.Sort(all)
	pct := func(p float64) time.Duration { return all[min(len(all)-1, int(float64(len(all))*p))] }
	return result{
		scenario: sc.name, backend: backend,
		requests: uint64(len(all)), errors: errs.Load(), totalRequests: counter.Load(),
		rps: float64(len(all)) / elapsed.Seconds(),
		p50: pct(0.50), p99: pct(0.99), p999: pct(0.999),
		streams: streams.Load(),
	}, nil
}

// oneExtProcStream plays one observability-mode ext_proc stream as Envoy
// would for one HTTP request: request headers, then response headers.
func oneExtProcStream(ctx context.Context, client extprocv3.ExternalProcessorClient) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stream, err := client.Process(ctx)
	if err != nil {
		return err
	}
	attrs := map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{
		"xds.route_name":   structpb.NewStringValue("api"),
		"xds.cluster_name": structpb.NewStringValue("backend"),
	}}}
	reqHeaders := &extprocv3.ProcessingRequest{
		ObservabilityMode: true,
		Attributes:        attrs,
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers:     &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/api/orders")}, {Key: ":method", RawValue: []byte("GET")}}},
			EndOfStream: true,
		}},
	}
	respHeaders := &extprocv3.ProcessingRequest{
		ObservabilityMode: true,
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers:     &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}},
			EndOfStream: true,
		}},
	}
	if err := stream.Send(reqHeaders); err != nil {
		return err
	}
	if err := stream.Send(respHeaders); err != nil {
		return err
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

func printTable(w io.Writer, cfg config, results []result, ceiling float64) {
	fmt.Fprintf(w, "Machine: %d CPUs (GOMAXPROCS %d), %s %s/%s. Load generator and server share the machine.\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(w, "Each scenario: %v warm-up, %v measured, %d concurrent callers over %d connections.\n\n", cfg.warmup, cfg.duration, cfg.concurrency, cfg.connections)
	fmt.Fprintln(w, "| scenario | backend | req/s | share of ceiling | p50 | p99 | p99.9 | errors | ext_proc streams/s |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range results {
		streams := "-"
		if r.streams > 0 {
			streams = fmt.Sprintf("%.0f", float64(r.streams)/cfg.duration.Seconds())
		}
		fmt.Fprintf(w, "| %s | %s | %.0f | %.0f%% | %s | %s | %s | %d | %s |\n",
			r.scenario, r.backend, r.rps, 100*r.rps/ceiling, round(r.p50), round(r.p99), round(r.p999), r.errors, streams)
	}
}

func round(d time.Duration) string {
	switch {
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	default:
		return d.Round(time.Microsecond).String()
	}
}
