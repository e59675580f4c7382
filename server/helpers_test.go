package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/server"
)

// testServer is a Server running on loopback ports in the background.
type testServer struct {
	*server.Server
	ruleDir string
	stop    context.CancelFunc
	done    chan error
}

// settingsFor returns settings serving ruleDir on free loopback ports.
func settingsFor(ruleDir string) config.Settings {
	s := config.Defaults()
	s.GRPCHost, s.Host, s.DebugHost = "127.0.0.1", "127.0.0.1", "127.0.0.1"
	s.GRPCPort, s.Port, s.DebugPort, s.ReportPort = 0, 0, 0, 0
	s.RuntimeRoot, s.RuntimeSubdirectory, s.RuntimeAppDirectory = filepath.Dir(ruleDir), "", filepath.Base(ruleDir)
	s.ReloadDebounce = 20 * time.Millisecond
	s.DrainTimeout = 10 * time.Second
	return s
}

// writeRules creates dir/name with content.
func writeRules(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// testLogger writes the server's log to the test's output.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// start runs a server with rules (file name -> YAML) in a fresh rule
// directory; mod adjusts the settings first.
func start(t *testing.T, rules map[string]string, mod func(*config.Settings), opts ...server.Option) *testServer {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range rules {
		writeRules(t, dir, name, content)
	}
	s := settingsFor(dir)
	if mod != nil {
		mod(&s)
	}
	return startWith(t, s, opts...)
}

// startWith runs a server with the given settings until the test ends.
func startWith(t testing.TB, s config.Settings, opts ...server.Option) *testServer {
	t.Helper()
	srv, err := server.New(s, testLogger(t), opts...)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{Server: srv, ruleDir: s.ConfigDir(), stop: cancel, done: make(chan error, 1)}
	go func() { ts.done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-ts.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("server did not stop")
		}
	})
	return ts
}

// conn returns a plain-text gRPC client connection to the server.
func (ts *testServer) conn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(ts.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func (ts *testServer) rls(t *testing.T) rlsv3.RateLimitServiceClient {
	return rlsv3.NewRateLimitServiceClient(ts.conn(t))
}

// get fetches url and returns the status code and body.
func get(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// post sends body to url and returns the status code and body.
func post(t testing.TB, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

func (ts *testServer) httpURL(path string) string  { return "http://" + ts.HTTPAddr().String() + path }
func (ts *testServer) debugURL(path string) string { return "http://" + ts.DebugAddr().String() + path }
func (ts *testServer) reportURL() string           { return "http://" + ts.ReportAddr().String() + "/report" }

// request builds a RateLimitRequest with one descriptor per entry list
// (alternating key, value).
func request(domain string, descriptors ...[]string) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: domain}
	for _, kv := range descriptors {
		d := &rlcommonv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &rlcommonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

// eventually polls cond until it holds or 10s pass. It waits for
// asynchronous events (file-system notifications, listener shutdown), never
// for time-window edges.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// healthStatus asks the gRPC health service about service.
func healthStatus(t *testing.T, cc *grpc.ClientConn, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	resp, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("health check %q: %v", service, err)
	}
	return resp.GetStatus()
}

// metricValue returns the value of the first /metrics line starting with
// prefix (a metric name with labels), or "" if there is none.
func metricValue(t *testing.T, ts *testServer, prefix string) string {
	t.Helper()
	_, body := get(t, ts.httpURL("/metrics"))
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, prefix+" ") {
			return strings.TrimPrefix(line, prefix+" ")
		}
	}
	return ""
}

const limitRules = `domain: test
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: path
    value: /free
    rate_limit:
      unlimited: true
`

// newServerErr builds a server expected to fail.
func newServerErr(t *testing.T, s config.Settings) (*server.Server, error) {
	return server.New(s, testLogger(t))
}
