package server_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/leapgate/leapgate/config"
)

// TestRulesFromXDS runs the server with CONFIG_TYPE=GRPC_XDS_SOTW against an
// in-process go-control-plane management server.
func TestRulesFromXDS(t *testing.T) {
	lis, snapshots := startManagement(t)
	publish := func(version string, rpu uint32) {
		setSnapshot(t, snapshots, version, &rlsconfv3.RateLimitConfig{Name: "xds", Domain: "xds", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key:       "user",
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: rpu},
		}}})
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

// startManagement runs an in-process go-control-plane management server.
func startManagement(t *testing.T) (net.Listener, cachev3.SnapshotCache) {
	t.Helper()
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
	return lis, snapshots
}

// setSnapshot publishes cfgs as version for node leapgate-e2e.
func setSnapshot(t *testing.T, snapshots cachev3.SnapshotCache, version string, cfgs ...*rlsconfv3.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := snapshots.SetSnapshot(context.Background(), "leapgate-e2e", snap); err != nil {
		t.Fatal(err)
	}
}

// TestXDSAsEnvoyGatewayDeliversIt: Envoy Gateway sets
// FORCE_START_WITHOUT_INITIAL_CONFIG=true and sends every rule of a
// gateway, of every unit, in one snapshot.
func TestXDSAsEnvoyGatewayDeliversIt(t *testing.T) {
	lis, snapshots := startManagement(t)
	ts := start(t, nil, func(s *config.Settings) {
		s.XDS.ConfigType, s.XDS.ServerURL, s.XDS.NodeID = config.SourceXDS, lis.Addr().String(), "leapgate-e2e"
		s.ForceStartWithoutInitialConfig = true
	})
	cc := ts.conn(t)
	// Healthy at once, before any snapshot (Envoy Gateway sends none while
	// no Gateway exists); calls answer Unavailable until one arrives.
	if got := healthStatus(t, cc, ""); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health before any xDS config with FORCE_START_WITHOUT_INITIAL_CONFIG = %v, want SERVING", got)
	}
	if _, err := ts.rls(t).ShouldRateLimit(context.Background(), request("eg", []string{"unit", "second"})); status.Code(err) != codes.Unavailable {
		t.Errorf("ShouldRateLimit before any snapshot: %v, want Unavailable", err)
	}

	// Every unit, WEEK, MONTH and YEAR included, in one snapshot.
	units := []rlsconfv3.RateLimitUnit{rlsconfv3.RateLimitUnit_SECOND, rlsconfv3.RateLimitUnit_MINUTE, rlsconfv3.RateLimitUnit_HOUR,
		rlsconfv3.RateLimitUnit_DAY, rlsconfv3.RateLimitUnit_WEEK, rlsconfv3.RateLimitUnit_MONTH, rlsconfv3.RateLimitUnit_YEAR}
	cfg := &rlsconfv3.RateLimitConfig{Name: "eg", Domain: "eg"}
	for _, u := range units {
		cfg.Descriptors = append(cfg.Descriptors, &rlsconfv3.RateLimitDescriptor{Key: "unit", Value: strings.ToLower(u.String()),
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: u, RequestsPerUnit: 1}})
	}
	setSnapshot(t, snapshots, "1", cfg)
	for _, u := range units {
		waitRules(t, ts, "eg.unit_"+strings.ToLower(u.String())+": unit="+u.String()+" requests_per_unit=1")
	}
	client := ts.rls(t)
	for _, u := range units {
		for _, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
			resp, err := client.ShouldRateLimit(context.Background(), request("eg", []string{"unit", strings.ToLower(u.String())}))
			if err != nil || resp.GetOverallCode() != want || resp.GetStatuses()[0].GetCurrentLimit().GetUnit().String() != u.String() {
				t.Errorf("%v: %v %v, want %v", u, resp, err, want)
			}
		}
	}

	// A refused snapshot, which go-control-plane re-sends at once after
	// each NACK: logged once (one reject), its repeats only counted.
	setSnapshot(t, snapshots, "2", &rlsconfv3.RateLimitConfig{Name: "broken", Domain: ""})
	eventually(t, "repeats of the refused snapshot to be counted", func() bool {
		n, _ := strconv.Atoi(metricValue(t, ts, "leapgate_xds_repeated_rejections_total"))
		return n >= 2
	})
	// One scrape, so that both counters are read at one moment.
	_, body := get(t, ts.httpURL("/metrics"))
	var errs, repeats int
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, "ratelimit_service_config_load_error "); ok {
			errs, _ = strconv.Atoi(v)
		}
		if v, ok := strings.CutPrefix(line, "leapgate_xds_repeated_rejections_total "); ok {
			repeats, _ = strconv.Atoi(v)
		}
	}
	if errs-repeats != 1 {
		t.Errorf("config_load_error %d, repeats %d: the refusal was reported %d times, want once", errs, repeats, errs-repeats)
	}
	// The last good rules keep serving.
	if resp, err := client.ShouldRateLimit(context.Background(), request("eg", []string{"unit", "year"})); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("after the refused snapshot: %v %v, want OVER_LIMIT from the last good rules", resp, err)
	}
}
