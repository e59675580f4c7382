package xds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/leapgate/leapgate/descriptors"
)

const nodeID = "leapgate-test"

// managementServer is an in-process go-control-plane server that records
// every discovery request it receives (ACKs and NACKs).
type managementServer struct {
	cache cachev3.SnapshotCache
	grpc  *grpc.Server

	mu       sync.Mutex
	requests []*discoverygrpc.DiscoveryRequest
	streams  []metadata.MD // the incoming metadata of every stream opened
	changed  chan struct{}
}

func startManagementServer(t *testing.T, addr string) (*managementServer, string) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	m := &managementServer{cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil), changed: make(chan struct{}, 100)}
	callbacks := serverv3.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, _ int64, _ string) error {
			md, _ := metadata.FromIncomingContext(ctx)
			m.mu.Lock()
			m.streams = append(m.streams, md)
			m.mu.Unlock()
			m.changed <- struct{}{}
			return nil
		},
		StreamRequestFunc: func(_ int64, req *discoverygrpc.DiscoveryRequest) error {
			m.mu.Lock()
			m.requests = append(m.requests, req)
			m.mu.Unlock()
			m.changed <- struct{}{}
			return nil
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv := serverv3.NewServer(ctx, m.cache, callbacks)
	m.grpc = grpc.NewServer()
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(m.grpc, srv)
	go func() { _ = m.grpc.Serve(lis) }()
	t.Cleanup(func() { m.grpc.Stop(); cancel() })
	return m, lis.Addr().String()
}

func (m *managementServer) publish(t *testing.T, version string, cfgs ...*rlsconfv3.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.cache.SetSnapshot(context.Background(), nodeID, snap); err != nil {
		t.Fatal(err)
	}
}

// waitRequest waits until a recorded request satisfies ok.
func (m *managementServer) waitRequest(t *testing.T, what string, ok func(*discoverygrpc.DiscoveryRequest) bool) *discoverygrpc.DiscoveryRequest {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		m.mu.Lock()
		for _, r := range m.requests {
			if ok(r) {
				m.mu.Unlock()
				return r
			}
		}
		m.mu.Unlock()
		select {
		case <-m.changed:
		case <-timeout:
			t.Fatalf("no discovery request %s within 10s", what)
		}
	}
}

func config(name, domain, key string, rpu uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{
		Name:   name,
		Domain: domain,
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key:       key,
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: rpu},
		}},
	}
}

func limitOf(t *testing.T, set *descriptors.Set, domain, key string) uint32 {
	t.Helper()
	rule := set.Match(domain, []descriptors.Entry{{Key: key, Value: "v"}})
	if rule == nil || len(rule.Limits) == 0 {
		t.Fatalf("no limit for %s/%s in the applied set", domain, key)
	}
	return rule.Limits[0].RequestsPerUnit
}

func TestSubscribeAppliesAcksNacksAndReconnects(t *testing.T) {
	m, addr := startManagementServer(t, "127.0.0.1:0")
	m.publish(t, "1", config("edge-rules", "edge", "user", 10))

	applied := make(chan *descriptors.Set, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Subscribe(ctx, Options{
			ServerURL:      addr,
			NodeID:         nodeID,
			NodeMetadata:   map[string]string{"cluster": "test"},
			DialOptions:    []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
			BackoffInitial: 10 * time.Millisecond,
			BackoffMax:     50 * time.Millisecond,
			Apply: func(s *descriptors.Set) error {
				// A rule set the caller refuses (here: a domain named
				// "refused") is NACKed like one that fails to convert.
				if s.HasDomain("refused") {
					return errors.New("domain refused by the service")
				}
				applied <- s
				return nil
			},
		})
	}()
	next := func() *descriptors.Set {
		t.Helper()
		select {
		case s := <-applied:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("no rule set applied within 10s")
			return nil
		}
	}

	// A good config is applied and ACKed (the next request carries its version).
	if got := limitOf(t, next(), "edge", "user"); got != 10 {
		t.Fatalf("applied limit = %d, want 10", got)
	}
	m.waitRequest(t, "ACKing version 1", func(r *discoverygrpc.DiscoveryRequest) bool {
		return r.GetVersionInfo() == "1" && r.GetErrorDetail() == nil
	})
	if first := m.waitRequest(t, "with node", func(*discoverygrpc.DiscoveryRequest) bool { return true }); first.GetNode().GetId() != nodeID ||
		first.GetNode().GetMetadata().GetFields()["cluster"].GetStringValue() != "test" {
		t.Fatalf("node = %v, want id %q with metadata cluster=test", first.GetNode(), nodeID)
	}

	// A bad config (empty domain) is NACKed with the reason and not applied.
	m.publish(t, "2", config("broken", "", "user", 5))
	nack := m.waitRequest(t, "NACKing version 2", func(r *discoverygrpc.DiscoveryRequest) bool { return r.GetErrorDetail() != nil })
	if msg := nack.GetErrorDetail().GetMessage(); !strings.Contains(msg, "domain") {
		t.Fatalf("NACK reason %q does not name the empty domain", msg)
	}
	if nack.GetVersionInfo() != "1" {
		t.Fatalf("NACK carries version %q, want the last good version 1", nack.GetVersionInfo())
	}
	select {
	case s := <-applied:
		t.Fatalf("a rejected config was applied: %v", s)
	default:
	}

	// A config that converts but that Apply refuses is NACKed too.
	m.publish(t, "2b", config("refused", "refused", "user", 5))
	refused := m.waitRequest(t, "NACKing version 2b", func(r *discoverygrpc.DiscoveryRequest) bool {
		return strings.Contains(r.GetErrorDetail().GetMessage(), "refused by the service")
	})
	if refused.GetVersionInfo() != "1" {
		t.Fatalf("NACK carries version %q, want the last good version 1", refused.GetVersionInfo())
	}
	select {
	case s := <-applied:
		t.Fatalf("a refused config was applied: %v", s)
	default:
	}

	// A fixed config is applied again.
	m.publish(t, "3", config("edge-rules", "edge", "user", 30))
	if got := limitOf(t, next(), "edge", "user"); got != 30 {
		t.Fatalf("applied limit = %d, want 30", got)
	}

	// The server goes away and comes back on the same address: the
	// subscription reconnects by itself and follows the new server.
	m.grpc.Stop()
	m2, _ := startManagementServer(t, addr)
	m2.publish(t, "4", config("edge-rules", "edge", "user", 40))
	if got := limitOf(t, next(), "edge", "user"); got != 40 {
		t.Fatalf("after reconnect applied limit = %d, want 40", got)
	}

	cancel()
	select {
	case err := <-done:
		if err != context.Canceled {
			t.Fatalf("Subscribe returned %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Subscribe did not return after cancel")
	}
}

func TestSubscribeRequiresApply(t *testing.T) {
	if err := Subscribe(context.Background(), Options{}); err == nil {
		t.Fatal("Subscribe without Apply succeeded")
	}
}

// waitStreams waits until at least n streams have been opened and returns
// their metadata.
func (m *managementServer) waitStreams(t *testing.T, n int) []metadata.MD {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		m.mu.Lock()
		if len(m.streams) >= n {
			out := append([]metadata.MD(nil), m.streams...)
			m.mu.Unlock()
			return out
		}
		m.mu.Unlock()
		select {
		case <-m.changed:
		case <-timeout:
			t.Fatalf("fewer than %d ADS streams within 10s", n)
		}
	}
}

// TestSubscribeOptions: the upstream settings Envoy Gateway's and others'
// deployments set: extra headers on the stream, domains merged across
// resources, and a cap on the response size.
func TestSubscribeOptions(t *testing.T) {
	m, addr := startManagementServer(t, "127.0.0.1:0")
	applied := make(chan *descriptors.Set, 10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Subscribe(ctx, Options{
		ServerURL:            addr,
		NodeID:               nodeID,
		DialOptions:          []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		Headers:              map[string]string{"authorization": "Bearer s3cret"},
		Rules:                descriptors.Options{MergeDomains: true},
		MaxRecvMsgSize:       1 << 10,
		ConnectRetryInterval: 10 * time.Millisecond,
		BackoffInitial:       10 * time.Millisecond,
		Apply:                func(s *descriptors.Set) error { applied <- s; return nil },
	})
	if md := m.waitStreams(t, 1)[0]; strings.Join(md.Get("authorization"), ",") != "Bearer s3cret" {
		t.Errorf("stream metadata %v, want authorization: Bearer s3cret", md)
	}

	// A response over MaxRecvMsgSize is not read: the stream fails and is
	// re-opened, and nothing is applied.
	big := config("big", "edge", "user", 1)
	big.Descriptors[0].Value = strings.Repeat("v", 2<<10)
	m.publish(t, "1", big)
	m.waitStreams(t, 2)
	select {
	case s := <-applied:
		t.Fatalf("a response over MaxRecvMsgSize was applied: %v", s)
	default:
	}

	// Two resources of one domain are merged.
	m.publish(t, "2", config("a", "edge", "user", 10), config("b", "edge", "tenant", 20))
	select {
	case s := <-applied:
		if limitOf(t, s, "edge", "user") != 10 || limitOf(t, s, "edge", "tenant") != 20 {
			t.Errorf("merged domain: user %d, tenant %d", limitOf(t, s, "edge", "user"), limitOf(t, s, "edge", "tenant"))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no rule set applied within 10s")
	}
}

func TestJitter(t *testing.T) {
	const s = time.Second
	for _, tt := range []struct {
		name  string
		opts  Options
		r     float64
		d     time.Duration
		limit time.Duration
		want  time.Duration
	}{
		{"off", Options{Jitter: false, RandomFactor: 0.5}, 0.9, 4 * s, 60 * s, 4 * s},
		{"factor 0", Options{Jitter: true}, 0.9, 4 * s, 60 * s, 4 * s},
		{"lowest", Options{Jitter: true, RandomFactor: 0.5}, 0, 4 * s, 60 * s, 2 * s},
		{"middle", Options{Jitter: true, RandomFactor: 0.5}, 0.5, 4 * s, 60 * s, 4 * s},
		{"high", Options{Jitter: true, RandomFactor: 0.5}, 0.75, 4 * s, 60 * s, 5 * s},
		{"capped at the limit", Options{Jitter: true, RandomFactor: 0.5}, 0.99, 50 * s, 60 * s, 60 * s},
		{"at the limit, capped", Options{Jitter: true, RandomFactor: 0.5}, 0.99, 60 * s, 60 * s, 60 * s},
		{"factor above 1 is 1", Options{Jitter: true, RandomFactor: 3}, 0, 4 * s, 60 * s, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.Rand = func() float64 { return tt.r }
			if got := tt.opts.jitter(tt.d, tt.limit); got != tt.want {
				t.Errorf("jitter(%v) = %v, want %v", tt.d, got, tt.want)
			}
		})
	}
}

// TestReconnectSchedule: the waits between streams, before jitter.
func TestReconnectSchedule(t *testing.T) {
	const s = time.Second
	type end struct{ opened, received bool }
	never, failed, answered := end{false, false}, end{true, false}, end{true, true}
	for _, tt := range []struct {
		name string
		opts Options
		ends []end
		want []time.Duration
	}{
		{"defaults", Options{}, []end{never, failed, failed, failed}, []time.Duration{3 * s, s, s, s}},
		{"retry after a stream that never opened", Options{ConnectRetryInterval: 5 * s, BackoffInitial: s, BackoffMax: 60 * s},
			[]end{never, never}, []time.Duration{5 * s, 5 * s}},
		{"backoff doubles up to the max", Options{BackoffInitial: s, BackoffMax: 5 * s},
			[]end{failed, failed, failed, failed, failed}, []time.Duration{s, 2 * s, 4 * s, 5 * s, 5 * s}},
		{"a response resets the backoff", Options{BackoffInitial: s, BackoffMax: 60 * s},
			[]end{failed, failed, failed, answered, failed}, []time.Duration{s, 2 * s, 4 * s, s, 2 * s}},
		{"a refused attempt keeps the backoff", Options{BackoffInitial: s, BackoffMax: 60 * s},
			[]end{failed, never, failed}, []time.Duration{s, 3 * s, 2 * s}},
		{"max below initial is initial", Options{BackoffInitial: 4 * s, BackoffMax: s},
			[]end{failed, failed}, []time.Duration{4 * s, 4 * s}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			waits := newReconnectSchedule(tt.opts)
			for i, e := range tt.ends {
				if got := waits.next(e.opened, e.received); got != tt.want[i] {
					t.Errorf("wait %d after %+v = %v, want %v", i, e, got, tt.want[i])
				}
			}
		})
	}
	if got := newReconnectSchedule(Options{BackoffInitial: s, BackoffMax: 7 * s}).max; got != 7*s {
		t.Errorf("jitter limit %v, want BackoffMax 7s", got)
	}
}

// TestNextRepeatDelay: a repeated rejection is NACKed after a delay that
// starts at 50ms and doubles up to 1s.
func TestNextRepeatDelay(t *testing.T) {
	d, got := time.Duration(0), []time.Duration{}
	for range 7 {
		d = nextRepeatDelay(d)
		got = append(got, d)
	}
	ms := time.Millisecond
	want := []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second}
	if !slices.Equal(got, want) {
		t.Errorf("repeat delays %v, want %v", got, want)
	}
}

// recordingHandler keeps the level of every record logged.
type recordingHandler struct {
	mu     sync.Mutex
	levels []slog.Level
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.levels = append(h.levels, r.Level)
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

func (h *recordingHandler) errors() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(slices.DeleteFunc(slices.Clone(h.levels), func(l slog.Level) bool { return l != slog.LevelError }))
}

// TestRejectionsReportedOnce: a rejected response is logged at error level
// unless OnResult is set, which is then told instead (and only it); and a
// node without metadata is sent without a metadata struct.
func TestRejectionsReportedOnce(t *testing.T) {
	for _, withOnResult := range []bool{false, true} {
		t.Run(fmt.Sprintf("OnResult=%v", withOnResult), func(t *testing.T) {
			m, addr := startManagementServer(t, "127.0.0.1:0")
			m.publish(t, "1", config("broken", "", "user", 5))
			logs := &recordingHandler{}
			results := make(chan error, 100)
			opts := Options{
				ServerURL:   addr,
				NodeID:      nodeID,
				DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
				Logger:      slog.New(logs),
				Apply:       func(*descriptors.Set) error { return nil },
			}
			if withOnResult {
				opts.OnResult = func(err error) { results <- err }
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = Subscribe(ctx, opts) }()
			nack := m.waitRequest(t, "NACKing version 1", func(r *discoverygrpc.DiscoveryRequest) bool { return r.GetErrorDetail() != nil })
			cancel()
			<-done
			if md := nack.GetNode().GetMetadata(); md != nil {
				t.Errorf("node metadata %v sent without NodeMetadata, want none", md)
			}
			if withOnResult {
				if logs.errors() != 0 {
					t.Errorf("%d errors logged with OnResult set, want 0 (OnResult reports)", logs.errors())
				}
				if err := <-results; err == nil {
					t.Error("OnResult told nil for a rejected response")
				}
			} else if logs.errors() == 0 {
				t.Error("a rejected response was not logged without OnResult")
			}
		})
	}
}

// TestRepeatedRejectionsAreNACKedAfterAGrowingDelay: go-control-plane
// answers a NACK by sending the same resources again at once; the first
// rejection is NACKed at once, each repeat after a delay doubling from
// 50ms up to 1s.
func TestRepeatedRejectionsAreNACKedAfterAGrowingDelay(t *testing.T) {
	m, addr := startManagementServer(t, "127.0.0.1:0")
	m.publish(t, "1", config("broken", "", "user", 5))
	nacks := func() int {
		m.mu.Lock()
		defer m.mu.Unlock()
		n := 0
		for _, r := range m.requests {
			if r.GetErrorDetail() != nil {
				n++
			}
		}
		return n
	}
	var mu sync.Mutex
	var waits []time.Duration
	nacksAtFirstWait := -1
	enough := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := Options{
		ServerURL:   addr,
		NodeID:      nodeID,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		Apply:       func(*descriptors.Set) error { return nil },
		OnResult:    func(error) {},
	}
	opts.after = func(d time.Duration) <-chan time.Time {
		mu.Lock()
		defer mu.Unlock()
		if nacksAtFirstWait < 0 {
			nacksAtFirstWait = nacks()
		}
		waits = append(waits, d)
		if len(waits) == 6 {
			close(enough)
		}
		if len(waits) >= 6 {
			return nil // waits until ctx ends
		}
		c := make(chan time.Time, 1)
		c <- time.Time{}
		return c
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = Subscribe(ctx, opts) }()
	select {
	case <-enough:
	case <-time.After(10 * time.Second):
		t.Fatal("fewer than 6 waits within 10s")
	}
	cancel()
	<-done
	ms := time.Millisecond
	if want := []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second}; !slices.Equal(waits, want) {
		t.Errorf("waits %v, want %v", waits, want)
	}
	if nacksAtFirstWait < 1 {
		t.Errorf("%d NACKs before the first wait: the first rejection was not NACKed at once", nacksAtFirstWait)
	}
}
