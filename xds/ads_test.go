package xds

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/leapgate/leapgate/descriptors"
)

// rawADS is a management server that answers a subscription with the
// responses given, in order, and records the requests it gets.
type rawADS struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	responses []*discoveryv3.DiscoveryResponse
	requests  chan *discoveryv3.DiscoveryRequest
}

func (r *rawADS) StreamAggregatedResources(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	for _, resp := range r.responses {
		req, err := s.Recv()
		if err != nil {
			return err
		}
		r.requests <- req
		if err := s.Send(resp); err != nil {
			return err
		}
	}
	for {
		req, err := s.Recv()
		if err != nil {
			return err
		}
		r.requests <- req
	}
}

// TestResponseOfAnotherTypeIsRefused: a response whose type URL is not the
// rule resource's (an empty one would read as "no rules", lifting every
// limit) is NACKed and not applied; the next response of the right type is
// applied and ACKed with its version.
func TestResponseOfAnotherTypeIsRefused(t *testing.T) {
	good, err := anypb.New(config("edge-rules", "edge", "user", 10))
	if err != nil {
		t.Fatal(err)
	}
	srv := &rawADS{
		responses: []*discoveryv3.DiscoveryResponse{
			{VersionInfo: "1", TypeUrl: TypeURL, Nonce: "a", Resources: []*anypb.Any{good}},
			{VersionInfo: "2", TypeUrl: resource.ClusterType, Nonce: "b"},
			{VersionInfo: "3", TypeUrl: TypeURL, Nonce: "c", Resources: []*anypb.Any{good}},
		},
		requests: make(chan *discoveryv3.DiscoveryRequest, 10),
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, srv)
	go g.Serve(lis)
	t.Cleanup(g.Stop)

	applied := make(chan *descriptors.Set, 10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Subscribe(ctx, Options{
		ServerURL:   lis.Addr().String(),
		NodeID:      nodeID,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		Apply:       func(s *descriptors.Set) error { applied <- s; return nil },
		OnResult:    func(error) {},
	})
	next := func() *discoveryv3.DiscoveryRequest {
		t.Helper()
		select {
		case req := <-srv.requests:
			return req
		case <-time.After(10 * time.Second):
			t.Fatal("no discovery request within 10s")
			return nil
		}
	}
	for i, want := range []struct {
		version, nonce string
		nack           bool
	}{{"", "", false}, {"1", "a", false}, {"1", "b", true}, {"3", "c", false}} {
		req := next()
		if req.GetTypeUrl() != TypeURL || req.GetVersionInfo() != want.version || req.GetResponseNonce() != want.nonce ||
			(req.GetErrorDetail() != nil) != want.nack {
			t.Fatalf("request %d: %v, want version %q nonce %q nack %t", i, req, want.version, want.nonce, want.nack)
		}
		if want.nack && !strings.Contains(req.GetErrorDetail().GetMessage(), resource.ClusterType) {
			t.Fatalf("the NACK says %q, want the type it refused", req.GetErrorDetail().GetMessage())
		}
	}
	for i := range 2 {
		select {
		case s := <-applied:
			if got := limitOf(t, s, "edge", "user"); got != 10 {
				t.Fatalf("applied set %d: limit %d, want 10", i, got)
			}
		case <-time.After(time.Second):
			t.Fatalf("%d sets applied, want 2", i)
		}
	}
	if len(applied) != 0 {
		t.Fatal("the response of another type was applied")
	}
}
