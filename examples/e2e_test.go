package examples

// End to end: the real Leapgate binary with the example rules, driven the
// way the example Envoy config drives it. The test plays Envoy: it builds
// each ShouldRateLimit request from the example routes' rate_limits actions
// and filters (domain, stage, rate_limited_status), and each ext_proc
// stream from the example ext_proc filter (observability mode, forwarded
// headers, request attributes). No Envoy is available here; what Envoy
// does with the answers (429/503 local replies) is taken from the filter
// config.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/redistest"
)

// leapgateProcess is the real binary running on loopback ports.
type leapgateProcess struct {
	GRPCAddr, HTTPAddr string
	out                *syncBuffer
}

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

// startLeapgate builds cmd/ratelimit and runs it with in-memory counters
// and the rules in root/sub/app (RUNTIME_ROOT, RUNTIME_SUBDIRECTORY,
// RUNTIME_APPDIRECTORY), and env (NAME=value) on top. GRPCAddr is its
// gRPC listener on loopback.
func startLeapgate(t *testing.T, root, sub, app string, env ...string) *leapgateProcess {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ratelimit")
	build := exec.Command("go", "build", "-o", bin, "./cmd/ratelimit")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/ratelimit: %v\n%s", err, out)
	}
	root, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	free := redistest.FreePorts(t, 3)
	grpcPort, httpPort, debugPort := free[0], free[1], free[2]
	p := &leapgateProcess{
		GRPCAddr: fmt.Sprintf("127.0.0.1:%d", grpcPort),
		HTTPAddr: fmt.Sprintf("127.0.0.1:%d", httpPort),
		out:      &syncBuffer{},
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOST=127.0.0.1", "PORT=" + strconv.Itoa(httpPort),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + strconv.Itoa(grpcPort),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(debugPort),
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=" + sub, "RUNTIME_APPDIRECTORY=" + app,
		"BACKEND_TYPE=memory", "LOG_LEVEL=debug",
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("leapgate output:\n%s", p.out)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + p.HTTPAddr + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("leapgate exited before becoming healthy: %v\n%s", err, p.out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("leapgate not healthy after 20s: %v\n%s", err, p.out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fakeEnvoy plays the example Envoy's part against Leapgate.
type fakeEnvoy struct {
	t     *testing.T
	facts *envoyFacts
	set   *descriptors.Set
	rls   rlsv3.RateLimitServiceClient
	ep    extprocv3.ExternalProcessorClient
}

// downstream is one client request as Envoy sees it.
type downstream struct {
	Route    string
	ClientIP string
	Headers  map[string]string
}

func (e *fakeEnvoy) route(name string) *routev3.Route {
	for _, r := range e.facts.Routes {
		if r.GetName() == name {
			return r
		}
	}
	e.t.Fatalf("the example has no route %q", name)
	return nil
}

// descriptor evaluates one rate_limits entry as Envoy does: actions append
// entries in order; an action that cannot produce its entry drops the
// whole descriptor (unless skip_if_absent).
func (e *fakeEnvoy) descriptor(rl *routev3.RateLimit, cluster string, req downstream) *ratelimitcommonv3.RateLimitDescriptor {
	d := &ratelimitcommonv3.RateLimitDescriptor{}
	add := func(k, v string) {
		d.Entries = append(d.Entries, &ratelimitcommonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	for _, a := range rl.GetActions() {
		switch {
		case a.GetGenericKey() != nil:
			key := a.GetGenericKey().GetDescriptorKey()
			if key == "" {
				key = "generic_key"
			}
			add(key, a.GetGenericKey().GetDescriptorValue())
		case a.GetRequestHeaders() != nil:
			rh := a.GetRequestHeaders()
			v, ok := req.Headers[strings.ToLower(rh.GetHeaderName())]
			if !ok {
				if rh.GetSkipIfAbsent() {
					continue
				}
				return nil
			}
			add(rh.GetDescriptorKey(), v)
		case a.GetRemoteAddress() != nil:
			add("remote_address", req.ClientIP)
		case a.GetDestinationCluster() != nil:
			add("destination_cluster", cluster)
		default:
			e.t.Fatalf("action %v is not modelled by the fake Envoy", a)
		}
	}
	return d
}

// decision is what Envoy's ratelimit filters make of a request.
type decision struct {
	Status   int // 0: passed every filter (goes to ext_proc and upstream)
	Filter   string
	Response *rlsv3.RateLimitResponse
}

// rateLimit runs the request through the example's ratelimit filters in
// order: each sends the route's descriptors of its stage (no call when
// there are none) and, on OVER_LIMIT, answers with its rate_limited_status.
func (e *fakeEnvoy) rateLimit(ctx context.Context, req downstream) decision {
	r := e.route(req.Route)
	for _, flt := range e.facts.RateLimits {
		cfg := flt.Config
		call := &rlsv3.RateLimitRequest{Domain: cfg.GetDomain()}
		for _, rl := range r.GetRoute().GetRateLimits() {
			if rl.GetStage().GetValue() != cfg.GetStage() {
				continue
			}
			if d := e.descriptor(rl, r.GetRoute().GetCluster(), req); d != nil {
				call.Descriptors = append(call.Descriptors, d)
			}
		}
		if len(call.Descriptors) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second) // the example's 50ms is for production
		resp, err := e.rls.ShouldRateLimit(ctx, call)
		cancel()
		if err != nil {
			e.t.Fatalf("filter %s: ShouldRateLimit(%v): %v", flt.Name, call, err)
		}
		if len(resp.GetStatuses()) != len(call.Descriptors) {
			e.t.Fatalf("filter %s: %d statuses for %d descriptors", flt.Name, len(resp.GetStatuses()), len(call.Descriptors))
		}
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			status := int(cfg.GetRateLimitedStatus().GetCode())
			if status < 400 {
				status = http.StatusTooManyRequests
			}
			return decision{Status: status, Filter: flt.Name, Response: resp}
		}
	}
	return decision{}
}

// extProcStream is one HTTP request's ext_proc stream, as the example
// filter opens it.
type extProcStream struct {
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
}

// allowedHeader reports whether the example's forward_rules let header go
// to the processor.
func (e *fakeEnvoy) allowedHeader(name string) bool {
	for _, ep := range e.facts.ExtProcs {
		pats := ep.GetForwardRules().GetAllowedHeaders().GetPatterns()
		if len(pats) == 0 {
			return true
		}
		for _, p := range pats {
			if p.GetExact() == name {
				return true
			}
		}
	}
	return false
}

func (e *fakeEnvoy) headerMap(h map[string]string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for k, v := range h {
		if e.allowedHeader(k) {
			m.Headers = append(m.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
		}
	}
	return m
}

// startExtProc opens the stream and sends request_headers with the
// configured attributes, as Envoy does when the request passes the
// ratelimit filters.
func (e *fakeEnvoy) startExtProc(ctx context.Context, req downstream, requestID string) *extProcStream {
	if len(e.facts.ExtProcs) != 1 {
		e.t.Fatalf("want one ext_proc filter, got %d", len(e.facts.ExtProcs))
	}
	ep := e.facts.ExtProcs[0]
	r := e.route(req.Route)
	attrs := map[string]any{}
	for _, a := range ep.GetRequestAttributes() {
		switch a {
		case "xds.route_name":
			attrs[a] = r.GetName()
		case "xds.cluster_name":
			attrs[a] = r.GetRoute().GetCluster()
		case "request.id":
			attrs[a] = requestID
		default:
			e.t.Fatalf("attribute %s is not modelled by the fake Envoy", a)
		}
	}
	st, err := structpb.NewStruct(attrs)
	if err != nil {
		e.t.Fatal(err)
	}
	headers := map[string]string{":method": "GET", ":path": "/" + req.Route, "x-request-id": requestID}
	for k, v := range req.Headers {
		headers[k] = v
	}
	// Envoy sends the grpc_service's initial_metadata (the FEED_TOKEN)
	// with every stream.
	md := metadata.MD{}
	for _, kv := range ep.GetGrpcService().GetInitialMetadata() {
		md.Append(kv.GetKey(), kv.GetValue())
	}
	ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, md))
	s, err := e.ep.Process(ctx)
	if err != nil {
		cancel()
		e.t.Fatalf("ext_proc Process: %v", err)
	}
	msg := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: e.headerMap(headers), EndOfStream: true,
		}},
		Attributes:        map[string]*structpb.Struct{"envoy.filters.http.ext_proc": st},
		ObservabilityMode: ep.GetObservabilityMode(),
	}
	if err := s.Send(msg); err != nil {
		cancel()
		e.t.Fatalf("ext_proc send request_headers: %v", err)
	}
	return &extProcStream{stream: s, cancel: cancel}
}

// finish sends response_headers with the upstream's status and closes the
// stream; in observability mode no reply is expected.
func (e *fakeEnvoy) finish(s *extProcStream, status int) {
	defer s.cancel()
	msg := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: e.headerMap(map[string]string{":status": strconv.Itoa(status)}), EndOfStream: true,
		}},
		ObservabilityMode: e.facts.ExtProcs[0].GetObservabilityMode(),
	}
	if err := s.stream.Send(msg); err != nil && err != io.EOF {
		e.t.Fatalf("ext_proc send response_headers: %v", err)
	}
	_ = s.stream.CloseSend()
	for {
		resp, err := s.stream.Recv()
		if err == io.EOF {
			return
		}
		if err != nil {
			e.t.Fatalf("ext_proc stream ended with %v", err)
		}
		if e.facts.ExtProcs[0].GetObservabilityMode() {
			e.t.Fatalf("ext_proc replied %v in observability mode", resp)
		}
	}
}

// limitOf returns the smallest requests_per_unit among the rules the
// request's stage-0 descriptors match: the request that many calls allow.
func (e *fakeEnvoy) limitOf(req downstream) uint32 {
	r := e.route(req.Route)
	best := uint32(0)
	for _, rl := range r.GetRoute().GetRateLimits() {
		if rl.GetStage().GetValue() != 0 {
			continue
		}
		d := e.descriptor(rl, r.GetRoute().GetCluster(), req)
		if d == nil {
			continue
		}
		var entries []descriptors.Entry
		for _, en := range d.GetEntries() {
			entries = append(entries, descriptors.Entry{Key: en.GetKey(), Value: en.GetValue()})
		}
		rule := e.set.Match(e.facts.RateLimits[0].Config.GetDomain(), entries)
		if rule == nil || len(rule.Limits) == 0 {
			continue
		}
		if l := rule.Limits[0].RequestsPerUnit; best == 0 || l < best {
			best = l
		}
	}
	return best
}

// breakerOf returns the breaker rule a stage-1 descriptor of the route
// matches whose first entry has key.
func (e *fakeEnvoy) breakerOf(route, key string) *descriptors.Rule {
	r := e.route(route)
	for _, flt := range e.facts.RateLimits {
		if flt.Config.GetStage() != 1 {
			continue
		}
		for _, rl := range r.GetRoute().GetRateLimits() {
			if rl.GetStage().GetValue() != 1 {
				continue
			}
			d := e.descriptor(rl, r.GetRoute().GetCluster(), downstream{Route: route})
			if d == nil || d.GetEntries()[0].GetKey() != key {
				continue
			}
			var entries []descriptors.Entry
			for _, en := range d.GetEntries() {
				entries = append(entries, descriptors.Entry{Key: en.GetKey(), Value: en.GetValue()})
			}
			if rule := e.set.Match(flt.Config.GetDomain(), entries); rule != nil && rule.Breaker != nil {
				return rule
			}
		}
	}
	e.t.Fatalf("route %s sends no stage-1 descriptor %s with a breaker", route, key)
	return nil
}

func header(resp *rlsv3.RateLimitResponse, name string) string {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), name) {
			return h.GetValue()
		}
	}
	return ""
}

// waitFor polls the request's decision until it has the wanted status.
func (e *fakeEnvoy) waitFor(ctx context.Context, req downstream, want int, within time.Duration) decision {
	deadline := time.Now().Add(within)
	for {
		d := e.rateLimit(ctx, req)
		if d.Status == want {
			return d
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%v: status %d after %v, want %d (last answer %v)", req, d.Status, within, want, d.Response)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// failuresToOpen returns after how many failures an error_ratio breaker
// whose window already holds successes opens: the first failure that
// brings the window to min_requests with an error ratio of at least
// threshold.
func failuresToOpen(b *descriptors.Breaker, successes int) int {
	for errs := 1; ; errs++ {
		total := successes + errs
		if uint64(total) >= b.MinRequests && float64(errs) >= b.Threshold*float64(total) {
			return errs
		}
	}
}

// TestEndToEndDemo walks the README's demo against the real binary: 429
// after the configured number of calls, then a slow upstream opening the
// checkout breaker (503), then failing upstream responses opening the
// cluster breaker; and every Leapgate metric the Grafana dashboard charts
// is exported.
func TestEndToEndDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the real binary")
	}
	set := loadRules(t, envoyRulesDir)
	facts, err := checkBootstrap(readFile(t, envoyConfigPath), set)
	if err != nil {
		t.Fatal(err)
	}
	lg := startLeapgate(t, ".", "envoy", "config") // examples/envoy/config
	conn, err := grpc.NewClient(lg.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	e := &fakeEnvoy{t: t, facts: facts, set: set, rls: rlsv3.NewRateLimitServiceClient(conn), ep: extprocv3.NewExternalProcessorClient(conn)}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	successes := 0 // upstream responses to the backend cluster reported so far

	t.Run("rate limit: 429 after the configured number of calls", func(t *testing.T) {
		e.t = t
		alice := downstream{Route: "api", ClientIP: "192.0.2.1", Headers: map[string]string{"x-user-id": "alice"}}
		n := e.limitOf(alice)
		if n == 0 {
			t.Fatal("the api route's descriptors carry no limit")
		}
		for i := range n {
			d := e.rateLimit(ctx, alice)
			if d.Status != 0 {
				t.Fatalf("call %d of %d: status %d (%v)", i+1, n, d.Status, d.Response)
			}
		}
		d := e.rateLimit(ctx, alice)
		if d.Status != http.StatusTooManyRequests {
			t.Fatalf("call %d: status %d, want 429 (%v)", n+1, d.Status, d.Response)
		}
		// Envoy's X-RateLimit headers need current_limit, remaining, reset.
		var over *rlsv3.RateLimitResponse_DescriptorStatus
		for _, s := range d.Response.GetStatuses() {
			if s.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
				over = s
			}
		}
		if over == nil || over.GetCurrentLimit().GetRequestsPerUnit() != n || over.GetLimitRemaining() != 0 || over.GetDurationUntilReset().AsDuration() <= 0 {
			t.Errorf("over-limit status %v: want current_limit %d, remaining 0, a reset time", over, n)
		}
		// Another user from another address is not limited by alice's use.
		bob := downstream{Route: "api", ClientIP: "198.51.100.7", Headers: map[string]string{"x-user-id": "bob"}}
		if d := e.rateLimit(ctx, bob); d.Status != 0 {
			t.Errorf("bob: status %d, want through (%v)", d.Status, d.Response)
		}
	})

	t.Run("breaker: slow checkout responses open it, 503", func(t *testing.T) {
		e.t = t
		rule := e.breakerOf("checkout", "route")
		req := downstream{Route: "checkout", ClientIP: "203.0.113.5", Headers: map[string]string{}}
		if d := e.rateLimit(ctx, req); d.Status != 0 {
			t.Fatalf("before: status %d (%v)", d.Status, d.Response)
		}
		// min_requests requests that pass the filters, each answered by the
		// upstream after max_response_time plus a margin: a real slow
		// upstream, as Leapgate times the stream with its own clock.
		var streams []*extProcStream
		for i := range int(rule.Breaker.MinRequests) + 1 {
			if d := e.rateLimit(ctx, req); d.Status != 0 {
				t.Fatalf("request %d: status %d (%v)", i, d.Status, d.Response)
			}
			streams = append(streams, e.startExtProc(ctx, req, fmt.Sprintf("slow-%d", i)))
		}
		time.Sleep(rule.Breaker.MaxResponseTime + 100*time.Millisecond)
		for _, s := range streams {
			e.finish(s, http.StatusOK)
		}
		successes += len(streams)
		d := e.waitFor(ctx, req, http.StatusServiceUnavailable, 5*time.Second)
		if d.Filter != "breaker-ratelimit" {
			t.Errorf("503 from filter %s, want the breaker stage", d.Filter)
		}
		if got := header(d.Response, "x-ratelimit-reason"); got != "circuit-open" {
			t.Errorf("x-ratelimit-reason = %q, want circuit-open; headers %v", got, d.Response.GetResponseHeadersToAdd())
		}
		// The upstream cluster's breaker counts errors, not slowness: the
		// api route (same cluster, another route) still goes through.
		carol := downstream{Route: "api", ClientIP: "203.0.113.6", Headers: map[string]string{"x-user-id": "carol"}}
		if d := e.rateLimit(ctx, carol); d.Status != 0 {
			t.Errorf("api while checkout's breaker is open: status %d, want through (%v)", d.Status, d.Response)
		}
	})

	t.Run("breaker: failing upstream opens the cluster breaker, 503", func(t *testing.T) {
		e.t = t
		rule := e.breakerOf("api", "destination_cluster")
		b := rule.Breaker
		if b.Strategy != descriptors.ErrorRatio {
			t.Fatalf("cluster breaker strategy %s, want error_ratio", b.Strategy)
		}
		// The window already holds the successful (slow) checkout
		// responses of the same cluster.
		want := failuresToOpen(b, successes)
		for i := 0; i < want; i++ {
			req := downstream{Route: "api", ClientIP: fmt.Sprintf("203.0.113.%d", 10+i), Headers: map[string]string{"x-user-id": fmt.Sprintf("user-%d", i)}}
			if d := e.rateLimit(ctx, req); d.Status != 0 {
				t.Fatalf("after %d failures (breaker should open after %d): status %d (%v)", i, want, d.Status, d.Response)
			}
			e.finish(e.startExtProc(ctx, req, fmt.Sprintf("err-%d", i)), http.StatusInternalServerError)
		}
		dave := downstream{Route: "api", ClientIP: "203.0.113.99", Headers: map[string]string{"x-user-id": "dave"}}
		d := e.waitFor(ctx, dave, http.StatusServiceUnavailable, 5*time.Second)
		if got := header(d.Response, "x-ratelimit-reason"); got != "circuit-open" {
			t.Errorf("x-ratelimit-reason = %q, want circuit-open", got)
		}
		// The cluster's breaker covers every route to it: checkout too.
		if d := e.rateLimit(ctx, downstream{Route: "checkout", ClientIP: "203.0.113.98"}); d.Status != http.StatusServiceUnavailable {
			t.Errorf("checkout while the cluster breaker is open: status %d, want 503", d.Status)
		}
	})

	t.Run("the image's HEALTHCHECK command passes", func(t *testing.T) {
		e.t = t
		hc := loadDockerfile(t)["ratelimit"].all("HEALTHCHECK")
		_, cmdline, _ := strings.Cut(hc[0].Args, "CMD ")
		argv := execForm(cmdline)
		if len(argv) != 2 || filepath.Base(argv[0]) != "healthprobe" {
			t.Fatalf("HEALTHCHECK %v: want healthprobe URL", argv)
		}
		// The image's URL, on the port this test's server listens on.
		u, err := url.Parse(argv[1])
		if err != nil {
			t.Fatal(err)
		}
		if u.Port() != "8080" {
			t.Fatalf("HEALTHCHECK probes port %s; Leapgate's default PORT is 8080", u.Port())
		}
		u.Host = lg.HTTPAddr
		probe := filepath.Join(t.TempDir(), "healthprobe")
		build := exec.Command("go", "build", "-o", probe, "./cmd/healthprobe")
		build.Dir = ".."
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/healthprobe: %v\n%s", err, out)
		}
		if out, err := exec.Command(probe, u.String()).CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", argv[0], u, err, out)
		}
		u.Path = "/no-such-endpoint"
		if err := exec.Command(probe, u.String()).Run(); err == nil {
			t.Errorf("healthprobe %s succeeded; it must fail on a non-2xx answer", u)
		}
	})
}
