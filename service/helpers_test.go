package service

import (
	"context"
	"sync"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/ruletest"
	"github.com/leapgate/leapgate/window"

	"github.com/leapgate/leapgate/internal/testclock"
)

// testBuckets is the default bucket count of time_buckets limits in tests
// (WINDOW_BUCKETS, given to the loader and to the service).
const testBuckets = 10

// testRules is the rule set most tests use. Its sliding windows are
// time_buckets with testBuckets buckets, so
// the answers' arithmetic is easy to follow: a 1s window has 100ms buckets,
// and a hit in bucket b ages out at (b+11) bucket lengths. The default
// sliding_window's answers are tested in TestDefaultSlidingWindowAnswers.
const testRules = `
domain: test
descriptors:
  - key: k
    value: exact
    rate_limit: {unit: second, requests_per_unit: 3, name: exact3, algorithm: time_buckets}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: time_buckets}
  - key: multi
    rate_limits:
      - {unit: second, requests_per_unit: 3, name: per-second, algorithm: time_buckets}
      - {unit: minute, requests_per_unit: 5, name: per-minute, algorithm: time_buckets}
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: time_buckets}
  - key: quota
    value: a
    quota_mode: true
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: time_buckets}
  - key: quota
    value: b
    quota_mode: true
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: time_buckets}
  - key: old
    rate_limit: {unit: second, requests_per_unit: 1, name: legacy, algorithm: time_buckets}
  - key: new
    rate_limit: {unit: second, requests_per_unit: 5, replaces: [{name: legacy}]}
  - key: ban
    rate_limit: {unit: second, requests_per_unit: 0, algorithm: time_buckets}
  - key: ban2
    rate_limit: {unit: second, requests_per_unit: 0, algorithm: time_buckets}
  - key: win
    rate_limit: {window: 30s, requests_per_unit: 2, algorithm: time_buckets}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: time_buckets}
  - key: nested
    value: a
    descriptors:
      - key: sub
        rate_limit: {unit: hour, requests_per_unit: 1, algorithm: time_buckets}
  - key: backend
    value: api
    circuit_breaker: {strategy: error_ratio, threshold: 0.5}
  - key: backend
    value: limited
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: time_buckets}
    circuit_breaker: {strategy: error_ratio, threshold: 0.5}
  - key: backend
    value: shadowed
    shadow_mode: true
    circuit_breaker: {strategy: error_ratio, threshold: 0.5}
  - key: meta
    metadata: {tier: gold, route: primary}
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: time_buckets}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: token_bucket}
  - key: fixed
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: fixed_window}
  - key: log
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: sliding_log}
`

const otherRules = `
domain: other
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
`

func mustParse(t testing.TB, docs ...string) *descriptors.Set {
	t.Helper()
	return ruletest.Parse(t, descriptors.Options{DefaultBuckets: testBuckets}, docs...)
}

// fakeBreakers refuses the rules whose IDs are listed, with a retry time,
// and admits those in probes as probes with the given ids.
type fakeBreakers struct {
	mu      sync.Mutex
	refuse  map[string]time.Duration
	probes  map[string]uint64
	asked   []string
	entries [][]descriptors.Entry
}

func (b *fakeBreakers) AllowProbe(rule *descriptors.Rule, entries []descriptors.Entry) (bool, uint64, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.asked = append(b.asked, rule.ID)
	b.entries = append(b.entries, append([]descriptors.Entry(nil), entries...))
	if d, ok := b.refuse[rule.ID]; ok {
		return false, 0, d
	}
	return true, b.probes[rule.ID], 0
}

type harness struct {
	t     testing.TB
	clock *testclock.Clock
	store *window.Store
	reg   *prometheus.Registry
	svc   *Service
}

func newHarness(t testing.TB, set *descriptors.Set, mod func(*Options)) *harness {
	t.Helper()
	h := &harness{t: t, clock: &testclock.Clock{}, reg: prometheus.NewRegistry()}
	h.store = window.NewStore(window.StoreOptions{Clock: h.clock})
	opts := Options{Limiter: h.store, Registry: h.reg, DefaultBuckets: testBuckets, Clock: h.clock}
	if mod != nil {
		mod(&opts)
	}
	svc, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if set != nil {
		svc.SetRules(set)
	}
	h.svc = svc
	return h
}

func (h *harness) call(req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return h.svc.ShouldRateLimit(context.Background(), req)
}

// counter reads a per-rule counter metric.
func (h *harness) counter(name, domain, key string) float64 {
	h.t.Helper()
	vec := map[string]*prometheus.CounterVec{
		"total_hits":   h.svc.metrics.totalHits,
		"over_limit":   h.svc.metrics.overLimit,
		"near_limit":   h.svc.metrics.nearLimit,
		"within_limit": h.svc.metrics.withinLimit,
		"shadow_mode":  h.svc.metrics.shadowMode,
		"circuit_open": h.svc.metrics.circuitOpen,
	}[name]
	return testutil.ToFloat64(vec.WithLabelValues(domain, key))
}

// Request builders.

type descOpt func(*rlcommonv3.RateLimitDescriptor)

func desc(kv ...string) *rlcommonv3.RateLimitDescriptor {
	d := &rlcommonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func with(d *rlcommonv3.RateLimitDescriptor, opts ...descOpt) *rlcommonv3.RateLimitDescriptor {
	for _, o := range opts {
		o(d)
	}
	return d
}

func refund() descOpt {
	return func(d *rlcommonv3.RateLimitDescriptor) { d.IsNegativeHits = true }
}

func hits(n uint64) descOpt {
	return func(d *rlcommonv3.RateLimitDescriptor) { d.HitsAddend = wrapperspb.UInt64(n) }
}

func override(rpu uint32, unit typev3.RateLimitUnit, mult uint32) descOpt {
	return func(d *rlcommonv3.RateLimitDescriptor) {
		d.Limit = &rlcommonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
		if mult > 0 {
			d.Limit.UnitMultiplier = wrapperspb.UInt32(mult)
		}
	}
}

func req(domain string, descs ...*rlcommonv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs}
}

func reqHits(domain string, n uint32, descs ...*rlcommonv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	r := req(domain, descs...)
	r.HitsAddend = n
	return r
}

// Expected statuses.

type limitWant = rlsv3.RateLimitResponse_RateLimit

func lim(rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, name string) *limitWant {
	return &limitWant{RequestsPerUnit: rpu, Unit: unit, Name: name}
}

func limMult(rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, name string, mult uint32) *limitWant {
	l := lim(rpu, unit, name)
	l.UnitMultiplier = wrapperspb.UInt32(mult)
	return l
}

const (
	codeOK   = rlsv3.RateLimitResponse_OK
	codeOver = rlsv3.RateLimitResponse_OVER_LIMIT
	second   = rlsv3.RateLimitResponse_RateLimit_SECOND
	minute   = rlsv3.RateLimitResponse_RateLimit_MINUTE
	hour     = rlsv3.RateLimitResponse_RateLimit_HOUR
)

type dstatus = rlsv3.RateLimitResponse_DescriptorStatus

func wantOK(l *limitWant, remaining uint32, reset time.Duration) *dstatus {
	return &dstatus{Code: codeOK, CurrentLimit: l, LimitRemaining: remaining, DurationUntilReset: durationpb.New(reset)}
}

func wantOver(l *limitWant, remaining uint32, reset time.Duration) *dstatus {
	s := wantOK(l, remaining, reset)
	s.Code = codeOver
	return s
}

func wantPlain() *dstatus { return &dstatus{Code: codeOK} }

func wantUnlimited() *dstatus { return &dstatus{Code: codeOK, LimitRemaining: UnlimitedRemaining} }

// anyReset in an expected status accepts whatever duration_until_reset the
// limiter reports (used where the window package's value is not ours to pin).
const anyReset = -time.Nanosecond

func checkStatuses(t testing.TB, got *rlsv3.RateLimitResponse, want []*dstatus) {
	t.Helper()
	if len(got.GetStatuses()) != len(want) {
		t.Fatalf("got %d statuses, want %d:\n%s", len(got.GetStatuses()), len(want), prototext.Format(got))
	}
	for i, w := range want {
		if w.DurationUntilReset != nil && w.DurationUntilReset.AsDuration() == anyReset {
			w = proto.Clone(w).(*dstatus)
			w.DurationUntilReset = got.Statuses[i].GetDurationUntilReset()
		}
		if !proto.Equal(got.Statuses[i], w) {
			t.Errorf("status %d:\n got %s\nwant %s", i, prototext.Format(got.Statuses[i]), prototext.Format(w))
		}
	}
}
