package rlqs

import (
	"math"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/leapgate/leapgate/rlqs/quota"
	"github.com/leapgate/leapgate/window"
)

// headroom is the share added to a bucket's measured demand, plus one
// token per window, so that a bucket whose demand is met is not cut by the
// jitter of its own measurement.
const headroom = 1.0 / 64

// minMeasure is the shortest time over which demand is measured: reports
// closer together are added up until it has passed.
const minMeasure = 500 * time.Millisecond

// bucket is one bucket of one stream: its id as reported, its rule, its
// demand and what it was told.
type bucket struct {
	stream  *Stream
	key     string
	id      *rlqspb.BucketId
	ruleID  string  // "" when no rule limits it
	pools   []*pool // one per limit of its rule that RLQS allocates
	shadow  bool    // answered ALLOW_ALL, allocated as usual
	fixed   kind    // allowAll or denyAll for an unpooled bucket
	fill    uint32  // fill_interval of its token buckets, seconds
	minWin  float64 // the shortest window of its pools, seconds
	created time.Duration

	// Demand, measured by the server's clock.
	known bool // demand and admitted are measured
	// inherited marks a bucket whose first report covered time before
	// this server saw it (time_elapsed of a second or more: Envoy reports
	// a new bucket at once, with 0 s), so that it may still enforce a
	// previous server's assignment; inheritedRate is what it admitted then.
	inherited     bool
	inheritedRate float64
	demand        float64 // requests per second offered (allowed + denied)
	admitted      float64 // requests per second allowed
	anchor        time.Duration
	anchored      bool
	accOffered    float64
	accAdmitted   float64
	lastUsed      time.Duration // last report with requests in it

	// Assignments.
	current assignment    // what it was last told
	held    assignment    // what it may still enforce this tick (the larger of a cut)
	sentAt  time.Duration // when current was last sent
	ttlEnd  time.Duration // when the last assignment sent expires
	target  float64       // this tick's target rate, requests per second
}

// pooled reports whether b takes a share of some limit.
func (b *bucket) pooled() bool { return len(b.pools) > 0 }

// record takes one usage report of b at now.
func (b *bucket) record(now time.Duration, u *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage) {
	// Counts past a limit's maximum claim no more than it (a demand counts
	// for at most the limit); capping them keeps every sum finite.
	allowed := min(float64(u.GetNumRequestsAllowed()), window.MaxLimit)
	denied := min(float64(u.GetNumRequestsDenied()), window.MaxLimit)
	offered := allowed + denied
	if offered > 0 {
		b.lastUsed = now
	}
	if !b.anchored {
		b.anchored, b.anchor = true, now
		if secs := u.GetTimeElapsed().GetSeconds(); secs >= 1 {
			b.known, b.inherited = true, true
			b.demand, b.admitted = offered/float64(secs), allowed/float64(secs)
			b.inheritedRate = b.admitted
			return
		}
		b.accOffered, b.accAdmitted = offered, allowed
		return
	}
	b.accOffered += offered
	b.accAdmitted += allowed
	if dt := now - b.anchor; dt >= minMeasure {
		secs := dt.Seconds()
		b.known = true
		b.demand, b.admitted = b.accOffered/secs, b.accAdmitted/secs
		b.accOffered, b.accAdmitted, b.anchor = 0, 0, now
	}
}

// tokenBucket is the token bucket that admits rate requests per second in
// b's fill interval, with b's burst, or DENY_ALL when that is not one
// whole token per fill.
func (b *bucket) tokenBucket(rate float64) assignment {
	tokens := math.Floor(rate*float64(b.fill) + 1e-9)
	if tokens < 1 {
		return assignment{kind: denyAll}
	}
	tokens = min(tokens, window.MaxLimit)
	burst := max(quota.MinBurst, math.Floor(quota.BurstShare*rate*b.minWin))
	return assignment{kind: tokenBucket, tokens: uint32(tokens), fill: b.fill, burst: uint32(min(burst, window.MaxLimit))}
}

// demandIn is the share of p that b claims, in tokens per window of p:
// its measured demand with headroom, at most p's limit; +Inf while its
// demand is unknown. While learning, a bucket that may still enforce a
// previous server's assignment claims no more than it admitted under it,
// and any other a hold.
func (b *bucket) demandIn(p *pool, learning bool) float64 {
	switch {
	case learning && b.inherited:
		return min(p.limit, min(b.demand, b.inheritedRate)*p.window)
	case learning:
		return p.holdTokens()
	case !b.known:
		return math.Inf(1)
	}
	return min(p.limit, b.demand*p.window*(1+headroom)+1)
}
