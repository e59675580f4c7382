package rlqs

import (
	"context"
	"sync"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/logthrottle"
	"github.com/leapgate/leapgate/rlqs/quota"
)

// Server divides each rule's limit among the Envoys that report usage on
// it: it keeps every stream's buckets, measures their demand, and on every
// tick assigns each bucket a token bucket so that the assignments in force
// never jointly admit more than the rule in any window of its length. It is
// safe for concurrent use. The gRPC handler (Service) drives it; so can a
// simulator, through Open, Stream.Report, Stream.Close and Tick.
type Server struct {
	opts    Options
	metrics *metrics
	// learnUntil ends the learning period after start (one TTL and a
	// tick): until then, in a pool where some Envoy reports usage from
	// before this server (a restart), no bucket is given more than it
	// reported admitting, since a previous server's assignments may still
	// be in force.
	learnUntil time.Duration

	// warn throttles the warnings of a failing ledger.
	warn logthrottle.Throttle

	mu          sync.Mutex
	lastDivided time.Duration // when the limits were last divided
	rules       *descriptors.Set
	rematch     bool // rules changed since the last tick
	streams     map[*Stream]struct{}
	orphans     map[*bucket]struct{}   // buckets of closed streams, until their TTL ends
	pools       map[string]*pool       // by counter key
	withdraw    map[string]quota.Claim // ledger claims to withdraw on the next tick, by counter key
	perDomain   map[string]int         // tracked buckets per domain, orphans included
	nextStream  uint64
}

// New returns a Server with no rules (every bucket ALLOW_ALL until
// SetRules), or an error for invalid options.
func New(opts Options) (*Server, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{
		opts:      opts,
		streams:   map[*Stream]struct{}{},
		orphans:   map[*bucket]struct{}{},
		pools:     map[string]*pool{},
		withdraw:  map[string]quota.Claim{},
		perDomain: map[string]int{},
	}
	s.learnUntil = opts.Clock.Now() + opts.AssignmentTTL + opts.Tick
	if s.metrics, err = newMetrics(opts.Metrics); err != nil {
		return nil, err
	}
	return s, nil
}

// CheckRules reports nothing: every rule set is served (rules RLQS cannot
// enforce, circuit breakers and concurrency limits, are answered ALLOW_ALL
// and warned about by SetRules).
func (s *Server) CheckRules(*descriptors.Set) error { return nil }

// SetRules swaps set in; every bucket is matched against it again on the
// next tick, so a changed limit reaches the assignments within one tick.
func (s *Server) SetRules(set *descriptors.Set) {
	for _, r := range set.Rules() {
		if r.Breaker != nil || r.HolderKey != "" {
			s.opts.Logger.Warn("RLQS does not enforce circuit breakers or concurrency limits: its buckets on this rule get ALLOW_ALL for them",
				"rule", r.ID, "file", r.File, "line", r.Line)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules = set
	s.rematch = true
}

// Run calls Tick every Options.Tick until ctx is done.
func (s *Server) Run(ctx context.Context) {
	t := time.NewTicker(s.opts.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Tick(ctx)
		}
	}
}

// Stream is one client's RLQS stream: one Envoy and one domain.
type Stream struct {
	server  *Server
	id      uint64
	send    func(*rlqspb.RateLimitQuotaResponse)
	domain  string
	buckets map[string]*bucket // by bucketKey
	closed  bool
}

// Open registers a new stream whose responses go to send. send is called
// with the server's lock held, so it must not block or call back into the
// server; it may drop the stream (and then Close it) when it cannot keep up.
func (s *Server) Open(send func(*rlqspb.RateLimitQuotaResponse)) *Stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextStream++
	st := &Stream{server: s, id: s.nextStream, send: send, buckets: map[string]*bucket{}}
	s.streams[st] = struct{}{}
	return st
}

// Close ends the stream. Its buckets keep their share until their
// assignments' TTL ends (the Envoy may go on enforcing them), then it is
// freed. Close is idempotent.
func (st *Stream) Close() {
	s := st.server
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.closed {
		return
	}
	st.closed = true
	delete(s.streams, st)
	for _, b := range st.buckets {
		if b.pooled() {
			s.orphans[b] = struct{}{}
			continue
		}
		s.forget(b)
	}
	st.buckets = nil
}

// Report takes one usage report of the stream, as Envoy's filter sends it:
// the domain of the first message that names one is the stream's (later
// ones are ignored), a report of no buckets is a heartbeat, time_elapsed may
// be 0 and is read in whole seconds. A bucket seen for the first time is
// answered at once: a small hold of its rule's reserve (DENY_ALL when none
// is left), until the next ticks have cut the others to make room for its
// share. Reports on a closed stream are ignored.
func (st *Stream) Report(msg *rlqspb.RateLimitQuotaUsageReports) {
	s := st.server
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.closed {
		return
	}
	now := s.opts.Clock.Now()
	s.metrics.reports.Inc()
	if st.domain == "" {
		st.domain = msg.GetDomain()
	}
	if st.domain == "" {
		return
	}
	known := s.rules.HasDomain(st.domain)
	if !known {
		s.metrics.unknownDomainReports.Inc()
	}
	var actions []*rlqspb.RateLimitQuotaResponse_BucketAction
	for _, u := range msg.GetBucketQuotaUsages() {
		ids := u.GetBucketId().GetBucket()
		key := bucketKey(ids)
		b := st.buckets[key]
		if b == nil {
			if !known {
				actions = append(actions, assignment{kind: allowAll}.action(u.GetBucketId(), s.opts.AssignmentTTL))
				continue
			}
			if len(st.buckets) >= s.opts.MaxBucketsPerStream || s.perDomain[st.domain] >= s.opts.MaxBucketsPerDomain {
				actions = append(actions, s.untracked(st.domain, ids).action(u.GetBucketId(), s.opts.AssignmentTTL))
				s.metrics.capped.Inc()
				continue
			}
			b = s.track(st, key, u.GetBucketId(), now)
			actions = append(actions, s.sendAction(b, now))
		}
		b.record(now, u)
	}
	if len(actions) > 0 {
		st.send(&rlqspb.RateLimitQuotaResponse{BucketAction: actions})
	}
}

// untracked is the answer to a bucket past the caps: DENY_ALL if a rule
// limits it, so that the buckets of one stream cannot multiply its share,
// and ALLOW_ALL if none does.
func (s *Server) untracked(domain string, ids map[string]string) assignment {
	if r, _ := s.rules.MatchUnordered(domain, ids); r != nil && !r.Unlimited && len(r.Limits) > 0 {
		return assignment{kind: denyAll}
	}
	return assignment{kind: allowAll}
}

// track adds a new bucket to st, matched against the rules, with its first
// assignment (a hold for a limited bucket).
func (s *Server) track(st *Stream, key string, id *rlqspb.BucketId, now time.Duration) *bucket {
	b := &bucket{stream: st, key: key, id: id, created: now, lastUsed: now}
	st.buckets[key] = b
	s.perDomain[st.domain]++
	s.match(b)
	if b.pooled() {
		s.hold(b)
	}
	return b
}

// forget drops b from every pool and from the counts.
func (s *Server) forget(b *bucket) {
	s.detach(b)
	if s.perDomain[b.stream.domain]--; s.perDomain[b.stream.domain] <= 0 {
		delete(s.perDomain, b.stream.domain)
	}
}

// sendAction records that b's current assignment goes out now and returns
// the entry that says it (ALLOW_ALL for a shadow bucket).
func (s *Server) sendAction(b *bucket, now time.Duration) *rlqspb.RateLimitQuotaResponse_BucketAction {
	b.sentAt = now
	b.ttlEnd = now + s.opts.AssignmentTTL
	a := b.current
	if b.shadow {
		a = assignment{kind: allowAll}
	}
	return a.action(b.id, s.opts.AssignmentTTL)
}
