package server_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/server"
)

// TestGRPCUnixSocket: with GRPC_UDS the gRPC listener serves on a Unix
// domain socket (replacing a stale socket a killed process left), and a
// regular file at that path is never removed.
func TestGRPCUnixSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rls.sock")
	// A stale socket: bound, then closed without unlinking.
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) { s.GRPCUDS = path })
	if got := ts.GRPCAddr(); got.Network() != "unix" || got.String() != path {
		t.Errorf("GRPCAddr = %s %s, want unix %s", got.Network(), got, path)
	}
	cc, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := rlsv3.NewRateLimitServiceClient(cc)
	for _, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := client.ShouldRateLimit(context.Background(), request("test", []string{"user", "u"}))
		if err != nil || resp.GetOverallCode() != want {
			t.Fatalf("over the socket: %v %v, want %v", resp, err, want)
		}
	}

	file := filepath.Join(t.TempDir(), "not-a-socket")
	if err := os.WriteFile(file, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "config")
	writeRules(t, dir, "rules.yaml", limitRules)
	s := settingsFor(dir)
	s.GRPCUDS = file
	if _, err := server.New(s, testLogger(t)); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("GRPC_UDS on a regular file: %v, want a refusal", err)
	}
	if b, _ := os.ReadFile(file); string(b) != "keep me" {
		t.Errorf("the regular file at GRPC_UDS was changed: %q", b)
	}
}
