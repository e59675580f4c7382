// Package xds subscribes to rate-limit rules served by an xDS management
// server, as Envoy Gateway drives envoyproxy/ratelimit: a state-of-the-world
// ADS stream for the ratelimit.config.ratelimit.v3.RateLimitConfig resource.
//
// Every response is converted and validated in full: a good one is applied
// and ACKed, a bad one is NACKed with the reason and the last good rules keep
// serving. A broken stream is re-established with exponential backoff.
package xds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	sotw "github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/leapgate/leapgate/descriptors"
)

// TypeURL is the xDS type of the rate-limit rule resource.
const TypeURL = resource.RateLimitConfigType

// Options configures a subscription.
type Options struct {
	// ServerURL is the management server's address, host:port.
	ServerURL string
	// NodeID and NodeMetadata identify this service to the server.
	NodeID       string
	NodeMetadata map[string]string
	// DialOptions carry the transport credentials (TLS or insecure).
	DialOptions []grpc.DialOption
	// BackoffInitial and BackoffMax bound the delay between reconnection
	// attempts; it doubles after each failure and resets after a response.
	BackoffInitial, BackoffMax time.Duration
	// Apply installs a converted rule set, or refuses it with the reason
	// (for example rules the service cannot serve): a refused set is NACKed
	// and the last good rules keep serving. It is called from the
	// subscription's goroutine.
	Apply func(*descriptors.Set) error
	// OnResult, when set, is told the outcome of every response: nil for an
	// applied (ACKed) one, the reason for a rejected (NACKed) one, whether
	// it failed to convert or Apply refused it.
	OnResult func(err error)
	// Logger receives connection and validation events.
	Logger *slog.Logger
}

// Subscribe follows the management server until ctx is done, applying every
// valid rule set it sends. It returns ctx's error.
func Subscribe(ctx context.Context, opts Options) error {
	if opts.Apply == nil {
		return errors.New("xds: Options.Apply is required")
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	backoff := opts.BackoffInitial
	if backoff <= 0 {
		backoff = time.Second
	}
	maxBackoff := max(opts.BackoffMax, backoff)
	for {
		received, err := stream(ctx, opts, logger)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if received {
			backoff = max(opts.BackoffInitial, time.Millisecond)
		}
		logger.Warn("xds stream ended; reconnecting", "server", opts.ServerURL, "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// stream runs one ADS stream until it fails. It reports whether any response
// arrived, so that a server that answers resets the backoff.
func stream(ctx context.Context, opts Options, logger *slog.Logger) (received bool, err error) {
	conn, err := grpc.NewClient(opts.ServerURL, opts.DialOptions...)
	if err != nil {
		return false, fmt.Errorf("dialling %s: %w", opts.ServerURL, err)
	}
	defer conn.Close()
	node := &corev3.Node{Id: opts.NodeID}
	if len(opts.NodeMetadata) > 0 {
		fields := map[string]any{}
		for k, v := range opts.NodeMetadata {
			fields[k] = v
		}
		md, err := structpb.NewStruct(fields)
		if err != nil {
			return false, fmt.Errorf("node metadata: %w", err)
		}
		node.Metadata = md
	}
	streamCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := sotw.NewADSClient(streamCtx, node, TypeURL)
	if err := client.InitConnect(conn); err != nil {
		return false, fmt.Errorf("opening ADS stream to %s: %w", opts.ServerURL, err)
	}
	logger.Info("xds stream open", "server", opts.ServerURL, "node", opts.NodeID)
	for {
		resp, err := client.Fetch()
		if err != nil {
			return received, fmt.Errorf("receiving from %s: %w", opts.ServerURL, err)
		}
		received = true
		set, err := convert(resp)
		if err == nil {
			err = opts.Apply(set)
		}
		if opts.OnResult != nil {
			opts.OnResult(err)
		}
		if err != nil {
			logger.Error("xds rules rejected; keeping the last good rules", "err", err)
			if err := client.Nack(err.Error()); err != nil {
				return received, fmt.Errorf("sending NACK: %w", err)
			}
			continue
		}
		logger.Info("xds rules applied", "resources", len(resp.Resources))
		if err := client.Ack(); err != nil {
			return received, fmt.Errorf("sending ACK: %w", err)
		}
	}
}

// convert unpacks and validates one state-of-the-world response.
func convert(resp *sotw.Response) (*descriptors.Set, error) {
	cfgs := make([]*rlsconfv3.RateLimitConfig, 0, len(resp.Resources))
	for i, res := range resp.Resources {
		cfg := &rlsconfv3.RateLimitConfig{}
		if err := res.UnmarshalTo(cfg); err != nil {
			return nil, fmt.Errorf("resource %d (%s): %w", i, res.GetTypeUrl(), err)
		}
		cfgs = append(cfgs, cfg)
	}
	return descriptors.FromProto(cfgs)
}
