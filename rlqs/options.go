package rlqs

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leapgate/leapgate/rlqs/quota"
	"github.com/leapgate/leapgate/window"
)

// Options configure a Server. Every field has a default; a zero field
// takes it.
type Options struct {
	// Clock is the server's time: it measures demand between reports and
	// times ticks, TTLs and idleness. If nil, the process's monotonic clock.
	Clock window.Clock
	// Logger receives warnings, and every assignment change at debug level.
	// If nil, nothing is logged.
	Logger *slog.Logger
	// Metrics registers the service's metrics; if nil, none are kept.
	Metrics prometheus.Registerer
	// Tick is the allocation interval: how often demands are divided anew
	// (RLQS_TICK). If 0, 1 s.
	Tick time.Duration
	// AssignmentTTL is the time to live of every assignment, whole seconds
	// (RLQS_ASSIGNMENT_TTL): a bucket no longer refreshed falls back to its
	// expiry behaviour after it, and a closed stream's share is freed after
	// it. Assignments are refreshed once half of it has passed. If 0, 10 s;
	// it must be at least 2 s and at least two ticks.
	AssignmentTTL time.Duration
	// BucketIdle abandons a bucket that has reported no request for this
	// long (RLQS_BUCKET_IDLE). If 0, 60 s.
	BucketIdle time.Duration
	// MaxBucketsPerStream and MaxBucketsPerDomain bound the buckets the
	// server tracks (RLQS_MAX_BUCKETS_PER_STREAM, RLQS_MAX_BUCKETS_PER_DOMAIN):
	// a bucket past either cap is answered, DENY_ALL if a rule limits it and
	// ALLOW_ALL if none does, but neither tracked nor given a share. If 0,
	// 1,000 and 200,000.
	MaxBucketsPerStream int
	MaxBucketsPerDomain int
	// ShadowMode answers every bucket ALLOW_ALL while allocating as usual
	// (SHADOW_MODE), as a rule's shadow_mode does for its buckets.
	ShadowMode bool
	// Ledger, when set, shares the division of every limit with the other
	// replicas that serve RLQS (package redisstore's QuotaLedger); if nil,
	// this replica divides each limit among its own streams alone.
	Ledger quota.Ledger
	// StreamIdle ends a stream that has sent nothing for so long
	// (RLQS_STREAM_IDLE_TIMEOUT); 0 never does. The server enforces it
	// (grpcservice.StreamPolicy).
	StreamIdle time.Duration
}

// withDefaults returns o with every zero field set to its default, or an
// error for a value the server cannot work with.
func (o Options) withDefaults() (Options, error) {
	if o.Clock == nil {
		o.Clock = window.NewMonotonicClock()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Tick == 0 {
		o.Tick = 500 * time.Millisecond
	}
	if o.AssignmentTTL == 0 {
		o.AssignmentTTL = 4 * time.Second
	}
	if o.BucketIdle == 0 {
		o.BucketIdle = time.Minute
	}
	if o.MaxBucketsPerStream == 0 {
		o.MaxBucketsPerStream = 1000
	}
	if o.MaxBucketsPerDomain == 0 {
		o.MaxBucketsPerDomain = 200_000
	}
	switch {
	case o.Tick < 0:
		return o, fmt.Errorf("rlqs: tick %v is negative", o.Tick)
	case o.AssignmentTTL%time.Second != 0 || o.AssignmentTTL < 2*time.Second:
		return o, fmt.Errorf("rlqs: assignment TTL %v is not whole seconds of at least 2 s (Envoy reads whole seconds)", o.AssignmentTTL)
	case o.AssignmentTTL < 2*o.Tick:
		return o, fmt.Errorf("rlqs: assignment TTL %v is shorter than two ticks of %v: assignments would expire before they are refreshed", o.AssignmentTTL, o.Tick)
	case o.BucketIdle < 0 || o.MaxBucketsPerStream < 0 || o.MaxBucketsPerDomain < 0:
		return o, fmt.Errorf("rlqs: negative bucket idle time or cap")
	}
	return o, nil
}
