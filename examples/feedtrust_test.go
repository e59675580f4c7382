package examples

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// hostAddress returns an IPv4 address of this machine that is not
// loopback, to reach a listener as a peer on another host would, or ""
// when the machine has none.
func hostAddress() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	return ""
}

// forgedExtProc opens an ext_proc stream on conn with ctx's metadata and
// reports an observation of cluster with status; it returns the stream's
// final error (nil when it ended with EOF).
func forgedExtProc(ctx context.Context, conn *grpc.ClientConn, cluster string, statusCode int) error {
	s, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return err
	}
	attrs, _ := structpb.NewStruct(map[string]any{"xds.cluster_name": cluster, "xds.route_name": "forged"})
	hdr := func(kv ...string) *corev3.HeaderMap {
		m := &corev3.HeaderMap{}
		for i := 0; i < len(kv); i += 2 {
			m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
		}
		return m
	}
	msgs := []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdr(":path", "/", ":method", "GET"), EndOfStream: true}},
			Attributes: map[string]*structpb.Struct{"envoy.filters.http.ext_proc": attrs}, ObservabilityMode: true},
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdr(":status", strconv.Itoa(statusCode)), EndOfStream: true}},
			ObservabilityMode: true},
	}
	for _, m := range msgs {
		if err := s.Send(m); err != nil {
			break // the server ended the stream: Recv says why
		}
	}
	_ = s.CloseSend()
	for {
		if _, err := s.Recv(); err != nil {
			if err.Error() == "EOF" {
				return nil
			}
			return err
		}
	}
}

// TestFeedsRefuseUntrustedPeers: the real binary, its gRPC port on every
// address, as the compose demo runs it (FEED_TOKEN), reached from the
// machine's own non-loopback address as a stranger on the network would.
// Forged ext_proc streams and a forged access-log message without the
// token are refused (UNAUTHENTICATED) and do not open the breaker; one
// peer cannot hold more than MAX_OBSERVATION_STREAMS_PER_PEER streams; and
// the metadata the example Envoy sends (envoy.yaml's initial_metadata)
// does open it.
func TestFeedsRefuseUntrustedPeers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the real binary")
	}
	host := hostAddress()
	if host == "" {
		t.Skip("this machine has no non-loopback address to connect from")
	}
	token := env(loadCompose(t).Services["ratelimit"], "FEED_TOKEN")
	if token == "" {
		t.Fatal("docker-compose.yml sets no FEED_TOKEN for ratelimit")
	}
	facts, err := checkBootstrap(readFile(t, envoyConfigPath), loadRules(t, envoyRulesDir))
	if err != nil {
		t.Fatal(err)
	}
	envoyMD := metadata.MD{}
	for _, kv := range facts.ExtProcs[0].GetGrpcService().GetInitialMetadata() {
		envoyMD.Append(kv.GetKey(), kv.GetValue())
	}
	const perPeer = 8
	lg := startLeapgate(t, ".", "envoy", "config", "GRPC_HOST=0.0.0.0", "FEED_TOKEN="+token,
		"MAX_OBSERVATION_STREAMS_PER_PEER="+strconv.Itoa(perPeer))
	_, port, _ := net.SplitHostPort(lg.GRPCAddr)
	conn, err := grpc.NewClient(net.JoinHostPort(host, port), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	backendCode := func() rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "breaker", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{{
			Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: "destination_cluster", Value: "backend"}}}}})
		if err != nil {
			t.Fatalf("ShouldRateLimit from another host: %v (rate limiting is open to every peer)", err)
		}
		return resp.GetOverallCode()
	}

	for i := range 20 {
		if err := forgedExtProc(ctx, conn, "backend", 503); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("forged ext_proc stream %d: %v, want UNAUTHENTICATED", i, err)
		}
	}
	wrong := metadata.NewOutgoingContext(ctx, metadata.Pairs("authorization", "Bearer "+token+"x"))
	if err := forgedExtProc(wrong, conn, "backend", 503); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("ext_proc with a wrong token: %v, want UNAUTHENTICATED", err)
	}
	als, err := accesslogv3.NewAccessLogServiceClient(conn).StreamAccessLogs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var entries []*accesslogdatav3.HTTPAccessLogEntry
	for range 20 {
		entries = append(entries, &accesslogdatav3.HTTPAccessLogEntry{
			CommonProperties: &accesslogdatav3.AccessLogCommon{UpstreamCluster: "backend"},
			Response:         &accesslogdatav3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(503)},
		})
	}
	_ = als.Send(&accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{
		HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: entries}}})
	if _, err := als.CloseAndRecv(); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("forged access-log stream: %v, want UNAUTHENTICATED", err)
	}
	if got := backendCode(); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after forged observations: %v, want the backend breaker closed", got)
	}

	// One peer, even with the token, holds at most perPeer streams.
	authed := metadata.NewOutgoingContext(ctx, envoyMD)
	holdCtx, release := context.WithCancel(authed)
	for i := range perPeer {
		s, err := extprocv3.NewExternalProcessorClient(conn).Process(holdCtx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&extprocv3.ProcessingRequest{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{}}}}); err != nil {
			t.Fatalf("held stream %d: %v", i, err)
		}
	}
	openStreams := func() string {
		resp, err := http.Get("http://" + lg.HTTPAddr + "/metrics")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "leapgate_observation_streams "); ok {
				return v
			}
		}
		return "no leapgate_observation_streams"
	}
	for deadline := time.Now().Add(10 * time.Second); openStreams() != strconv.Itoa(perPeer); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d streams held, the server counts %s open", perPeer, openStreams())
		}
	}
	err = forgedExtProc(authed, conn, "backend", 200)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "MAX_OBSERVATION_STREAMS_PER_PEER") {
		t.Fatalf("stream %d of one peer: %v, want RESOURCE_EXHAUSTED naming MAX_OBSERVATION_STREAMS_PER_PEER", perPeer+1, err)
	}
	release()

	// What the example Envoy sends is accepted: its 503s open the breaker.
	for deadline := time.Now().Add(10 * time.Second); backendCode() != rlsv3.RateLimitResponse_OVER_LIMIT; {
		if time.Now().After(deadline) {
			t.Fatal("observations with envoy.yaml's initial_metadata did not open the backend breaker")
		}
		if err := forgedExtProc(authed, conn, "backend", 503); err != nil && status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("ext_proc with envoy.yaml's metadata: %v", err)
		}
	}
}
