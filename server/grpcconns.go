package server

import (
	"context"

	"google.golang.org/grpc/stats"
)

// connStats is a gRPC stats handler that marks a connection of the gRPC
// listener serving once it starts its first call or stream, so that the
// listener's cap evicts only connections that never did (limitListener).
// Its listener is set once bound, before the server serves.
type connStats struct{ l *limitListener }

type connStatsKey struct{}

// TagConn finds the listener's connection for the peer's address.
func (h *connStats) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	if h.l == nil || info.RemoteAddr == nil {
		return ctx
	}
	h.l.mu.Lock()
	lc := h.l.byRemote[info.RemoteAddr.String()]
	h.l.mu.Unlock()
	if lc == nil {
		return ctx
	}
	return context.WithValue(ctx, connStatsKey{}, lc)
}

func (*connStats) HandleConn(context.Context, stats.ConnStats) {}

func (*connStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// HandleRPC marks the call's connection serving when the call begins.
func (*connStats) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.Begin); !ok {
		return
	}
	if lc, ok := ctx.Value(connStatsKey{}).(*limitedConn); ok && !lc.served.Load() {
		lc.served.Store(true)
		lc.l.set(lc, phaseServing)
	}
}
