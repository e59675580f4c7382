package rlqssim

import (
	"context"
	"errors"
	"sync"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// GRPC is a Transport to a running server over gRPC, in real time: the
// simulation's clock follows the wall clock from its first Tick, and the
// server ticks on its own. Each simulated filter gets its own stream, as
// each Envoy holds one.
type GRPC struct {
	cc    *grpc.ClientConn
	token string
	start time.Time

	mu      sync.Mutex
	pending []func() // responses received, delivered on the next Tick
}

// DialGRPC connects to the server at addr (plaintext); token, when set, is
// sent as "authorization: Bearer <token>" on every stream, as Envoy's
// initial_metadata does.
func DialGRPC(addr, token string) (*GRPC, error) {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &GRPC{cc: cc, token: token}, nil
}

// Close closes the connection.
func (g *GRPC) Close() error { return g.cc.Close() }

// Open opens a stream; its responses are delivered on the simulation's
// goroutine at the next Tick.
func (g *GRPC) Open(receive func(*rlqspb.RateLimitQuotaResponse)) (Conn, error) {
	ctx, cancel := context.WithCancel(context.Background())
	if g.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+g.token)
	}
	stream, err := rlqspb.NewRateLimitQuotaServiceClient(g.cc).StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	c := &grpcConn{stream: stream, cancel: cancel}
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				c.mu.Lock()
				c.err = err
				c.mu.Unlock()
				return
			}
			g.mu.Lock()
			g.pending = append(g.pending, func() { receive(m) })
			g.mu.Unlock()
		}
	}()
	return c, nil
}

// Tick waits until the wall clock reaches now (from the first Tick on),
// then delivers the responses received.
func (g *GRPC) Tick(now time.Duration) {
	if g.start.IsZero() {
		g.start = time.Now().Add(-now)
	}
	if ahead := time.Until(g.start.Add(now)); ahead > 2*time.Millisecond {
		time.Sleep(ahead)
	}
	g.mu.Lock()
	pending := g.pending
	g.pending = nil
	g.mu.Unlock()
	for _, f := range pending {
		f()
	}
}

// Restart is not supported over gRPC: the caller restarts the server.
func (g *GRPC) Restart(time.Duration) {}

type grpcConn struct {
	stream rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	cancel context.CancelFunc
	mu     sync.Mutex
	err    error
}

func (c *grpcConn) Report(m *rlqspb.RateLimitQuotaUsageReports) error {
	c.mu.Lock()
	err := c.err
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if err := c.stream.Send(m); err != nil {
		return errors.Join(errors.New("the stream is lost"), err)
	}
	return nil
}

func (c *grpcConn) Close() {
	_ = c.stream.CloseSend()
	c.cancel()
}
