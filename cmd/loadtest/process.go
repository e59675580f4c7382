package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// emptyServer is the ceiling: a RateLimitService that answers OK without
// looking at the request.
type emptyServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (emptyServer) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

func runEmptyServer(addr string) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(srv, emptyServer{})
	return srv.Serve(lis)
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func startProcess(ctx context.Context, path string, env []string, args ...string) (*exec.Cmd, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(os.Environ(), env...)
	if filepath.Base(path) != "redis-server" { // redis-server's banner is noise here
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}

func stop(cmd *exec.Cmd) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func waitTCP(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not reachable after %v: %w", addr, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitServing(ctx context.Context, addr string, timeout time.Duration) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := client.Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if time.Now().After(deadline) {
			slog.Error("service did not become healthy", "addr", addr, "err", err)
			return fmt.Errorf("service at %s not SERVING after %v (last error: %v)", addr, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// buildRatelimit returns binary, or when it is empty builds ./cmd/ratelimit
// into dir and returns that.
func buildRatelimit(dir, binary string) (string, error) {
	if binary != "" {
		return binary, nil
	}
	binary = filepath.Join(dir, "ratelimit")
	if out, err := exec.Command("go", "build", "-o", binary, "./cmd/ratelimit").CombinedOutput(); err != nil {
		return "", fmt.Errorf("building ./cmd/ratelimit: %w\n%s", err, out)
	}
	return binary, nil
}

// writeRuleFile writes rules as bench.yaml into ruleDir, creating it.
func writeRuleFile(ruleDir, rules string) error {
	if err := os.MkdirAll(ruleDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(ruleDir, "bench.yaml"), []byte(rules), 0o644)
}

// listenerEnv picks free loopback ports for a service's four listeners and
// returns its gRPC and HTTP addresses and the settings that bind them.
func listenerEnv() (grpcAddr, httpAddr string, env []string) {
	grpcAddr, _ = freeAddr()
	httpAddr, _ = freeAddr()
	debugAddr, _ := freeAddr()
	reportAddr, _ := freeAddr()
	env = append(env, hostPort("GRPC", grpcAddr)...)
	env = append(env, hostPort("", httpAddr)...)
	env = append(env, hostPort("DEBUG", debugAddr)...)
	env = append(env, hostPort("REPORT", reportAddr)...)
	return grpcAddr, httpAddr, env
}
