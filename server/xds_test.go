package server_test

import (
	"context"
	"net"
	"testing"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leapgate/leapgate/config"
)

// TestRulesFromXDS runs the server with CONFIG_TYPE=GRPC_XDS_SOTW against an
// in-process go-control-plane management server.
func TestRulesFromXDS(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	snapshots := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	mgmt := grpc.NewServer()
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(mgmt, serverv3.NewServer(ctx, snapshots, nil))
	go mgmt.Serve(lis)
	t.Cleanup(func() { mgmt.Stop(); cancel() })
	publish := func(version string, rpu uint32) {
		snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: {
			&rlsconfv3.RateLimitConfig{Name: "xds", Domain: "xds", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
				Key:       "user",
				RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: rpu},
			}}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		if err := snapshots.SetSnapshot(context.Background(), "leapgate-e2e", snap); err != nil {
			t.Fatal(err)
		}
	}

	ts := start(t, nil, func(s *config.Settings) {
		s.XDS.ConfigType, s.XDS.ServerURL, s.XDS.NodeID = config.SourceXDS, lis.Addr().String(), "leapgate-e2e"
	})
	cc := ts.conn(t)
	if got := healthStatus(t, cc, ""); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health before any xDS config = %v, want NOT_SERVING", got)
	}
	publish("1", 1)
	eventually(t, "SERVING after the first xDS config", func() bool {
		return healthStatus(t, cc, "") == healthpb.HealthCheckResponse_SERVING
	})
	client := ts.rls(t)
	for _, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := client.ShouldRateLimit(context.Background(), request("xds", []string{"user", "u"}))
		if err != nil || resp.GetOverallCode() != want {
			t.Fatalf("ShouldRateLimit: %v %v, want %v", resp, err, want)
		}
	}
	// A new version raises the limit; the counter survives.
	publish("2", 3)
	waitRules(t, ts, "xds.user: unit=MINUTE requests_per_unit=3")
	resp, err := client.ShouldRateLimit(context.Background(), request("xds", []string{"user", "u"}))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 1 {
		t.Errorf("after raising the limit to 3: %v %v, want OK with 1 remaining", resp, err)
	}
}
