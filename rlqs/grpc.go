package rlqs

import (
	"context"
	"errors"
	"io"
	"sync/atomic"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leapgate/leapgate/internal/grpcservice"
)

// StreamBudget is the stream budget (grpcservice.StreamPolicy.Budget) of
// RLQS streams (MAX_RLQS_STREAMS): any client can open them, so the server
// bounds how many are open at once.
const StreamBudget = "rlqs"

// sendQueue is how many responses a stream may have waiting to be sent: a
// client that reads none of them is dropped rather than let them pile up.
const sendQueue = 64

// Service returns s as the server hosts it:
// envoy.service.rate_limit_quota.v3.RateLimitQuotaService, its streams
// under StreamBudget and Options.StreamIdle, open only to trusted peers (a
// stream claims a share of every limit it reports on).
func (s *Server) Service() grpcservice.Service {
	return grpcservice.Service{
		Register: func(r grpc.ServiceRegistrar) { rlqspb.RegisterRateLimitQuotaServiceServer(r, handler{s}) },
		Streams:  grpcservice.StreamPolicy{Budget: StreamBudget, Idle: s.opts.StreamIdle, Trusted: true},
	}
}

// handler serves StreamRateLimitQuotas on a Server.
type handler struct{ server *Server }

// StreamRateLimitQuotas feeds the stream's reports to the server and sends
// it the server's responses until the client ends the stream (OK) or the
// stream fails. Reports are decoded by gRPC's proto codec and never
// validated (Envoy sends time_elapsed 0 and empty reports). A client that
// leaves sendQueue responses unread is ended with RESOURCE_EXHAUSTED.
func (h handler) StreamRateLimitQuotas(stream rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	out := make(chan *rlqspb.RateLimitQuotaResponse, sendQueue)
	var overflowed atomic.Bool
	st := h.server.Open(func(m *rlqspb.RateLimitQuotaResponse) {
		select {
		case out <- m:
		default:
			overflowed.Store(true)
			cancel()
		}
	})
	defer st.Close()
	received := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				received <- err
				return
			}
			st.Report(m)
		}
	}()
	for {
		select {
		case m := <-out:
			if err := stream.Send(m); err != nil {
				return err
			}
		case err := <-received:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-ctx.Done():
			if overflowed.Load() {
				return status.Errorf(codes.ResourceExhausted, "the stream left %d responses unread", sendQueue)
			}
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}
