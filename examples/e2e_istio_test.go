package examples

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// accessLogs sends entries on one access-log stream, as Envoy's
// http_grpc logger does for the provider of examples/istio/als.yaml.
func accessLogs(ctx context.Context, t *testing.T, client accesslogv3.AccessLogServiceClient, logName string, entries []*accesslogdatav3.HTTPAccessLogEntry) {
	t.Helper()
	stream, err := client.StreamAccessLogs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msg := &accesslogv3.StreamAccessLogsMessage{
		Identifier: &accesslogv3.StreamAccessLogsMessage_Identifier{
			Node:    &corev3.Node{Id: "router~10.1.0.7~istio-ingressgateway-abc.istio-system~istio-system.svc.cluster.local", Cluster: "istio-ingressgateway.istio-system"},
			LogName: logName,
		},
		LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: entries}},
	}
	if err := stream.Send(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatalf("access-log stream: %v", err)
	}
}

// logEntry is the access-log entry of one request that reached the
// upstream of route, answered after ttfb with status.
func (e *fakeEnvoy) logEntry(route string, ttfb time.Duration, status uint32) *accesslogdatav3.HTTPAccessLogEntry {
	r := e.route(route)
	return &accesslogdatav3.HTTPAccessLogEntry{
		CommonProperties: &accesslogdatav3.AccessLogCommon{
			StartTime:                  timestamppb.Now(),
			RouteName:                  r.GetName(),
			UpstreamCluster:            r.GetRoute().GetCluster(),
			TimeToFirstUpstreamRxByte:  durationpb.New(ttfb),
			TimeToLastDownstreamTxByte: durationpb.New(ttfb + time.Millisecond),
			Duration:                   durationpb.New(ttfb + time.Millisecond),
		},
		Request:  &accesslogdatav3.HTTPRequestProperties{RequestMethod: corev3.RequestMethod_GET, Path: "/" + route},
		Response: &accesslogdatav3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(status)},
	}
}

// TestEndToEndIstio runs the real binary on the rules of the Istio
// example's ConfigMap and plays the ingress gateway the EnvoyFilters and
// VirtualService configure, with the access-log service of als.yaml as the
// timing source: 429 after the configured calls, 503 after slow (as Envoy
// measured them) checkout responses and after failing ones.
func TestEndToEndIstio(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the real binary")
	}
	gw, err := istioExample(readDir(t, istioDir))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range gw.RuleFiles {
		name := f.Name[strings.LastIndex(f.Name, "/")+1:]
		if err := os.WriteFile(filepath.Join(dir, name), f.Data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	lg := startLeapgate(t, root, "ratelimit", "config")
	conn, err := grpc.NewClient(lg.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	e := &fakeEnvoy{t: t, facts: gw.Facts, set: gw.Rules, rls: rlsv3.NewRateLimitServiceClient(conn), ep: extprocv3.NewExternalProcessorClient(conn)}
	als := accesslogv3.NewAccessLogServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("rate limit: 429 after the configured number of calls", func(t *testing.T) {
		e.t = t
		alice := downstream{Route: "api", ClientIP: "192.0.2.1", Headers: map[string]string{"x-user-id": "alice"}}
		n := e.limitOf(alice)
		if n == 0 {
			t.Fatal("the api route's descriptors carry no limit")
		}
		for i := range n {
			if d := e.rateLimit(ctx, alice); d.Status != 0 {
				t.Fatalf("call %d of %d: status %d (%v)", i+1, n, d.Status, d.Response)
			}
		}
		if d := e.rateLimit(ctx, alice); d.Status != http.StatusTooManyRequests {
			t.Fatalf("call %d: status %d, want 429 (%v)", n+1, d.Status, d.Response)
		}
	})

	successes := 0
	t.Run("breaker: slow checkout responses in the access log open it, 503", func(t *testing.T) {
		e.t = t
		b := e.breakerOf("checkout", "route").Breaker
		req := downstream{Route: "checkout", ClientIP: "203.0.113.5"}
		var entries []*accesslogdatav3.HTTPAccessLogEntry
		for i := range int(b.MinRequests) {
			if d := e.rateLimit(ctx, req); d.Status != 0 {
				t.Fatalf("request %d: status %d (%v)", i, d.Status, d.Response)
			}
			entries = append(entries, e.logEntry("checkout", b.MaxResponseTime+300*time.Millisecond, 200))
		}
		accessLogs(ctx, t, als, gw.ALSLogName, entries)
		successes += len(entries)
		d := e.waitFor(ctx, req, http.StatusServiceUnavailable, 5*time.Second)
		if got := header(d.Response, "x-ratelimit-reason"); got != "circuit-open" {
			t.Errorf("x-ratelimit-reason = %q, want circuit-open", got)
		}
	})

	t.Run("breaker: failing responses open the cluster's breaker, 503", func(t *testing.T) {
		e.t = t
		b := e.breakerOf("api", "destination_cluster").Breaker
		want := failuresToOpen(b, successes)
		var entries []*accesslogdatav3.HTTPAccessLogEntry
		for i := range want {
			req := downstream{Route: "api", ClientIP: fmt.Sprintf("203.0.113.%d", 10+i), Headers: map[string]string{"x-user-id": fmt.Sprintf("user-%d", i)}}
			if d := e.rateLimit(ctx, req); d.Status != 0 {
				t.Fatalf("request %d: status %d (%v)", i, d.Status, d.Response)
			}
			entries = append(entries, e.logEntry("api", 20*time.Millisecond, 500))
		}
		// One batch short of opening: still closed.
		accessLogs(ctx, t, als, gw.ALSLogName, entries[:want-1])
		dave := downstream{Route: "api", ClientIP: "203.0.113.99", Headers: map[string]string{"x-user-id": "dave"}}
		if d := e.rateLimit(ctx, dave); d.Status != 0 {
			t.Fatalf("after %d of %d failures: status %d (%v)", want-1, want, d.Status, d.Response)
		}
		accessLogs(ctx, t, als, gw.ALSLogName, entries[want-1:])
		d := e.waitFor(ctx, dave, http.StatusServiceUnavailable, 5*time.Second)
		if got := header(d.Response, "x-ratelimit-reason"); got != "circuit-open" {
			t.Errorf("x-ratelimit-reason = %q, want circuit-open", got)
		}
	})
}
