package rlqs

import (
	"math"
	"slices"
	"strconv"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// kind is what an assignment tells a bucket to do.
type kind uint8

const (
	// unassigned: nothing sent yet.
	unassigned kind = iota
	// allowAll: a blanket ALLOW_ALL (no rule, unlimited, shadow mode).
	allowAll
	// denyAll: a blanket DENY_ALL (a limit of 0, or no capacity left).
	denyAll
	// tokenBucket: a token bucket of burst tokens, refilled with tokens
	// every fill seconds.
	tokenBucket
)

// assignment is one quota assignment as Envoy enforces it. Envoy reads
// fill_interval in whole seconds only, so fill is whole seconds (≥ 1).
type assignment struct {
	kind   kind
	tokens uint32 // tokens_per_fill
	fill   uint32 // fill_interval, in seconds
	burst  uint32 // max_tokens, also the bucket's initial fill
}

// rate is the requests per second the assignment admits once its burst is
// spent: 0 for anything but a token bucket.
func (a assignment) rate() float64 {
	if a.kind != tokenBucket {
		return 0
	}
	return float64(a.tokens) / float64(a.fill)
}

// cost is the most the assignment admits in a window of w seconds: its
// burst and its rate over the window (a token bucket starts full). A blanket
// ALLOW_ALL costs +Inf; DENY_ALL and nothing cost 0.
func (a assignment) cost(w float64) float64 {
	switch a.kind {
	case tokenBucket:
		return float64(a.burst) + a.rate()*w
	case allowAll:
		return math.Inf(1)
	}
	return 0
}

// strategy is the assignment as Envoy's RateLimitStrategy: only a
// blanket_rule or a token_bucket, the two Envoy's filter enforces.
func (a assignment) strategy() *typev3.RateLimitStrategy {
	switch a.kind {
	case tokenBucket:
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens:     a.burst,
			TokensPerFill: wrapperspb.UInt32(a.tokens),
			FillInterval:  durationpb.New(time.Duration(a.fill) * time.Second),
		}}}
	case denyAll:
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}}
}

// action is the response entry that gives the bucket id the assignment for
// ttl (whole seconds, at least 1: Envoy ignores the nanos and expires an
// assignment with no TTL at once).
func (a assignment) action(id *rlqspb.BucketId, ttl time.Duration) *rlqspb.RateLimitQuotaResponse_BucketAction {
	secs := max(int64(ttl/time.Second), 1)
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: &durationpb.Duration{Seconds: secs},
				RateLimitStrategy:    a.strategy(),
			},
		},
	}
}

// abandonAction is the response entry that makes Envoy forget the bucket.
func abandonAction(id *rlqspb.BucketId) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId:     id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
	}
}

// bucketKey is the canonical form of a bucket id: its pairs sorted by key,
// each length-prefixed, so that two ids are the same bucket exactly when
// their maps are equal.
func bucketKey(bucket map[string]string) string {
	keys := make([]string, 0, len(bucket))
	n := 0
	for k, v := range bucket {
		keys = append(keys, k)
		n += len(k) + len(v) + 8
	}
	slices.Sort(keys)
	b := make([]byte, 0, n)
	for _, k := range keys {
		b = strconv.AppendInt(b, int64(len(k)), 10)
		b = append(b, ':')
		b = append(b, k...)
		v := bucket[k]
		b = strconv.AppendInt(b, int64(len(v)), 10)
		b = append(b, ':')
		b = append(b, v...)
	}
	return string(b)
}
