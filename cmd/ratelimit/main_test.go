package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

const rules = `domain: bin
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// buildBinary builds the command into a temporary directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ratelimit")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// environ is os.Environ without the variables the server reads, plus env.
func environ(env ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "HOST", "PORT", "GRPC_HOST", "GRPC_PORT", "DEBUG_HOST", "DEBUG_PORT", "RUNTIME_ROOT",
			"RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "LOG_LEVEL", "LOG_FORMAT", "BACKEND_TYPE":
			continue
		}
		out = append(out, kv)
	}
	return append(out, env...)
}

func TestBinaryServesAndStopsOnSIGTERM(t *testing.T) {
	bin := buildBinary(t)
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "config", "rules.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = environ("GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "HOST=127.0.0.1", "PORT=0", "DEBUG_PORT=0",
		"RUNTIME_ROOT="+root, "LOG_FORMAT=json")
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()

	// The log's "serving" line names the bound addresses.
	lines := make(chan map[string]any, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				lines <- m
			} else {
				t.Logf("non-JSON log line: %s", sc.Text())
			}
		}
	}()
	var grpcAddr string
	deadline := time.After(30 * time.Second)
	for grpcAddr == "" {
		select {
		case m, ok := <-lines:
			if !ok {
				t.Fatal("binary exited before serving")
			}
			if m["msg"] == "serving" {
				grpcAddr, _ = m["grpc"].(string)
			}
		case <-deadline:
			t.Fatal("no serving log line")
		}
	}

	cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", h, err)
	}
	client := rlsv3.NewRateLimitServiceClient(cc)
	req := &rlsv3.RateLimitRequest{Domain: "bin", Descriptors: []*rlcommonv3.RateLimitDescriptor{
		{Entries: []*rlcommonv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u"}}},
	}}
	for _, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := client.ShouldRateLimit(ctx, req)
		if err != nil || resp.GetOverallCode() != want {
			t.Fatalf("ShouldRateLimit: %v %v, want %v", resp, err, want)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait(); pw.Close() }()
	select {
	case err := <-waited:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v, want status 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("binary did not exit after SIGTERM")
	}
	var sawStopped bool
	for m := range lines {
		sawStopped = sawStopped || m["msg"] == "stopped"
	}
	if !sawStopped {
		t.Error(`no "stopped" log line`)
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
