package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leapgate/leapgate/internal/redistest"
)

const rules = `domain: bin
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// binary is the command built once by TestMain, buildErr why it was not.
var binary, buildErr = "", error(nil)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ratelimit-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "ratelimit")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		buildErr = fmt.Errorf("go build: %v\n%s", err, out)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// buildBinary returns the built command.
func buildBinary(t *testing.T) string {
	t.Helper()
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// runningBinary is the command serving on loopback ports.
type runningBinary struct {
	cmd        *exec.Cmd
	grpcAddr   string
	reportAddr string              // the report listener (POST /report)
	httpAddr   string              // the HTTP listener (/healthcheck, /json, /metrics)
	lines      chan map[string]any // JSON log lines after "serving"
	out        *io.PipeWriter
}

// startBinary runs the command with env (on top of free loopback ports and
// JSON logs) and waits for its "serving" log line, which names the bound
// addresses. Log lines before it are passed to seen.
func startBinary(t *testing.T, seen func(map[string]any), env ...string) *runningBinary {
	t.Helper()
	return startCommand(t, exec.Command(buildBinary(t)), seen, env...)
}

// startBinaryWithFileLimit is startBinary with the process's file
// descriptors limited to nofile (soft and hard), as a container's ulimit
// would.
func startBinaryWithFileLimit(t *testing.T, nofile int, env ...string) *runningBinary {
	t.Helper()
	return startCommand(t, exec.Command("sh", "-c", fmt.Sprintf(`ulimit -n %d && exec "$0"`, nofile), buildBinary(t)), nil, env...)
}

// startCommand is startBinary for a command that runs the binary.
func startCommand(t *testing.T, cmd *exec.Cmd, seen func(map[string]any), env ...string) *runningBinary {
	t.Helper()
	cmd.Env = environ(append([]string{"GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "HOST=127.0.0.1", "PORT=0", "DEBUG_PORT=0", "REPORT_PORT=0",
		"LOG_FORMAT=json"}, env...)...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	rb := &runningBinary{cmd: cmd, lines: make(chan map[string]any, 100), out: pw}
	go func() {
		defer close(rb.lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				rb.lines <- m
			} else {
				t.Logf("non-JSON log line: %s", sc.Text())
			}
		}
	}()
	deadline := time.After(30 * time.Second)
	for rb.grpcAddr == "" {
		select {
		case m, ok := <-rb.lines:
			if !ok {
				t.Fatal("binary exited before serving")
			}
			if m["msg"] == "serving" {
				rb.grpcAddr, _ = m["grpc"].(string)
				rb.reportAddr, _ = m["report"].(string)
				rb.httpAddr, _ = m["http"].(string)
			} else if seen != nil {
				seen(m)
			}
		case <-deadline:
			t.Fatal("no serving log line")
		}
	}
	return rb
}

// stop sends SIGTERM and checks the process exits with status 0 after
// logging "stopped".
func (rb *runningBinary) stop(t *testing.T) {
	t.Helper()
	if err := rb.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- rb.cmd.Wait(); rb.out.Close() }()
	select {
	case err := <-waited:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v, want status 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("binary did not exit after SIGTERM")
	}
	var sawStopped bool
	for m := range rb.lines {
		sawStopped = sawStopped || m["msg"] == "stopped"
	}
	if !sawStopped {
		t.Error(`no "stopped" log line`)
	}
}

// dial connects to the binary's gRPC listener and waits up to 10 s for
// SERVING (a Redis backend serves once its first health probe succeeds).
func (rb *runningBinary) dial(t *testing.T) rlsv3.RateLimitServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(rb.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		h, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
		if err == nil && h.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return rlsv3.NewRateLimitServiceClient(cc)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("health: %v %v", h, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// expectCodes makes one call per wanted code, in order.
func expectCodes(t *testing.T, client rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest, want ...rlsv3.RateLimitResponse_Code) {
	t.Helper()
	for i, w := range want {
		resp, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil || resp.GetOverallCode() != w {
			t.Fatalf("call %d: %v %v, want %v", i, resp, err, w)
		}
	}
}

// environ is os.Environ without the variables the server reads, plus env.
func environ(env ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "HOST", "PORT", "GRPC_HOST", "GRPC_PORT", "DEBUG_HOST", "DEBUG_PORT", "REPORT_HOST", "REPORT_PORT", "REPORT_TOKEN", "RUNTIME_ROOT",
			"RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "LOG_LEVEL", "LOG_FORMAT", "BACKEND_TYPE":
			continue
		}
		out = append(out, kv)
	}
	return append(out, env...)
}

// startReplicas starts the binary on the rules under root and dials it: one
// process in memory with replicas 0, else replicas processes sharing one
// real redis-server started for the test.
func startReplicas(t *testing.T, root string, replicas int) []rlsv3.RateLimitServiceClient {
	t.Helper()
	if replicas == 0 {
		return []rlsv3.RateLimitServiceClient{startBinary(t, nil, "RUNTIME_ROOT="+root).dial(t)}
	}
	r := redistest.Start(t)
	var clients []rlsv3.RateLimitServiceClient
	for range replicas {
		clients = append(clients, startBinary(t, nil, "RUNTIME_ROOT="+root, "BACKEND_TYPE=redis", "REDIS_URL="+r.Addr()).dial(t))
	}
	return clients
}

// ruleRoot returns a RUNTIME_ROOT whose config directory holds rules as
// rules.yaml.
func ruleRoot(t *testing.T, rules string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "config", "rules.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestBinaryWarnsAboutUpstreamSettings: an envoyproxy/ratelimit deployment's
// environment starts the binary; each set variable Leapgate does not read is
// named in one warning, and a REDIS_URL without BACKEND_TYPE selects Redis,
// saying so.
func TestBinaryWarnsAboutUpstreamSettings(t *testing.T) {
	warned := map[string]int{}
	var backendLine bool
	root := ruleRoot(t, rules)
	rb := startBinary(t, func(m map[string]any) {
		if m["level"] != "WARN" {
			return
		}
		msg := fmt.Sprint(m["msg"])
		if strings.Contains(msg, "not honoured") {
			warned[fmt.Sprint(m["name"])]++
		}
		backendLine = backendLine || strings.Contains(msg, "BACKEND_TYPE is unset and REDIS_URL")
	}, "RUNTIME_ROOT="+root, "USE_STATSD=true", "STATSD_HOST=statsd", "MEMCACHE_HOST_PORT=memcache:11211",
		"RUNTIME_IGNOREDOTFILES=true", "REDIS_URL=127.0.0.1:1", "REDIS_FAILURE_MODE=allow")
	for _, name := range []string{"USE_STATSD", "STATSD_HOST", "MEMCACHE_HOST_PORT"} {
		if warned[name] != 1 {
			t.Errorf("%s warned %d times, want once", name, warned[name])
		}
	}
	if warned["RUNTIME_IGNOREDOTFILES"] != 0 || len(warned) != 3 {
		t.Errorf("warnings %v: want exactly USE_STATSD, STATSD_HOST, MEMCACHE_HOST_PORT (RUNTIME_IGNOREDOTFILES=true is what Leapgate does)", warned)
	}
	if !backendLine {
		t.Error("no start-up line saying REDIS_URL selected the Redis backend")
	}
	rb.stop(t)
}

func TestBinaryServesAndStopsOnSIGTERM(t *testing.T) {
	root := ruleRoot(t, rules)
	rb := startBinary(t, nil, "RUNTIME_ROOT="+root)
	req := &rlsv3.RateLimitRequest{Domain: "bin", Descriptors: []*rlcommonv3.RateLimitDescriptor{
		{Entries: []*rlcommonv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u"}}},
	}}
	expectCodes(t, rb.dial(t), req, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT)
	rb.stop(t)
}

// TestBinaryOnAFreshClone runs the command as the README's run command
// does, with EXAMPLE_RULES=true and no rule directory: it serves the
// embedded example rules and says so.
func TestBinaryOnAFreshClone(t *testing.T) {
	var warned bool
	rb := startBinary(t, func(m map[string]any) {
		warned = warned || (m["level"] == "WARN" && strings.Contains(fmt.Sprint(m["msg"]), "EMBEDDED EXAMPLE"))
	}, "EXAMPLE_RULES=true", "RUNTIME_ROOT="+filepath.Join(t.TempDir(), "absent"))
	if !warned {
		t.Error("no warning that the embedded example rules are in use")
	}
	req := &rlsv3.RateLimitRequest{Domain: "example", Descriptors: []*rlcommonv3.RateLimitDescriptor{
		{Entries: []*rlcommonv3.RateLimitDescriptor_Entry{{Key: "path", Value: "/login"}}},
	}}
	ok := rlsv3.RateLimitResponse_OK
	expectCodes(t, rb.dial(t), req, ok, ok, ok, ok, ok, rlsv3.RateLimitResponse_OVER_LIMIT)
	rb.stop(t)
}

// TestBinaryMissingRuleDirectory: without EXAMPLE_RULES, a rule directory
// that does not exist (an unmounted ConfigMap, a typo) stops the process
// with exit status 1 and a message naming the directory, instead of a Ready
// pod serving the example domain.
func TestBinaryMissingRuleDirectory(t *testing.T) {
	root := filepath.Join(t.TempDir(), "absent")
	cmd := exec.Command(buildBinary(t))
	cmd.Env = environ("GRPC_PORT=0", "PORT=0", "DEBUG_PORT=0", "REPORT_PORT=0", "RUNTIME_ROOT="+root)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1\n%s", err, out)
	}
	for _, want := range []string{filepath.Join(root, "config"), "EXAMPLE_RULES=true"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output does not name %q:\n%s", want, out)
		}
	}
}

func TestBinaryCheckConfig(t *testing.T) {
	bin := buildBinary(t)
	good, bad := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(good, "rules.yaml"), []byte(rules), 0o644)
	os.WriteFile(filepath.Join(bad, "rules.yaml"), []byte("domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), 0o644)

	out, err := exec.Command(bin, "check-config", good).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "OK") {
		t.Errorf("good directory: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "check-config", bad).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), filepath.Join(bad, "rules.yaml")+":4: ") {
		t.Errorf("bad directory: %v\n%s\nwant exit status 1 and file:line", err, out)
	}
}

func TestRunArguments(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  []string
		want int
		out  string
	}{
		{[]string{"help"}, nil, 0, "check-config DIR"},
		{[]string{"--help"}, nil, 0, "docs/settings.md"},
		{[]string{"--version"}, nil, 0, "leapgate "},
		{[]string{"-version"}, nil, 0, runtime.Version()},
		{[]string{"serve-please"}, nil, 2, `unknown command "serve-please"`},
		{[]string{"check-config"}, nil, 2, "usage"},
		{nil, []string{"LOG_FORMAT=xml"}, 1, "LOG_FORMAT"},
		{nil, []string{"GRPC_PORT=http"}, 1, "GRPC_PORT"},
	} {
		for _, kv := range c.env {
			name, value, _ := strings.Cut(kv, "=")
			t.Setenv(name, value)
		}
		var out strings.Builder
		if got := run(c.args, &out, &out); got != c.want || !strings.Contains(out.String(), c.out) {
			t.Errorf("run(%q) with %v = %d %q, want %d and %q", c.args, c.env, got, out.String(), c.want, c.out)
		}
		for _, kv := range c.env {
			name, _, _ := strings.Cut(kv, "=")
			os.Unsetenv(name)
		}
	}
}

// The real binary names its version and commit: the version set at link
// time (as the Dockerfile does), the commit stamped by go build from git.
func TestBinaryVersion(t *testing.T) {
	rev, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "ratelimit")
	build := exec.Command("go", "build", "-buildvcs=true", "-ldflags", "-X github.com/leapgate/leapgate/server.linkedVersion=v9.9.9-test", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("--version: %v\n%s", err, out)
	}
	line := strings.TrimSpace(string(out))
	want := "leapgate v9.9.9-test (commit " + strings.TrimSpace(string(rev))
	if !strings.HasPrefix(line, want) || !strings.HasSuffix(line, runtime.Version()+")") {
		t.Errorf("--version = %q, want %q..., %s)", line, want, runtime.Version())
	}
}
