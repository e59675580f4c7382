// Package redisstore keeps rate-limit counters in Redis, so that any number
// of replicas enforce one limit together. Store implements window.Limiter
// with the answers of the in-memory window.Store, for every
// window.Algorithm and for refunds (Request.Negative): in any window of
// length W at most Limit hits are admitted across all replicas (sliding
// window), and a refused request consumes no quota.
//
// Each counter is one Redis key whose hash tag is the whole Request.Key
// (CACHE_KEY_PREFIX + "{" + Request.Key + "}"), plus ":sw" for the default
// sliding window, ":tb" for a token bucket, ":fw" for a fixed window and
// ":log" for a sliding log (time buckets keep the bare key). The sliding
// window is window.Counter as one string of at most 20 + 2*window.Blocks
// bytes (checkpoint.lua), read and written whole, whatever the limit; the
// others are hashes: a token bucket's fields are "tat" (GCRA's theoretical
// arrival time) and "seen" (the newest time written), in nanoseconds; a
// fixed window's one field is the window number, whose value is its count;
// a sliding log's fields are admission times (microseconds) valued with the
// hits admitted then, and "seen"; time buckets' fields are bucket epochs
// (floor(now / bucket length), now being Redis's TIME in microseconds)
// valued with the hits recorded in the bucket. One Lua script (allow.lua)
// reads, checks and updates every counter of a batch at once, whatever
// their algorithms; every write re-arms the key's TTL, so idle counters
// vanish.
//
// A batch costs one round trip: one EVALSHA on a single node or Sentinel
// master; on Cluster, one EVALSHA per hash slot, all in one pipeline. The
// all-or-nothing Veto rule is atomic within a slot; across slots, a refused
// Veto makes the Store take back (Undo, a second round trip, only then) the
// hits the other slots recorded, which concurrent requests may briefly see.
// A Cluster batch over several slots holding both a Veto request and a
// refund sends its refunds in a second round trip, once no Veto refused.
//
// When Redis fails, REDIS_FAILURE_MODE decides: error (Do returns the error;
// Envoy's failure_mode_deny decides), allow, deny, or local (a per-replica
// in-memory Limiter answers until Redis is back). A background health check
// PINGs Redis; while it fails, requests take the failure mode at once
// instead of waiting for a timeout each.
package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/window"
)

//go:embed common.lua
var commonLua string

//go:embed allow.lua
var allowLua string

//go:embed undo.lua
var undoLua string

//go:embed checkpoint.lua
var checkpointLua string

// The scripts share common.lua's helpers and checkpoint.lua's counter,
// prepended to each with the Counter's block count and exact-log limit.
var (
	prelude     = fmt.Sprintf("local BLOCKS, EXACT = %d, %d\n", window.Blocks, window.ExactLimit) + commonLua + checkpointLua
	allowScript = redis.NewScript(prelude + allowLua)
	undoScript  = redis.NewScript(prelude + undoLua)
)

// maxLimit is the largest limit enforced, as in window.Counter (Envoy's
// requests_per_unit is a uint32); larger limits are clamped to it.
const maxLimit = math.MaxUint32

// DefaultHealthInterval is how often the health check PINGs Redis.
const DefaultHealthInterval = time.Second

// ErrUnavailable is returned (wrapped) by Do in failure mode "error" while
// the health check finds Redis unreachable, without trying Redis.
var ErrUnavailable = errors.New("redis is unavailable")

// Options are the collaborators of a Store. All are optional except
// Fallback with REDIS_FAILURE_MODE=local.
type Options struct {
	// Logger receives health transitions and errors (default: discard).
	Logger *slog.Logger
	// Registry receives the Store's metrics (default: not registered).
	Registry prometheus.Registerer
	// Fallback answers while Redis is down in failure mode local: the
	// replica's in-memory window.Store.
	Fallback window.Limiter
	// Clock is the local clock of the over-limit cache (default: a
	// MonotonicClock). Admission never reads it: Redis's time decides.
	Clock window.Clock
	// HealthInterval is the period of the health check (default
	// DefaultHealthInterval).
	HealthInterval time.Duration
}

// health states of Redis as seen by the health check.
const (
	stateUnknown int32 = iota // not probed yet: try Redis
	stateUp
	stateDown // fail fast until a PING succeeds
)

// Store is a window.Limiter backed by Redis. It is safe for concurrent use.
// Close it to stop its health check and close its connections.
type Store struct {
	client   redis.UniversalClient
	cluster  bool
	prefix   string
	mode     string
	fallback window.Limiter
	cache    *overLimitCache
	clock    window.Clock
	log      *slog.Logger
	metrics  *metrics
	interval time.Duration
	timeout  time.Duration

	state atomic.Int32
	// nudge asks the health check to probe now (a request failed).
	nudge chan struct{}
	// nowMicros, when set (tests only), replaces Redis's TIME.
	nowMicros func() int64

	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

var (
	_ window.Limiter          = (*Store)(nil)
	_ window.AlgorithmChecker = (*Store)(nil)
)

// SupportsAlgorithm reports whether the Store serves a: every Algorithm of
// package window (SlidingWindow, TokenBucket, FixedWindow, SlidingLog).
func (s *Store) SupportsAlgorithm(a window.Algorithm) bool { return a <= window.TimeBuckets }

// New returns a Store for the settings. It does not wait for Redis: it
// starts a health check that runs until ctx is done or Close is called,
// logs whether Redis answers, and reports Healthy once a PING succeeds.
// It fails only for invalid settings (or metrics already registered).
func New(ctx context.Context, settings config.Redis, opts Options) (*Store, error) {
	client, cluster, err := newClient(settings)
	if err != nil {
		return nil, err
	}
	s, err := newStore(ctx, client, cluster, settings, opts)
	if err != nil {
		client.Close()
		return nil, err
	}
	return s, nil
}

func newStore(ctx context.Context, client redis.UniversalClient, cluster bool, settings config.Redis, opts Options) (*Store, error) {
	mode := strings.ToLower(settings.FailureMode)
	if mode == "" {
		mode = config.RedisFailError
	}
	if mode == config.RedisFailLocal && opts.Fallback == nil {
		return nil, errors.New("REDIS_FAILURE_MODE=local needs a fallback Limiter")
	}
	m, err := newMetrics(opts.Registry)
	if err != nil {
		return nil, fmt.Errorf("redis metrics: %w", err)
	}
	s := &Store{
		client:   client,
		cluster:  cluster,
		prefix:   settings.CacheKeyPrefix,
		mode:     mode,
		fallback: opts.Fallback,
		clock:    opts.Clock,
		log:      opts.Logger,
		metrics:  m,
		interval: opts.HealthInterval,
		timeout:  settings.Timeout,
		done:     make(chan struct{}),
		nudge:    make(chan struct{}, 1),
	}
	if s.clock == nil {
		s.clock = window.NewMonotonicClock()
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.interval <= 0 {
		s.interval = DefaultHealthInterval
	}
	if s.timeout <= 0 {
		s.timeout = 100 * time.Millisecond
	}
	if settings.LocalCacheSizeInBytes > 0 {
		s.cache = newOverLimitCache(settings.LocalCacheSizeInBytes)
	}
	ctx, s.cancel = context.WithCancel(ctx)
	go s.healthLoop(ctx)
	s.log.Info("redis backend configured (not waiting for it)", "settings", settings)
	return s, nil
}

// Healthy reports whether the last health check of Redis succeeded. It is
// false until the first PING answers.
func (s *Store) Healthy() bool { return s.state.Load() == stateUp }

// Close stops the health check and closes the connections to Redis.
func (s *Store) Close() error {
	var err error
	s.once.Do(func() {
		s.cancel()
		<-s.done
		err = s.client.Close()
	})
	return err
}

// healthLoop PINGs Redis every interval (every master on Cluster) until ctx
// is done, logging every change of reachability.
func (s *Store) healthLoop(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.probe(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.nudge:
		}
	}
}

func (s *Store) probe(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	start := time.Now()
	var err error
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Ping(ctx).Err()
		})
	} else {
		err = s.client.Ping(ctx).Err()
	}
	s.metrics.latency.WithLabelValues("ping").Observe(time.Since(start).Seconds())
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return // shutting down
	}
	if err != nil {
		s.metrics.errors.WithLabelValues("ping").Inc()
		s.metrics.up.Set(0)
		if old := s.state.Swap(stateDown); old != stateDown {
			s.log.Warn("redis unreachable: answering with REDIS_FAILURE_MODE until it is back",
				"mode", s.mode, "err", err)
		}
		return
	}
	if s.state.Load() != stateUp {
		// Load the scripts now so that the first requests need no second
		// round trip for NOSCRIPT (they would still work without).
		s.loadScripts(ctx)
	}
	s.metrics.up.Set(1)
	if old := s.state.Swap(stateUp); old != stateUp {
		s.log.Info("redis reachable")
	}
}

// loadScripts loads the scripts on Redis (every master on Cluster).
func (s *Store) loadScripts(ctx context.Context) {
	load := func(ctx context.Context, c redis.Scripter) error {
		return errors.Join(allowScript.Load(ctx, c).Err(), undoScript.Load(ctx, c).Err())
	}
	var err error
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return load(ctx, c) })
	} else {
		err = load(ctx, s.client)
	}
	if err != nil {
		s.log.Warn("loading the redis scripts failed (they will be sent on first use)", "err", err)
	}
}

// suspect reacts to a failed request: unless Redis answered (a command
// error, not an outage), the health check probes at once. If the probe
// fails too, requests take the failure mode without trying Redis until a
// probe succeeds; one slow call alone does not switch them over.
func (s *Store) suspect(err error) {
	var reply redis.Error
	if errors.As(err, &reply) {
		return // Redis answered: it is up, the command failed
	}
	select {
	case s.nudge <- struct{}{}:
	default: // a probe is already due
	}
}

// Do answers reqs with the window.Limiter contract, in one round trip to
// Redis (none when the local over-limit cache answers every request; two
// for a Cluster batch over several slots in which a Veto refuses, or which
// holds both a Veto request and a refund). Redis's clock decides the
// window; the replica's clock does not matter.
func (s *Store) Do(ctx context.Context, reqs []window.Request) ([]window.Result, error) {
	results := make([]window.Result, len(reqs))
	if len(reqs) == 0 {
		return results, nil
	}
	for i := range reqs {
		if err := checkSpec(reqs[i].Spec); err != nil {
			return nil, fmt.Errorf("request %d (key %q): %w", i, reqs[i].Key, err)
		}
		if !s.SupportsAlgorithm(reqs[i].Algorithm) {
			return nil, fmt.Errorf("request %d (key %q): %v is not supported by the Redis backend", i, reqs[i].Key, reqs[i].Algorithm)
		}
		if reqs[i].Algorithm == window.SlidingLog && reqs[i].Limit > window.MaxLogLimit {
			return nil, fmt.Errorf("request %d (key %q): limit %d: %w", i, reqs[i].Key, reqs[i].Limit, window.ErrLogLimit)
		}
	}

	// The local cache answers keys known to be over their limit.
	send := make([]int, 0, len(reqs))
	dry := false
	var now time.Duration
	if s.cache != nil {
		now = s.clock.Now()
		for i := range reqs {
			r := &reqs[i]
			if r.Negative {
				// A refund is never refused, and frees quota the cache
				// may have seen exhausted.
				s.cache.forget(r.Key)
				send = append(send, i)
				continue
			}
			if rem, reset, ok := s.cache.get(r.Key, now, min(r.Limit, maxLimit), need(r.Hits)); ok {
				s.metrics.cacheHits.Inc()
				results[i] = window.Result{Remaining: rem, Reset: reset}
				if r.Veto {
					dry = true // the batch records nothing
				}
				continue
			}
			send = append(send, i)
		}
		if len(send) == 0 {
			return results, nil
		}
	} else {
		for i := range reqs {
			send = append(send, i)
		}
	}

	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var err error
	if s.state.Load() == stateDown {
		err = ErrUnavailable
	} else {
		err = s.allow(ctx, reqs, results, send, dry)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("redis: %w", err) // the caller gave up, Redis did not fail
			}
			s.suspect(err)
		}
	}
	if err != nil {
		return s.failed(ctx, reqs, results, send, err)
	}

	if s.cache != nil {
		for _, i := range send {
			if r := &results[i]; !r.Allowed && !reqs[i].Negative {
				q := &reqs[i]
				s.cache.put(q.Key, now, r.Reset, min(q.Limit, maxLimit), need(q.Hits), r.Remaining)
			}
		}
	}
	return results, nil
}

// failed answers the requests reqs[send] by the failure mode after err.
func (s *Store) failed(ctx context.Context, reqs []window.Request, results []window.Result, send []int, err error) ([]window.Result, error) {
	s.metrics.fallbacks.WithLabelValues(s.mode).Inc()
	switch s.mode {
	case config.RedisFailAllow:
		// Nothing is counted; the quota left is unknown: report the limit.
		for _, i := range send {
			results[i] = window.Result{Allowed: true, Remaining: min(reqs[i].Limit, maxLimit)}
		}
		return results, nil
	case config.RedisFailDeny:
		// Refuse; ask the caller to retry after a bucket, when the health
		// check will long have noticed Redis's return. A refund is never
		// refused (it is not applied either; the quota left is unknown).
		for _, i := range send {
			if reqs[i].Negative {
				results[i] = window.Result{Allowed: true, Remaining: min(reqs[i].Limit, maxLimit)}
				continue
			}
			results[i] = window.Result{Reset: reqs[i].Spec.BucketLength()}
		}
		return results, nil
	case config.RedisFailLocal:
		// The whole batch goes to the local windows: they decide alone.
		local, lerr := s.fallback.Do(ctx, reqs)
		if lerr != nil {
			return nil, fmt.Errorf("redis: %w; local fallback: %w", err, lerr)
		}
		for i := range local {
			if local[i].Recorded {
				local[i].Bucket = localBucket(local[i].Bucket)
			}
		}
		return local, nil
	default:
		return nil, fmt.Errorf("redis: %w", err)
	}
}

// localBucket marks a bucket of the fallback Limiter, for Undo: Redis's
// buckets are never negative, the marked ones always are (and marking
// twice gives the original back).
func localBucket(b int64) int64 { return -1 - b }

// need is the quota a request needs: its hits, or one for check-only.
func need(hits uint64) uint64 { return max(hits, 1) }

// checkSpec rejects the zero Spec and bucket lengths the script cannot
// represent (it works in whole microseconds).
func checkSpec(sp window.Spec) error {
	if sp.Buckets() < 1 || sp.Length() <= 0 {
		return errors.New("invalid Spec (build it with window.NewSpec)")
	}
	if sp.BucketLength()%time.Microsecond != 0 {
		return fmt.Errorf("bucket length %v is not a whole number of microseconds (needed by the Redis backend)", sp.BucketLength())
	}
	return nil
}

// redisKey returns the Redis key of a sliding-window counter: its hash tag
// is the whole Request.Key, so the slot depends on the key alone.
func (s *Store) redisKey(key string) string {
	return s.prefix + "{" + key + "}"
}

// counterKey returns the Redis key of req's counter: redisKey, with a
// suffix naming the algorithm for the sliding window (":sw"), the token
// bucket (":tb"), the fixed window (":fw") and the sliding log (":log"), so
// that a key never meets a layout it was not written with (time buckets
// keep the bare key, which earlier versions used for their sliding
// window's hash). The hash tag, hence the slot, is the
// same for every algorithm.
func (s *Store) counterKey(req *window.Request) string {
	switch req.Algorithm {
	case window.SlidingWindow:
		return s.redisKey(req.Key) + ":sw"
	case window.TokenBucket:
		return s.redisKey(req.Key) + ":tb"
	case window.FixedWindow:
		return s.redisKey(req.Key) + ":fw"
	case window.SlidingLog:
		return s.redisKey(req.Key) + ":log"
	}
	return s.redisKey(req.Key)
}

// timeBucket converts the Result.Bucket of a sliding window or a sliding
// log (a time in ns, as in window.Counter and window.LogCounter) to and from
// the script's microseconds.
const timeBucket = int64(time.Microsecond)

// bucketIsTime reports whether a's Result.Bucket is a time (see timeBucket).
func bucketIsTime(a window.Algorithm) bool {
	return a == window.SlidingWindow || a == window.SlidingLog
}

// flag renders a bool as a script argument.
func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// nowArg is the script's time argument: "" (Redis's TIME) unless a test
// injected a time.
func (s *Store) nowArg() string {
	if s.nowMicros != nil {
		return strconv.FormatInt(s.nowMicros(), 10)
	}
	return ""
}

// group is the requests of one script call (one hash slot on Cluster).
type group struct {
	slot uint16
	idx  []int // indexes into reqs
}

// groups splits idx by hash slot on Cluster; elsewhere it is one group.
func (s *Store) groups(keys []string, idx []int) []group {
	if !s.cluster {
		return []group{{idx: idx}}
	}
	var gs []group
next:
	for _, i := range idx {
		slot := keySlot(keys[i])
		for g := range gs {
			if gs[g].slot == slot {
				gs[g].idx = append(gs[g].idx, i)
				continue next
			}
		}
		gs = append(gs, group{slot: slot, idx: []int{i}})
	}
	return gs
}

// allow runs the admission script for reqs[send], writing results, in one
// round trip. The one exception is a Cluster batch spanning several slots
// with both a Veto request and a refund: refunds must not apply if a Veto
// in another slot refuses, so they are checked in the first round trip and
// applied in a second one only if nothing was vetoed.
func (s *Store) allow(ctx context.Context, reqs []window.Request, results []window.Result, send []int, dry bool) error {
	keys := make([]string, len(reqs))
	for _, i := range send {
		keys[i] = s.counterKey(&reqs[i])
	}
	gs := s.groups(keys, send)
	var refunds []int
	if len(gs) > 1 && !dry {
		veto := false
		for _, i := range send {
			veto = veto || reqs[i].Veto && !reqs[i].Negative
			if reqs[i].Negative {
				refunds = append(refunds, i)
			}
		}
		if !veto {
			refunds = nil
		}
	}
	first := reqs
	if len(refunds) > 0 {
		// Phase one: every refund is a check.
		first = make([]window.Request, len(reqs))
		copy(first, reqs)
		for _, i := range refunds {
			first[i].Negative, first[i].Hits, first[i].Veto = false, 0, false
		}
	}
	vetoed, err := s.runAllow(ctx, first, results, keys, gs, dry)
	if err != nil {
		return err
	}
	if vetoed && len(gs) > 1 {
		return s.takeBack(ctx, reqs, results, send)
	}
	if len(refunds) > 0 {
		_, err = s.runAllow(ctx, reqs, results, keys, s.groups(keys, refunds), false)
	}
	return err
}

// runAllow sends one allow script call per group (one pipeline), writes
// the results and reports whether a Veto request was refused.
func (s *Store) runAllow(ctx context.Context, reqs []window.Request, results []window.Result, keys []string, gs []group, dry bool) (bool, error) {
	now := s.nowArg()
	calls := make([]call, len(gs))
	for g, gr := range gs {
		c := &calls[g]
		c.keys = make([]string, len(gr.idx))
		c.args = make([]any, 2, 2+7*len(gr.idx))
		c.args[0], c.args[1] = flag(dry), now
		for j, i := range gr.idx {
			r := &reqs[i]
			c.keys[j] = keys[i]
			c.args = append(c.args,
				int64(r.Spec.BucketLength()/time.Microsecond),
				r.Spec.Buckets(),
				min(r.Limit, maxLimit),
				min(r.Hits, maxLimit+1), // beyond the limit either way
				flag(r.Veto),
				int(r.Algorithm),
				flag(r.Negative))
		}
	}
	if err := s.run(ctx, "do", allowScript, calls); err != nil {
		return false, err
	}

	vetoed := false
	for g, gr := range gs {
		vals, err := calls[g].cmd.Int64Slice()
		if err != nil || len(vals) != 5*len(gr.idx) {
			return false, fmt.Errorf("unexpected script reply %v: %w", calls[g].cmd.Val(), err)
		}
		for j, i := range gr.idx {
			v := vals[5*j : 5*j+5]
			results[i] = window.Result{
				Allowed:   v[0] == 1,
				Recorded:  v[1] == 1,
				Remaining: uint64(v[2]),
				Reset:     time.Duration(v[3]), // ns
				Bucket:    v[4],
			}
			if bucketIsTime(reqs[i].Algorithm) {
				results[i].Bucket *= timeBucket
			}
			if reqs[i].Veto && !reqs[i].Negative && !results[i].Allowed {
				vetoed = true
			}
		}
	}
	return vetoed, nil
}

// takeBack undoes the hits that slots other than a refusing Veto's recorded
// (Cluster only: a script cannot span slots).
func (s *Store) takeBack(ctx context.Context, reqs []window.Request, results []window.Result, send []int) error {
	var undo []int
	for _, i := range send {
		if results[i].Recorded {
			undo = append(undo, i)
		}
	}
	if len(undo) == 0 {
		return nil
	}
	if err := s.undo(ctx, reqs, results, undo); err != nil {
		return fmt.Errorf("taking back hits of a vetoed batch: %w", err)
	}
	for _, i := range undo {
		r := &results[i]
		r.Recorded = false
		r.Remaining = min(r.Remaining+reqs[i].Hits, min(reqs[i].Limit, maxLimit))
	}
	return nil
}

// Undo takes back the hits of results[i] with Recorded set, as recorded
// for reqs[i] by an earlier Do, in one round trip. Hits recorded by the
// local fallback go back to it.
func (s *Store) Undo(ctx context.Context, reqs []window.Request, results []window.Result) error {
	if len(results) < len(reqs) {
		return fmt.Errorf("redis: %d results for %d requests", len(results), len(reqs))
	}
	var remote []int
	var localReqs []window.Request
	var localRes []window.Result
	for i := range reqs {
		r := results[i]
		switch {
		case !r.Recorded || reqs[i].Hits == 0 || reqs[i].Negative || checkSpec(reqs[i].Spec) != nil:
		case r.Bucket < 0:
			r.Bucket = localBucket(r.Bucket)
			localReqs = append(localReqs, reqs[i])
			localRes = append(localRes, r)
		default:
			remote = append(remote, i)
		}
	}
	var errs []error
	if len(localReqs) > 0 && s.fallback != nil {
		if err := s.fallback.Undo(ctx, localReqs, localRes); err != nil {
			errs = append(errs, fmt.Errorf("local fallback: %w", err))
		}
	}
	if len(remote) > 0 && s.state.Load() == stateDown {
		errs = append(errs, fmt.Errorf("redis: %w", ErrUnavailable))
	} else if len(remote) > 0 {
		if err := s.undo(ctx, reqs, results, remote); err != nil {
			if ctx.Err() == nil {
				s.suspect(err)
			}
			errs = append(errs, fmt.Errorf("redis: %w", err))
		}
	}
	return errors.Join(errs...)
}

// undo runs the undo script for reqs[idx].
func (s *Store) undo(ctx context.Context, reqs []window.Request, results []window.Result, idx []int) error {
	keys := make([]string, len(reqs))
	for _, i := range idx {
		keys[i] = s.counterKey(&reqs[i])
	}
	gs := s.groups(keys, idx)
	now := s.nowArg()
	calls := make([]call, len(gs))
	for g, gr := range gs {
		c := &calls[g]
		c.keys = make([]string, len(gr.idx))
		c.args = make([]any, 1, 1+6*len(gr.idx))
		c.args[0] = now
		for j, i := range gr.idx {
			r := &reqs[i]
			c.keys[j] = keys[i]
			bucket := results[i].Bucket
			if bucketIsTime(r.Algorithm) {
				bucket /= timeBucket
			}
			c.args = append(c.args, int(r.Algorithm), bucket, min(r.Hits, maxLimit),
				min(r.Limit, maxLimit), int64(r.Spec.BucketLength()/time.Microsecond), r.Spec.Buckets())
		}
	}
	return s.run(ctx, "undo", undoScript, calls)
}

// call is one script invocation.
type call struct {
	keys []string
	args []any
	cmd  *redis.Cmd
}

// run sends calls in one round trip: one EVALSHA, or a pipeline of them.
// Scripts missing from Redis's cache (NOSCRIPT: restarted or SCRIPT FLUSH)
// are sent again with EVAL; no script ran in that case, so this is safe.
func (s *Store) run(ctx context.Context, op string, script *redis.Script, calls []call) error {
	start := time.Now()
	err := s.send(ctx, script, calls)
	s.metrics.latency.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err != nil {
		s.metrics.errors.WithLabelValues(op).Inc()
	}
	return err
}

func (s *Store) send(ctx context.Context, script *redis.Script, calls []call) error {
	if len(calls) == 1 {
		c := &calls[0]
		c.cmd = script.Run(ctx, s.client, c.keys, c.args...)
		return c.cmd.Err()
	}
	pipe := s.client.Pipeline()
	for i := range calls {
		calls[i].cmd = script.EvalSha(ctx, pipe, calls[i].keys, calls[i].args...)
	}
	_, _ = pipe.Exec(ctx)
	var retry []int
	for i := range calls {
		if err := calls[i].cmd.Err(); err != nil {
			if !redis.HasErrorPrefix(err, "NOSCRIPT") {
				return err
			}
			retry = append(retry, i)
		}
	}
	if len(retry) == 0 {
		return nil
	}
	pipe = s.client.Pipeline()
	for _, i := range retry {
		calls[i].cmd = script.Eval(ctx, pipe, calls[i].keys, calls[i].args...)
	}
	_, _ = pipe.Exec(ctx)
	for _, i := range retry {
		if err := calls[i].cmd.Err(); err != nil {
			return err
		}
	}
	return nil
}
