package rlqssim

import (
	"fmt"
	"math"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Behavior is what a simulated filter does for a bucket with no usable
// assignment, as Envoy's no_assignment_behavior and
// expired_assignment_behavior configure it.
type Behavior struct {
	// Deny refuses every request; otherwise requests are allowed, or
	// limited by Rate when it is positive.
	Deny bool
	// Rate, when positive, is a fallback token bucket's rate (requests per
	// second), with a burst of one second of it.
	Rate float64
}

// filter is one simulated Envoy rate_limit_quota filter: one stream to the
// server and one bucket per bucket id, as Envoy's filter keeps them.
type filter struct {
	sim    *sim
	client *Client
	conn   Conn // nil while the stream is down
	bucket *envoyBucket
	// lastReport is when the periodic report timer last fired.
	lastReport time.Duration
	timer      bool // the report timer runs (from the first request on)
}

// envoyBucket is the filter's state of one bucket.
type envoyBucket struct {
	id              map[string]string
	assigned        bool // some assignment was received and not abandoned
	deny, allow     bool // a blanket rule in force
	tokens, max     float64
	rate            float64 // tokens per second
	last            time.Duration
	expires         time.Duration
	allowed, denied uint64 // since the last report
	fallbackTokens  float64
	lastTB          [3]int64 // max_tokens, tokens_per_fill and the nanos of fill_interval: what Envoy compares
}

// admit decides one request at now.
func (f *filter) admit(now time.Duration) bool {
	b := f.bucket
	if b == nil {
		b = &envoyBucket{id: f.client.Bucket, last: now}
		f.bucket = b
		// The first request of a new bucket: an immediate report, 0 s.
		ok := f.fallback(now, f.client.NoAssignment)
		f.count(ok)
		f.report(now, 0)
		return ok
	}
	var ok bool
	switch {
	case !b.assigned:
		ok = f.fallback(now, f.client.NoAssignment)
	case now >= b.expires:
		ok = f.fallback(now, f.client.Expiry)
	case b.allow:
		ok = true
	case b.deny:
		ok = false
	default:
		b.tokens = math.Min(b.max, b.tokens+b.rate*(now-b.last).Seconds())
		b.last = now
		if b.tokens >= 1 {
			b.tokens--
			ok = true
		}
	}
	f.count(ok)
	return ok
}

func (f *filter) count(ok bool) {
	if ok {
		f.bucket.allowed++
	} else {
		f.bucket.denied++
	}
}

// fallback decides a request by beh at now.
func (f *filter) fallback(now time.Duration, beh Behavior) bool {
	b := f.bucket
	switch {
	case beh.Deny:
		return false
	case beh.Rate > 0:
		b.fallbackTokens = math.Min(beh.Rate, b.fallbackTokens+beh.Rate*(now-b.last).Seconds())
		b.last = now
		if b.fallbackTokens >= 1 {
			b.fallbackTokens--
			return true
		}
		return false
	}
	return true
}

// report sends the bucket's usage since the last report, with
// time_elapsed in whole seconds, reopening the stream first if it is down
// (Envoy reopens it on its report timer). Usage is dropped when the server
// is down.
func (f *filter) report(now time.Duration, elapsed time.Duration) {
	if f.conn == nil {
		c, err := f.sim.transport.Open(f.receive)
		if err != nil {
			f.bucket.allowed, f.bucket.denied = 0, 0
			return
		}
		f.conn = c
	}
	var usages []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
	if b := f.bucket; b != nil {
		usages = append(usages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqspb.BucketId{Bucket: b.id},
			TimeElapsed:        &durationpb.Duration{Seconds: int64(elapsed / time.Second)},
			NumRequestsAllowed: b.allowed,
			NumRequestsDenied:  b.denied,
		})
		b.allowed, b.denied = 0, 0
	}
	f.sim.protocolCheckReport(f)
	if err := f.conn.Report(&rlqspb.RateLimitQuotaUsageReports{Domain: f.sim.scenario.Domain, BucketQuotaUsages: usages}); err != nil {
		f.conn = nil
	}
}

// receive takes one response from the server, as Envoy's filter reads it
// (called from the simulation loop, never concurrently with admit).
func (f *filter) receive(m *rlqspb.RateLimitQuotaResponse) {
	f.sim.inbox = append(f.sim.inbox, delivery{f, m})
}

// apply applies one response at now.
func (f *filter) apply(now time.Duration, m *rlqspb.RateLimitQuotaResponse) {
	for _, a := range m.GetBucketAction() {
		b := f.bucket
		if b == nil || !sameID(a.GetBucketId().GetBucket(), b.id) {
			f.sim.protocolError(fmt.Sprintf("%s: an action for bucket %v, not the one reported", f.client.Name, a.GetBucketId().GetBucket()))
			continue
		}
		if a.GetAbandonAction() != nil {
			f.bucket = nil
			continue
		}
		q := a.GetQuotaAssignmentAction()
		ttl := q.GetAssignmentTimeToLive()
		if ttl.GetSeconds() < 1 {
			f.sim.protocolError(fmt.Sprintf("%s: TTL %v is not at least one whole second (Envoy expires it at once)", f.client.Name, ttl.AsDuration()))
		}
		s := q.GetRateLimitStrategy()
		b.assigned = true
		b.expires = now + time.Duration(ttl.GetSeconds())*time.Second
		switch {
		case s.GetTokenBucket() != nil:
			tb := s.GetTokenBucket()
			fill := tb.GetFillInterval()
			if fill.GetSeconds() < 1 {
				f.sim.protocolError(fmt.Sprintf("%s: fill interval %v under one second (Envoy divides by its whole seconds)", f.client.Name, fill.AsDuration()))
				continue
			}
			key := [3]int64{int64(tb.GetMaxTokens()), int64(tb.GetTokensPerFill().GetValue()), int64(fill.GetNanos())}
			if b.allow || b.deny || key != b.lastTB {
				// A different bucket: Envoy starts a new one, full.
				b.tokens, b.last = float64(tb.GetMaxTokens()), now
			}
			b.lastTB = key
			b.allow, b.deny = false, false
			b.max = float64(tb.GetMaxTokens())
			b.rate = float64(tb.GetTokensPerFill().GetValue()) / float64(fill.GetSeconds())
		case s.GetBlanketRule().String() == "DENY_ALL":
			b.allow, b.deny = false, true
		case s.GetStrategy() != nil && s.GetTokenBucket() == nil && s.GetRequestsPerTimeUnit() == nil:
			b.allow, b.deny = true, false
		default:
			f.sim.protocolError(fmt.Sprintf("%s: a strategy Envoy ignores: %v", f.client.Name, s))
		}
	}
}

func sameID(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
