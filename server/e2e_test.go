package server_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/server"
)

func TestShouldRateLimitOverGRPC(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, nil)
	client := ts.rls(t)
	ctx := context.Background()

	for i, want := range []struct {
		code      rlsv3.RateLimitResponse_Code
		remaining uint32
	}{{rlsv3.RateLimitResponse_OK, 1}, {rlsv3.RateLimitResponse_OK, 0}, {rlsv3.RateLimitResponse_OVER_LIMIT, 0}} {
		resp, err := client.ShouldRateLimit(ctx, request("test", []string{"user", "alice"}))
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != want.code || st.GetLimitRemaining() != want.remaining ||
			st.GetCurrentLimit().GetRequestsPerUnit() != 2 || st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Errorf("call %d: got %v, want %v with %d remaining of 2/minute", i, resp, want.code, want.remaining)
		}
	}
	// Another value of a value-less key has its own counter.
	resp, err := client.ShouldRateLimit(ctx, request("test", []string{"user", "bob"}))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("bob: %v, %v", resp, err)
	}
	// Empty domain: an unknown domain, answered OK (as any unknown domain),
	// never an error.
	if resp, err := client.ShouldRateLimit(ctx, request("", []string{"user", "x"})); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("empty domain: %v %v, want OK", resp, err)
	}
}

func TestHealthAndReflection(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, nil)
	cc := ts.conn(t)
	for _, name := range []string{"", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"} {
		if got := healthStatus(t, cc, name); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q = %v, want SERVING", name, got)
		}
	}
	if code, body := get(t, ts.httpURL("/healthcheck")); code != http.StatusOK || !strings.HasPrefix(body, "OK") {
		t.Errorf("/healthcheck = %d %q", code, body)
	}

	stream, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{"envoy.service.ratelimit.v3.RateLimitService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
		"envoy.service.ext_proc.v3.ExternalProcessor", "envoy.service.accesslog.v3.AccessLogService"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("reflection lists %v, missing %s", names, want)
		}
	}
	stream.CloseSend()
}

func TestJSONEndpoint(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, nil)
	url := ts.httpURL("/json")
	alice := `{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}`

	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		code, body := post(t, url, alice)
		if code != want {
			t.Fatalf("call %d: %d %s, want %d", i, code, body, want)
		}
		var resp rlsv3.RateLimitResponse
		if err := protojson.Unmarshal([]byte(body), &resp); err != nil {
			t.Fatalf("call %d: body %q is not a RateLimitResponse: %v", i, body, err)
		}
		if wantCode := map[int]rlsv3.RateLimitResponse_Code{200: rlsv3.RateLimitResponse_OK, 429: rlsv3.RateLimitResponse_OVER_LIMIT}[want]; resp.GetOverallCode() != wantCode {
			t.Errorf("call %d: overall code %v, want %v", i, resp.GetOverallCode(), wantCode)
		}
	}

	for _, c := range []struct {
		name, body string
		want       int
	}{
		{"not JSON", `{"domain":`, http.StatusBadRequest},
		{"unknown field", `{"domain":"test","descriptorz":[]}`, http.StatusBadRequest},
		{"empty domain", `{"domain":"","descriptors":[{"entries":[{"key":"user","value":"x"}]}]}`, http.StatusOK},
		{"no descriptors", `{"domain":"test"}`, http.StatusOK},
		{"too large", `{"domain":"` + strings.Repeat("a", 1<<20) + `"}`, http.StatusRequestEntityTooLarge},
		{"unlimited", `{"domain":"test","descriptors":[{"entries":[{"key":"path","value":"/free"}]}]}`, http.StatusOK},
	} {
		if code, body := post(t, url, c.body); code != c.want {
			t.Errorf("%s: %d %q, want %d", c.name, code, body, c.want)
		}
	}
	if code, _ := get(t, url); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /json = %d, want 405", code)
	}
}

func TestUnavailableWithoutRules(t *testing.T) {
	for _, backend := range []config.BackendType{config.BackendMemory, config.BackendRedis} {
		for _, requireRules := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=%t", backend, requireRules), func(t *testing.T) {
				unavailableWithoutRules(t, backend, requireRules)
			})
		}
	}
}

// unavailableWithoutRules: a rule set that does not load at start-up: the
// server runs and every call is Unavailable until the rules are fixed.
// Health is upstream's: SERVING all along by default; with
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED NOT_SERVING (on Redis too, once
// the backend is seen up) until the rules load.
func unavailableWithoutRules(t *testing.T, backend config.BackendType, requireRules bool) {
	var redisAddr string
	if backend == config.BackendRedis {
		redisAddr = redistest.Start(t).Addr()
	}
	mod := func(s *config.Settings) {
		s.HealthyWithAtLeastOneConfigLoaded = requireRules
		if redisAddr != "" {
			s.BackendType = config.BackendRedis
			s.Redis.URL = redisAddr
			s.Redis.Timeout = 2 * time.Second
		}
	}
	ts := start(t, map[string]string{"bad.yaml": "domain: test\ndescriptors:\n  - key: user\n    ratelimit: {unit: second}\n"}, mod)
	cc := ts.conn(t)
	want, wantHTTP := healthpb.HealthCheckResponse_SERVING, http.StatusOK
	if requireRules {
		want, wantHTTP = healthpb.HealthCheckResponse_NOT_SERVING, http.StatusInternalServerError
	}
	if backend == config.BackendRedis {
		eventually(t, "the backend health check to see Redis up", func() bool {
			return metricValue(t, ts, "leapgate_redis_up") == "1"
		})
		eventually(t, "health to follow the backend", func() bool { return healthStatus(t, cc, "") == want })
		// The server re-reads the backend's health every 250 ms: through
		// four of its rounds with Redis up, the health stays as the
		// policy says.
		for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if got := healthStatus(t, cc, ""); got != want {
				t.Fatalf("health with Redis up and no rules = %v, want %v", got, want)
			}
		}
	}
	if got := healthStatus(t, cc, ""); got != want {
		t.Errorf("health = %v, want %v", got, want)
	}
	if code, _ := get(t, ts.httpURL("/healthcheck")); code != wantHTTP {
		t.Errorf("/healthcheck = %d, want %d", code, wantHTTP)
	}
	_, err := ts.rls(t).ShouldRateLimit(context.Background(), request("test", []string{"user", "a"}))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("ShouldRateLimit: %v, want Unavailable", err)
	}
	if code, body := post(t, ts.httpURL("/json"), `{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`); code != http.StatusServiceUnavailable {
		t.Errorf("/json = %d %q, want 503", code, body)
	}
	if got := metricValue(t, ts, "ratelimit_service_config_load_error"); got != "1" {
		t.Errorf("config_load_error = %q, want 1", got)
	}

	writeRules(t, ts.ruleDir, "bad.yaml", limitRules)
	eventually(t, "the fixed rules to load", func() bool {
		return metricValue(t, ts, "ratelimit_service_config_load_success") == "1"
	})
	if got := healthStatus(t, cc, ""); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health after fix = %v, want SERVING", got)
	}
	if code, _ := get(t, ts.httpURL("/healthcheck")); code != http.StatusOK {
		t.Errorf("/healthcheck after fix = %d, want 200", code)
	}
	if _, err := ts.rls(t).ShouldRateLimit(context.Background(), request("test", []string{"user", "a"})); err != nil {
		t.Errorf("ShouldRateLimit after fix: %v", err)
	}

	// A reload that leaves no domain: NOT_SERVING only when the policy
	// asks for a loaded domain.
	if err := os.Remove(filepath.Join(ts.ruleDir, "bad.yaml")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the empty rule set to load", func() bool {
		return metricValue(t, ts, "ratelimit_service_config_load_success") == "2"
	})
	if got := healthStatus(t, cc, ""); got != want {
		t.Errorf("health with no domain loaded = %v, want %v", got, want)
	}
}

// TestExampleRules: EXAMPLE_RULES=true serves the embedded example rules,
// whatever the rule directory.
func TestExampleRules(t *testing.T) {
	s := settingsFor(t.TempDir() + "/does/not/exist")
	s.ExampleRules = true
	ts := startWith(t, s)
	if got := healthStatus(t, ts.conn(t), ""); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health = %v, want SERVING on the embedded rules", got)
	}
	client := ts.rls(t)
	for i := range 5 {
		resp, err := client.ShouldRateLimit(context.Background(), request("example", []string{"path", "/login"}))
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d: %v %v", i, resp, err)
		}
	}
	resp, err := client.ShouldRateLimit(context.Background(), request("example", []string{"path", "/login"}))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("6th /login in a minute: %v %v, want OVER_LIMIT", resp, err)
	}
	if _, body := get(t, ts.debugURL("/rlconfig")); !strings.Contains(body, "example.path_/login") {
		t.Errorf("/rlconfig on embedded rules:\n%s", body)
	}
}

// TestMissingRuleDirectory: without EXAMPLE_RULES a rule directory that
// does not exist (a typo, an unmounted ConfigMap) stops start-up with an
// error naming it and the settings, rather than serving anything.
func TestMissingRuleDirectory(t *testing.T) {
	dir := t.TempDir() + "/does/not/exist"
	_, err := server.New(settingsFor(dir), testLogger(t))
	if err == nil {
		t.Fatal("server.New with a missing rule directory succeeded")
	}
	for _, want := range []string{dir, "RUNTIME_ROOT", "EXAMPLE_RULES=true"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

func TestMetricsEndpoint(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, nil)
	if _, err := ts.rls(t).ShouldRateLimit(context.Background(), request("test", []string{"user", "alice"})); err != nil {
		t.Fatal(err)
	}
	code, body := get(t, ts.httpURL("/metrics"))
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d", code)
	}
	for _, want := range []string{
		`leapgate_grpc_server_handling_seconds_count{code="OK",method="/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"} 1`,
		"ratelimit_service_config_load_success 1",
		"leapgate_memory_keys 1",
		"go_goroutines ",
		"process_start_time_seconds ",
		"ratelimit_service_rate_limit_total_hits",
		// envoyproxy/ratelimit's own names, for its users' dashboards.
		`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 1`,
		`ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"} 1`,
		"ratelimit_service_config_load_error 0",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestDebugEndpoints(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, nil)
	if code, body := get(t, ts.debugURL("/rlconfig")); code != http.StatusOK || !strings.Contains(body, "test.user: unit=MINUTE requests_per_unit=2") {
		t.Errorf("/rlconfig = %d\n%s", code, body)
	}
	if code, body := get(t, ts.debugURL("/debug/pprof/")); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("/debug/pprof/ = %d", code)
	}
	if code, _ := get(t, ts.debugURL("/debug/pprof/cmdline")); code != http.StatusOK {
		t.Errorf("/debug/pprof/cmdline = %d", code)
	}
	// The public listener exposes neither the rules nor pprof.
	for _, path := range []string{"/rlconfig", "/debug/pprof/"} {
		if code, _ := get(t, ts.httpURL(path)); code != http.StatusNotFound {
			t.Errorf("HTTP listener %s = %d, want 404", path, code)
		}
	}
	if d := config.Defaults(); d.DebugHost != "127.0.0.1" {
		t.Errorf("debug listener defaults to %s, want loopback", d.DebugHost)
	}
}

func TestAnswerSettings(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) {
		s.LimitResponseHeaders, s.LimitLimitHeader = config.HeadersDraft03, "X-Limit" // LIMIT_RESPONSE_HEADERS_ENABLED=true
		s.ResponseDynamicMetadata = true
	})
	resp, err := ts.rls(t).ShouldRateLimit(context.Background(), request("test", []string{"user", "alice"}))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, h := range resp.GetResponseHeadersToAdd() {
		names = append(names, h.GetKey())
	}
	if !strings.Contains(strings.Join(names, " "), "X-Limit") {
		t.Errorf("LIMIT_RESPONSE_HEADERS_ENABLED=true, LIMIT_LIMIT_HEADER=X-Limit: headers %v", names)
	}
	if resp.GetDynamicMetadata() == nil {
		t.Error("RESPONSE_DYNAMIC_METADATA=true: no dynamic metadata")
	}
}

func TestBuildInfoMetric(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, nil)
	b := server.Build()
	want := `leapgate_build_info{commit="` + b.Commit + `",goversion="` + b.GoVersion + `",version="` + b.Version + `"}`
	if got := metricValue(t, ts, want); got != "1" {
		t.Errorf("%s = %q, want 1", want, got)
	}
	if b.GoVersion != runtime.Version() || b.Version == "" || b.Commit == "" {
		t.Errorf("Build() = %+v", b)
	}
}

// TestUsePrometheus: with envoyproxy/ratelimit's USE_PROMETHEUS, the
// metrics are also served where it serves them (PROMETHEUS_ADDR,
// PROMETHEUS_PATH), so existing scrape configurations keep working.
func TestUsePrometheus(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) {
		s.UsePrometheus, s.PrometheusAddr, s.PrometheusPath = true, "127.0.0.1:0", "/stats/prometheus"
	})
	if _, err := ts.rls(t).ShouldRateLimit(context.Background(), request("test", []string{"user", "alice"})); err != nil {
		t.Fatal(err)
	}
	code, body := get(t, "http://"+ts.MetricsAddr().String()+"/stats/prometheus")
	if code != http.StatusOK || !strings.Contains(body, `ratelimit_service_rate_limit_total_hits{domain="test",key="test.user"} 1`) {
		t.Errorf("PROMETHEUS_ADDR%s = %d:\n%.2000s", "/stats/prometheus", code, body)
	}
	if code, _ := get(t, "http://"+ts.MetricsAddr().String()+"/metrics"); code != http.StatusNotFound {
		t.Errorf("another path on the Prometheus listener = %d, want 404", code)
	}
	if plain := start(t, map[string]string{"rules.yaml": limitRules}, nil); plain.MetricsAddr() != nil {
		t.Errorf("a Prometheus listener without USE_PROMETHEUS: %v", plain.MetricsAddr())
	}
}

// TestUpstreamModeSettings: QUOTA_MODE, REFUSAL_HEADERS and
// RESPONSE_DYNAMIC_METADATA reach the answers of a running server, whose
// defaults answer as upstream.
func TestUpstreamModeSettings(t *testing.T) {
	over := func(ts *testServer) *rlsv3.RateLimitResponse {
		t.Helper()
		client := ts.rls(t)
		var resp *rlsv3.RateLimitResponse
		for range 3 { // limitRules: 2 a minute
			var err error
			if resp, err = client.ShouldRateLimit(context.Background(), request("test", []string{"user", "q"})); err != nil {
				t.Fatal(err)
			}
		}
		return resp
	}
	headers := func(resp *rlsv3.RateLimitResponse) map[string]string {
		out := map[string]string{}
		for _, h := range resp.GetResponseHeadersToAdd() {
			out[h.GetKey()] = h.GetValue()
		}
		return out
	}

	plain := over(start(t, map[string]string{"rules.yaml": limitRules}, nil))
	if plain.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || len(plain.GetResponseHeadersToAdd()) != 0 || plain.GetDynamicMetadata() != nil {
		t.Errorf("defaults: %v, want OVER_LIMIT with no headers and no metadata, as upstream", plain)
	}
	quota := over(start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) {
		s.QuotaMode, s.ResponseDynamicMetadata = true, true
	}))
	// The request's only descriptor is over: every quota descriptor is,
	// so the request is refused (as upstream since its #1059), and the
	// metadata carries no quota fields (gone upstream since its #1112).
	if quota.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || quota.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT ||
		quota.GetDynamicMetadata().GetFields()["domain"] == nil || quota.GetDynamicMetadata().GetFields()["quotaModeViolations"] != nil {
		t.Errorf("QUOTA_MODE: %v, want OVER_LIMIT with the metadata and no quota fields", quota)
	}
	refusal := over(start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) { s.RefusalHeaders = true }))
	if h := headers(refusal); h["x-ratelimit-reason"] != "rate-limited" || h["Retry-After"] == "" {
		t.Errorf("REFUSAL_HEADERS: headers %v, want x-ratelimit-reason and Retry-After", h)
	}
}
