package server

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/leapgate/leapgate/internal/grpcservice"
)

// streamGuard is one stream budget (grpcservice.StreamPolicy.Budget): it
// bounds the long-lived streams that any client can open, at most max at
// once over all connections and the services that share the budget, and
// closes each once it has received nothing for its service's idle time.
type streamGuard struct {
	max int64
	// perPeer is the most streams one peer (peerKey) may hold.
	perPeer int64
	// trust decides who may open the streams of a Trusted service.
	trust peerTrust
	// setting, peerSetting and idleSetting name the settings of the
	// budget's size, its share per peer and its idle time, in refusals.
	setting, peerSetting, idleSetting string

	open atomic.Int64
	mu   sync.Mutex
	// peers counts the open streams of each peer that holds one.
	peers map[string]int64

	refused         prometheus.Counter
	refusedPerPeer  prometheus.Counter
	unauthenticated prometheus.Counter
	idleClosed      prometheus.Counter
}

// streamBudget is a budget the server sizes from its settings.
type streamBudget struct {
	// name is the budget's name (grpcservice.StreamPolicy.Budget) and its
	// metrics' infix: leapgate_<name>_streams...
	name string
	// what names the streams in the metrics' help.
	what string
	max  int
	// perPeer is the most streams one peer may hold.
	perPeer int
	// trust decides who may open the streams of a Trusted service.
	trust peerTrust
	// setting, peerSetting and idleSetting name the settings of its size,
	// its share per peer and its idle time.
	setting, peerSetting, idleSetting string
}

func newStreamGuard(b streamBudget, reg prometheus.Registerer) *streamGuard {
	g := &streamGuard{
		max:         int64(b.max),
		perPeer:     int64(b.perPeer),
		trust:       b.trust,
		setting:     b.setting,
		peerSetting: b.peerSetting,
		idleSetting: b.idleSetting,
		peers:       map[string]int64{},
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leapgate_" + b.name + "_streams_refused_total",
			Help: b.what + " streams refused (RESOURCE_EXHAUSTED) because " + b.setting + " were open.",
		}),
		refusedPerPeer: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leapgate_" + b.name + "_streams_refused_per_peer_total",
			Help: b.what + " streams refused (RESOURCE_EXHAUSTED) because their peer held " + b.peerSetting + ".",
		}),
		unauthenticated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leapgate_" + b.name + "_streams_unauthenticated_total",
			Help: b.what + " streams refused (UNAUTHENTICATED) from a peer not trusted to open them (no FEED_TOKEN, not loopback, no mutual TLS).",
		}),
		idleClosed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leapgate_" + b.name + "_streams_idle_closed_total",
			Help: b.what + " streams closed (DEADLINE_EXCEEDED) after " + b.idleSetting + " without a message.",
		}),
	}
	reg.MustRegister(g.refused, g.refusedPerPeer, g.unauthenticated, g.idleClosed, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "leapgate_" + b.name + "_streams",
		Help: b.what + " streams open now.",
	}, func() float64 { return float64(g.open.Load()) }))
	return g
}

// guardedMethod is a streaming method under a budget, with its service's
// idle time, open only to trusted peers when trusted is set.
type guardedMethod struct {
	guard   *streamGuard
	idle    time.Duration
	trusted bool
}

// errStreamClosed is what a guarded stream's sends return once the guard
// has ended the stream.
var errStreamClosed = errors.New("stream closed by the server")

// serve runs handler on ss within the guard's bounds. The handler runs in
// its own goroutine so that an idle stream can be ended while the handler
// waits in RecvMsg: serve then returns DEADLINE_EXCEEDED, gRPC ends the
// stream, and the pending RecvMsg fails, which makes the handler return.
func (m guardedMethod) serve(ss grpc.ServerStream, handler func(grpc.ServerStream) error) error {
	g := m.guard
	if m.trusted {
		if err := g.trust.check(ss.Context()); err != nil {
			g.unauthenticated.Inc()
			return err
		}
	}
	if g.open.Add(1) > g.max {
		g.open.Add(-1)
		g.refused.Inc()
		return status.Errorf(codes.ResourceExhausted, "%d streams of this kind are open, the most this server takes (%s)", g.max, g.setting)
	}
	defer g.open.Add(-1)
	key := peerKey(ss.Context())
	if !g.takePeer(key) {
		g.refusedPerPeer.Inc()
		return status.Errorf(codes.ResourceExhausted, "this peer holds %d streams of this kind, the most one peer may (%s)", g.perPeer, g.peerSetting)
	}
	defer g.releasePeer(key)
	gs := &guardedStream{ServerStream: ss, received: make(chan struct{}, 1)}
	done := make(chan error, 1)
	go func() { done <- handler(gs) }()
	if m.idle <= 0 {
		return <-done
	}
	idle := time.NewTimer(m.idle)
	defer idle.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-gs.received:
			idle.Reset(m.idle)
		case <-idle.C:
			gs.close()
			g.idleClosed.Inc()
			return status.Errorf(codes.DeadlineExceeded, "stream sent nothing for %v (%s)", m.idle, g.idleSetting)
		}
	}
}

// takePeer counts one more stream of peer key, unless it holds perPeer.
func (g *streamGuard) takePeer(key string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.perPeer > 0 && g.peers[key] >= g.perPeer {
		return false
	}
	g.peers[key]++
	return true
}

// releasePeer counts one stream of peer key fewer, forgetting a peer that
// holds none (the map holds only peers with open streams).
func (g *streamGuard) releasePeer(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.peers[key]--; g.peers[key] <= 0 {
		delete(g.peers, key)
	}
}

// guardedStream reports each received message to its guard, and refuses
// sends once the guard has ended the stream (a handler must not send on a
// stream whose handler has returned).
type guardedStream struct {
	grpc.ServerStream
	received chan struct{}

	mu     sync.RWMutex
	closed bool
}

// RecvMsg receives the next message's bytes (grpcservice.Codec leaves them
// undecoded) and decodes them itself: bytes that are not a message are
// then the client's fault, InvalidArgument, where gRPC's own decoding would
// end the stream with Internal.
func (s *guardedStream) RecvMsg(m any) error {
	var w grpcservice.RawMessage
	err := s.ServerStream.RecvMsg(&w)
	select {
	case s.received <- struct{}{}:
	default:
	}
	if err != nil {
		return err
	}
	pm, ok := m.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "stream message %T is not a protobuf message", m)
	}
	if err := proto.Unmarshal(w.Bytes, pm); err != nil {
		return status.Errorf(codes.InvalidArgument, "malformed %s: %v", pm.ProtoReflect().Descriptor().FullName(), err)
	}
	return nil
}

func (s *guardedStream) SendMsg(m any) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return errStreamClosed
	}
	return s.ServerStream.SendMsg(m)
}

func (s *guardedStream) SendHeader(md metadata.MD) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return errStreamClosed
	}
	return s.ServerStream.SendHeader(md)
}

// close waits for a send in progress, then refuses further sends.
func (s *guardedStream) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}
