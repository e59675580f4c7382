package service

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// TestOverGRPC serves the Service on a loopback gRPC server and checks that
// answers, headers, metadata and errors survive the wire unchanged.
func TestOverGRPC(t *testing.T) {
	h := newHarness(t, mustParse(t, testRules), func(o *Options) {
		o.ResponseHeaders = HeadersDraft03
		o.DynamicMetadata = true
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(srv, h.svc)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := rlsv3.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for i, r := range []*rlsv3.RateLimitRequest{
		req("test", desc("meta", "m")),                                     // one descriptor: the single-block response
		req("test", desc("meta", "m"), desc("k", "exact"), desc("x", "y")), // several, meta over: k=exact not charged
		req("nope", desc("a", "b")),
	} {
		got, err := client.ShouldRateLimit(ctx, r)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		// The same request in-process, at the same instant, on a fresh
		// service in the same state, must give the identical answer.
		want := replay(t, r, i)
		if !proto.Equal(got, want) {
			t.Errorf("call %d over gRPC:\n got %v\nwant %v", i, got, want)
		}
	}
	if got := headerList(mustCall(t, client, ctx, req("test", desc("k", "exact")))); !slices.Contains(got, "RateLimit-Remaining: 2") {
		t.Errorf("headers over gRPC: %q", got)
	}

	// An empty domain is an unknown one: OK, not an error Envoy would pass.
	if resp := mustCall(t, client, ctx, req("", desc("k", "v"))); resp.OverallCode != codeOK {
		t.Errorf("empty domain over gRPC: %v", resp)
	}
}

func mustCall(t *testing.T, c rlsv3.RateLimitServiceClient, ctx context.Context, r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := c.ShouldRateLimit(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// replay answers the first n+1 requests of TestOverGRPC in-process on a
// fresh service and returns the last answer.
func replay(t *testing.T, last *rlsv3.RateLimitRequest, n int) *rlsv3.RateLimitResponse {
	t.Helper()
	h := newHarness(t, mustParse(t, testRules), func(o *Options) {
		o.ResponseHeaders = HeadersDraft03
		o.DynamicMetadata = true
	})
	prior := []*rlsv3.RateLimitRequest{
		req("test", desc("meta", "m")),
		req("test", desc("meta", "m"), desc("k", "exact"), desc("x", "y")),
	}
	for _, r := range prior[:n] {
		if _, err := h.call(r); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := h.call(last)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}
