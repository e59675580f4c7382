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
)

// streamGuard bounds the long-lived observation streams (ext_proc and the
// access-log service) that any client can open: at most max at once over
// all connections, and each closed once it has received nothing for idle.
type streamGuard struct {
	max  int64
	idle time.Duration

	open       atomic.Int64
	refused    prometheus.Counter
	idleClosed prometheus.Counter
}

func newStreamGuard(max int, idle time.Duration, reg prometheus.Registerer) *streamGuard {
	g := &streamGuard{
		max:  int64(max),
		idle: idle,
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leapgate_observation_streams_refused_total",
			Help: "ext_proc and access-log streams refused (RESOURCE_EXHAUSTED) because MAX_OBSERVATION_STREAMS were open.",
		}),
		idleClosed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leapgate_observation_streams_idle_closed_total",
			Help: "ext_proc and access-log streams closed (DEADLINE_EXCEEDED) after OBSERVATION_STREAM_IDLE_TIMEOUT without a message.",
		}),
	}
	reg.MustRegister(g.refused, g.idleClosed, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "leapgate_observation_streams",
		Help: "ext_proc and access-log streams open now.",
	}, func() float64 { return float64(g.open.Load()) }))
	return g
}

// errStreamClosed is what a guarded stream's sends return once the guard
// has ended the stream.
var errStreamClosed = errors.New("stream closed by the server")

// serve runs handler on ss within the guard's bounds. The handler runs in
// its own goroutine so that an idle stream can be ended while the handler
// waits in RecvMsg: serve then returns DEADLINE_EXCEEDED, gRPC ends the
// stream, and the pending RecvMsg fails, which makes the handler return.
func (g *streamGuard) serve(ss grpc.ServerStream, handler func(grpc.ServerStream) error) error {
	if g.open.Add(1) > g.max {
		g.open.Add(-1)
		g.refused.Inc()
		return status.Errorf(codes.ResourceExhausted, "%d observation streams are open, the most this server takes (MAX_OBSERVATION_STREAMS)", g.max)
	}
	defer g.open.Add(-1)
	gs := &guardedStream{ServerStream: ss, received: make(chan struct{}, 1)}
	done := make(chan error, 1)
	go func() { done <- handler(gs) }()
	idle := time.NewTimer(g.idle)
	defer idle.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-gs.received:
			idle.Reset(g.idle)
		case <-idle.C:
			gs.close()
			g.idleClosed.Inc()
			return status.Errorf(codes.DeadlineExceeded, "stream sent nothing for %v (OBSERVATION_STREAM_IDLE_TIMEOUT)", g.idle)
		}
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

// RecvMsg receives the next message's bytes (wireCodec leaves them
// undecoded) and decodes them itself: bytes that are not a message are
// then the client's fault, InvalidArgument, where gRPC's own decoding would
// end the stream with Internal.
func (s *guardedStream) RecvMsg(m any) error {
	var w wireMessage
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
	if err := proto.Unmarshal(w.b, pm); err != nil {
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
