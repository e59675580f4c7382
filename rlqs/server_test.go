package rlqs

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/ruletest"
	"github.com/leapgate/leapgate/internal/testclock"
)

const testRules = `domain: web
descriptors:
  - key: name
    value: api
    rate_limit: {unit: second, requests_per_unit: 400}
  - key: name
    value: banned
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: name
    value: free
    rate_limit: {unlimited: true}
  - key: name
    value: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 600}
  - key: two
    value: limits
    rate_limits:
      - {unit: second, requests_per_unit: 100}
      - {unit: minute, requests_per_unit: 1200}
  - key: tenant
    descriptors:
      - key: plan
        rate_limit: {unit: second, requests_per_unit: 50}
`

// harness is a Server on a test clock with the streams it opened and what
// each received.
type harness struct {
	t      *testing.T
	clock  *testclock.Clock
	server *Server
	reg    *prometheus.Registry
}

func newHarness(t *testing.T, opts Options, rules string) *harness {
	t.Helper()
	h := &harness{t: t, clock: testclock.At(time.Hour), reg: prometheus.NewRegistry()}
	opts.Clock, opts.Metrics = h.clock, h.reg
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.SetRules(ruletest.Parse(t, descriptors.Options{}, rules))
	h.server = s
	return h
}

// client is one stream and everything it received, latest per bucket.
type client struct {
	stream   *Stream
	received []*rlqspb.RateLimitQuotaResponse
	latest   map[string]*rlqspb.RateLimitQuotaResponse_BucketAction
	// expires is when the latest assignment per bucket expires.
	expires map[string]time.Duration
}

func (h *harness) open() *client {
	c := &client{latest: map[string]*rlqspb.RateLimitQuotaResponse_BucketAction{}, expires: map[string]time.Duration{}}
	c.stream = h.server.Open(func(m *rlqspb.RateLimitQuotaResponse) {
		c.received = append(c.received, m)
		for _, a := range m.GetBucketAction() {
			k := bucketKey(a.GetBucketId().GetBucket())
			c.latest[k] = a
			c.expires[k] = h.clock.Now() + a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration()
		}
	})
	return c
}

func usage(bucket map[string]string, secs int64, allowed, denied uint64) *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqspb.BucketId{Bucket: bucket},
		TimeElapsed: &durationpb.Duration{Seconds: secs}, NumRequestsAllowed: allowed, NumRequestsDenied: denied}
}

func (c *client) report(domain string, us ...*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage) {
	c.stream.Report(&rlqspb.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: us})
}

// strategy describes the latest action for bucket: "none", "abandon",
// "allow", "deny" or "tb <tokens>/<fill>s burst <n> ttl <t>s".
func (c *client) strategy(bucket map[string]string) string {
	a := c.latest[bucketKey(bucket)]
	switch {
	case a == nil:
		return "none"
	case a.GetAbandonAction() != nil:
		return "abandon"
	}
	q := a.GetQuotaAssignmentAction()
	s := q.GetRateLimitStrategy()
	if tb := s.GetTokenBucket(); tb != nil {
		return fmt.Sprintf("tb %d/%ds burst %d ttl %ds", tb.GetTokensPerFill().GetValue(), tb.GetFillInterval().GetSeconds(), tb.GetMaxTokens(), q.GetAssignmentTimeToLive().GetSeconds())
	}
	if s.GetBlanketRule().String() == "DENY_ALL" {
		return "deny"
	}
	return "allow"
}

// rate is the requests per second of the latest token bucket for bucket,
// 0 for anything else.
func (c *client) rate(bucket map[string]string) float64 {
	tb := c.latest[bucketKey(bucket)].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb == nil {
		return 0
	}
	return float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
}

// run advances the clock by d in ticks of the server's Tick, each client
// reporting offered requests per second every report (allowed as its
// latest assignment admits, the rest denied).
func (h *harness) run(d, report time.Duration, load map[*client]map[string]float64) {
	tick := h.server.opts.Tick
	since := map[*client]time.Duration{}
	for t := time.Duration(0); t < d; t += tick {
		h.clock.Advance(tick)
		for c, buckets := range load {
			if since[c] += tick; since[c] < report {
				continue
			}
			secs := since[c].Seconds()
			since[c] = 0
			var us []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
			for b, offered := range buckets {
				id := parseID(b)
				allowed := math.Min(offered, c.rate(id)) * secs
				if c.strategy(id) == "allow" || c.strategy(id) == "none" {
					allowed = offered * secs
				}
				us = append(us, usage(id, int64(secs), uint64(allowed), uint64(offered*secs-allowed)))
			}
			c.report("web", us...)
		}
		h.server.Tick(context.Background())
	}
}

// parseID turns "k=v" into a bucket id.
func parseID(s string) map[string]string {
	for i := range s {
		if s[i] == '=' {
			return map[string]string{s[:i]: s[i+1:]}
		}
	}
	return map[string]string{s: ""}
}

var api = map[string]string{"name": "api"}

// TestFirstReportGetsAHold: Envoy's first report of a bucket (time_elapsed
// 0) is answered at once, by the kind of its rule, with the id exactly as
// reported and a TTL of whole seconds.
func TestFirstReportGetsAHold(t *testing.T) {
	tests := []struct {
		name   string
		domain string
		bucket map[string]string
		want   string
	}{
		{"limited: a hold of the reserve", "web", api, "tb 2/1s burst 2 ttl 4s"},
		{"limit 0", "web", map[string]string{"name": "banned"}, "deny"},
		{"unlimited", "web", map[string]string{"name": "free"}, "allow"},
		{"no rule", "web", map[string]string{"name": "other"}, "allow"},
		{"shadow mode", "web", map[string]string{"name": "shadow"}, "allow"},
		{"unknown domain", "nope", api, "allow"},
		{"no pairs", "web", map[string]string{}, "allow"},
		{"empty key", "web", map[string]string{"": "api"}, "allow"},
		{"two levels in any order", "web", map[string]string{"plan": "gold", "tenant": "t1"}, "tb 1/1s burst 2 ttl 4s"},
		{"a minute limit fills every minute", "web", map[string]string{"user": "u1"}, "tb 3/60s burst 2 ttl 4s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Options{}, testRules)
			c := h.open()
			c.report(tt.domain, usage(tt.bucket, 0, 1, 0))
			if len(c.received) != 1 {
				t.Fatalf("got %d responses, want 1 at once", len(c.received))
			}
			if got := c.strategy(tt.bucket); got != tt.want {
				t.Errorf("first answer %q, want %q", got, tt.want)
			}
		})
	}
}
