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
	"math/rand/v2"
	"slices"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/leapgate/leapgate/descriptors"
)

// TypeURL is the xDS type of the rate-limit rule resource.
const TypeURL = resource.RateLimitConfigType

// The delay before NACKing a response rejected for the same reason as the
// one before: it starts at minRepeatDelay and doubles up to maxRepeatDelay.
const (
	minRepeatDelay = 50 * time.Millisecond
	maxRepeatDelay = time.Second
)

// Options configures a subscription.
type Options struct {
	// ServerURL is the management server's address, host:port.
	ServerURL string
	// NodeID and NodeMetadata identify this service to the server.
	NodeID       string
	NodeMetadata map[string]string
	// DialOptions carry the transport credentials (TLS or insecure).
	DialOptions []grpc.DialOption
	// Headers are sent as gRPC metadata on every ADS stream
	// (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS), e.g. an authorization
	// token the management server checks.
	Headers map[string]string
	// MaxRecvMsgSize, when positive, is the largest response accepted
	// (XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES); 0 is gRPC's default, 4 MiB. Envoy
	// Gateway sends every rule of a gateway in one response.
	MaxRecvMsgSize int
	// ConnectRetryInterval is the wait after an attempt that could not open
	// a stream at all (CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL; 3s if
	// 0), before jitter.
	ConnectRetryInterval time.Duration
	// BackoffInitial and BackoffMax bound the delay before re-opening a
	// stream that ended after it had opened; it doubles after each such
	// failure and resets after a response. BackoffInitial is 1s if 0; a
	// BackoffMax below it is BackoffInitial.
	BackoffInitial, BackoffMax time.Duration
	// Jitter, when true, spreads every wait uniformly over
	// [d*(1-RandomFactor), d*(1+RandomFactor)] (capped at BackoffMax for
	// the backoff), so that replicas do not reconnect in step
	// (XDS_CLIENT_BACKOFF_JITTER, XDS_CLIENT_BACKOFF_RANDOM_FACTOR).
	Jitter       bool
	RandomFactor float64
	// Rand returns a number in [0, 1) for the jitter; nil is math/rand/v2.
	Rand func() float64
	// Rules says how resources become rules, as for files: merged domains
	// (MERGE_DOMAIN_CONFIG) and the default charge (DEFAULT_CHARGE).
	Rules descriptors.Options
	// Apply installs a converted rule set, or refuses it with the reason
	// (for example rules the service cannot serve): a refused set is NACKed
	// and the last good rules keep serving. It is called from the
	// subscription's goroutine.
	Apply func(*descriptors.Set) error
	// OnResult, when set, is told the outcome of every response: nil for an
	// applied (ACKed) one, the reason for a rejected (NACKed) one, whether
	// it failed to convert or Apply refused it. It then owns reporting
	// rejections; without it each is logged at error level.
	OnResult func(err error)
	// Logger receives connection and validation events.
	Logger *slog.Logger

	// after, when set, replaces time.After for every wait (tests record
	// the waits through it).
	after func(time.Duration) <-chan time.Time
}

// wait returns a channel that receives after d, as time.After does.
func (opts *Options) wait(d time.Duration) <-chan time.Time {
	if opts.after != nil {
		return opts.after(d)
	}
	return time.After(d)
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
	waits := newReconnectSchedule(opts)
	for {
		opened, received, err := stream(ctx, opts, logger)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := opts.jitter(waits.next(opened, received), waits.max)
		logger.Warn("xds stream ended; reconnecting", "server", opts.ServerURL, "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-opts.wait(wait):
		}
	}
}

// reconnectSchedule is the wait before each new stream, before jitter:
// ConnectRetryInterval after an attempt that never opened a stream, else a
// backoff from BackoffInitial doubling up to BackoffMax, back to
// BackoffInitial once a stream received a response.
type reconnectSchedule struct {
	retry, initial, max, backoff time.Duration
}

// Defaults of Options' waits, when 0.
const (
	defaultConnectRetryInterval = 3 * time.Second
	defaultBackoffInitial       = time.Second
)

func newReconnectSchedule(opts Options) *reconnectSchedule {
	s := &reconnectSchedule{retry: opts.ConnectRetryInterval, initial: opts.BackoffInitial}
	if s.retry <= 0 {
		s.retry = defaultConnectRetryInterval
	}
	if s.initial <= 0 {
		s.initial = defaultBackoffInitial
	}
	s.max = max(opts.BackoffMax, s.initial)
	s.backoff = s.initial
	return s
}

// next returns the wait after a stream that ended: whether it had opened
// and whether it received any response.
func (s *reconnectSchedule) next(opened, received bool) time.Duration {
	if received {
		s.backoff = s.initial
	}
	if !opened {
		return s.retry
	}
	wait := s.backoff
	s.backoff = min(2*s.backoff, s.max)
	return wait
}

// nextRepeatDelay is the delay before NACKing a response rejected for the
// same reason as the one before, after a delay of d for that one.
func nextRepeatDelay(d time.Duration) time.Duration {
	return min(max(2*d, minRepeatDelay), maxRepeatDelay)
}

// jitter spreads d as Options.Jitter says, never above limit unless d is.
func (opts Options) jitter(d, limit time.Duration) time.Duration {
	if !opts.Jitter || opts.RandomFactor <= 0 {
		return d
	}
	r := opts.Rand
	if r == nil {
		r = rand.Float64
	}
	f := min(opts.RandomFactor, 1)
	j := time.Duration(float64(d) * (1 - f + 2*f*r()))
	if j > limit && d <= limit {
		j = limit
	}
	return j
}

// stream runs one ADS stream until it fails. It reports whether the stream
// opened and whether any response arrived, so that a server that answers
// resets the backoff.
func stream(ctx context.Context, opts Options, logger *slog.Logger) (opened, received bool, err error) {
	dial := opts.DialOptions
	if opts.MaxRecvMsgSize > 0 {
		dial = append(slices.Clip(dial), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(opts.MaxRecvMsgSize)))
	}
	conn, err := grpc.NewClient(opts.ServerURL, dial...)
	if err != nil {
		return false, false, fmt.Errorf("dialling %s: %w", opts.ServerURL, err)
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
			return false, false, fmt.Errorf("node metadata: %w", err)
		}
		node.Metadata = md
	}
	streamCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(opts.Headers) > 0 {
		streamCtx = metadata.NewOutgoingContext(streamCtx, metadata.New(opts.Headers))
	}
	client, err := openADS(streamCtx, conn, node)
	if err != nil {
		return false, false, fmt.Errorf("opening ADS stream to %s: %w", opts.ServerURL, err)
	}
	logger.Info("xds stream open", "server", opts.ServerURL, "node", opts.NodeID)
	var lastRejected string
	var repeatDelay time.Duration
	for {
		resp, err := client.recv()
		if err != nil {
			// A stream the server never answered did not really open
			// (an unreachable or refusing server fails here, not above).
			return received, received, fmt.Errorf("receiving from %s: %w", opts.ServerURL, err)
		}
		received = true
		set, err := convert(resp, opts.Rules)
		if err == nil {
			err = opts.Apply(set)
		}
		if opts.OnResult != nil {
			opts.OnResult(err)
		}
		if err != nil {
			if opts.OnResult == nil {
				logger.Error("xds rules rejected; keeping the last good rules", "err", err)
			}
			// go-control-plane answers a NACK by sending the same
			// resources again at once: NACK a repeat only after a delay
			// that doubles up to maxRepeatDelay, so the loop costs little
			// and a fixed snapshot still arrives within it.
			if err.Error() == lastRejected {
				repeatDelay = nextRepeatDelay(repeatDelay)
				select {
				case <-ctx.Done():
					return true, received, ctx.Err()
				case <-opts.wait(repeatDelay):
				}
			} else {
				lastRejected, repeatDelay = err.Error(), 0
			}
			if err := client.nack(err.Error()); err != nil {
				return true, received, fmt.Errorf("sending NACK: %w", err)
			}
			continue
		}
		lastRejected, repeatDelay = "", 0
		logger.Info("xds rules applied", "version", resp.GetVersionInfo(), "resources", len(resp.GetResources()))
		if err := client.ack(resp.GetVersionInfo()); err != nil {
			return true, received, fmt.Errorf("sending ACK: %w", err)
		}
	}
}

// convert unpacks and validates one state-of-the-world response: of
// TypeURL (a response of another type is refused, not read as an empty
// rule set), every resource a RateLimitConfig.
func convert(resp *discoveryv3.DiscoveryResponse, opts descriptors.Options) (*descriptors.Set, error) {
	if got := resp.GetTypeUrl(); got != TypeURL {
		return nil, fmt.Errorf("a response of type %q on a subscription to %s", got, TypeURL)
	}
	cfgs := make([]*rlsconfv3.RateLimitConfig, 0, len(resp.GetResources()))
	for i, res := range resp.GetResources() {
		cfg := &rlsconfv3.RateLimitConfig{}
		if err := res.UnmarshalTo(cfg); err != nil {
			return nil, fmt.Errorf("resource %d (%s): %w", i, res.GetTypeUrl(), err)
		}
		cfgs = append(cfgs, cfg)
	}
	return descriptors.FromProto(cfgs, opts)
}
