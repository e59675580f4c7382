// Package redisstore keeps rate-limit counters in Redis, so that any number
// of replicas enforce one limit together. Store implements window.Limiter
// with the answers of the in-memory window.Store, for every
// window.Algorithm, for refunds (Request.Negative) and for always-charged
// hits (Request.ChargeAlways, sliding and fixed windows): in any window of
// length W at most Limit hits are admitted across all replicas (sliding
// window), and a refused request consumes no quota.
//
// Each counter is one Redis key whose hash tag is the whole Request.Key
// (CACHE_KEY_PREFIX + "{" + Request.Key + "}"), followed by its algorithm's
// window.AlgorithmInfo.KeySuffix. Each algorithm keeps its layout in its own
// script, lua/<name>.lua (docs/redis.md lists them all); lua/batch.lua
// reads, checks and updates every counter of a batch at once, whatever
// their algorithms, and takes hits back for Undo. Every write re-arms the
// key's TTL, so idle counters vanish.
//
// A batch costs one round trip: one script call (an FCALL of the function
// library on Redis 7, else an EVALSHA) on a single node or Sentinel master;
// on Cluster, one per hash slot, all in one pipeline. The
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
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/leapgate/leapgate/window"
)

// DefaultHealthInterval is how often the health check PINGs Redis.
const DefaultHealthInterval = time.Second

// ErrUnavailable is returned (wrapped) by Do in failure mode "error" while
// the health check finds Redis unreachable, without trying Redis.
var ErrUnavailable = errors.New("redis is unavailable")

// health states of Redis as seen by the health check.
const (
	stateUnknown int32 = iota // not probed yet: try Redis
	stateUp
	stateDown // fail fast until a PING succeeds
)

// Store is a window.Limiter backed by Redis. It is safe for concurrent use.
// Close it to stop its health check and close its connections.
type Store struct {
	tracer   trace.Tracer // nil unless Options.TracerProvider
	client   redis.UniversalClient
	cluster  bool
	prefix   string
	mode     FailureMode
	fallback window.Limiter
	cache    *overLimitCache
	clock    window.Clock
	log      *slog.Logger
	metrics  *metrics
	interval time.Duration
	timeout  time.Duration
	pipe     *pipeliner
	frames   sync.Pool // of *frame, for runAllow
	res      *reserver // nil unless Options.Reservation

	state atomic.Int32
	// lastLocal is when the local fallback last recorded hits (s.clock,
	// ns; 0 never): until a window has passed, Redis's answers also
	// count them (withLocalHits).
	lastLocal atomic.Int64
	// nudge asks the health check to probe now (a request failed).
	nudge chan struct{}
	// nowMicros, when set (tests only), replaces Redis's TIME.
	nowMicros func() int64

	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

var (
	_ window.Limiter        = (*Store)(nil)
	_ window.RequestChecker = (*Store)(nil)
)

// CheckRequest returns the package's CheckRequest(req): nil if Do serves
// req (see window.RequestChecker).
func (s *Store) CheckRequest(req *window.Request) error { return CheckRequest(req) }

// New returns a Store for opts. It does not wait for Redis: it starts a
// health check that runs until ctx is done or Close is called, logs whether
// Redis answers, and reports Healthy once a PING succeeds. It fails only for
// invalid options (or metrics already registered).
func New(ctx context.Context, opts Options) (*Store, error) {
	client, cluster, err := newClient(opts)
	if err != nil {
		return nil, err
	}
	s, err := newStore(ctx, client, cluster, opts)
	if err != nil {
		client.Close()
		return nil, err
	}
	return s, nil
}

func newStore(ctx context.Context, client redis.UniversalClient, cluster bool, opts Options) (*Store, error) {
	if opts.FailureMode == FailLocal && opts.Fallback == nil {
		return nil, errors.New("redisstore: failure mode local needs Options.Fallback")
	}
	m, err := newMetrics(opts.Registry)
	if err != nil {
		return nil, fmt.Errorf("redis metrics: %w", err)
	}
	// Every series an alert or dashboard reads exists from the start, at 0.
	// (newMetrics creates the latency and error series of every op.)
	m.fallbacks.WithLabelValues(opts.FailureMode.String())
	var tracer trace.Tracer
	if opts.TracerProvider != nil {
		tracer = opts.TracerProvider.Tracer("github.com/leapgate/leapgate/redisstore")
	}
	s := &Store{
		tracer:   tracer,
		client:   client,
		cluster:  cluster,
		prefix:   opts.KeyPrefix,
		mode:     opts.FailureMode,
		fallback: opts.Fallback,
		clock:    opts.Clock,
		log:      opts.Logger,
		metrics:  m,
		interval: opts.HealthInterval,
		timeout:  opts.timeout(),
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
	if opts.LocalCacheBytes > 0 {
		s.cache = newOverLimitCache(opts.LocalCacheBytes)
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.pipe = newPipeliner(ctx, client, min(pipelineWorkers, opts.poolSize()), s.timeout, m.batch)
	s.frames.New = newFrame
	if s.res = newReserver(s, opts.Reservation, opts.ReservationKeys); s.res != nil {
		go s.res.run(ctx)
	}
	go s.healthLoop(ctx)
	s.log.Info("redis backend configured (not waiting for it)", "topology", opts.Topology, "addrs", opts.Addrs,
		"tls", opts.TLS != nil, "key_prefix", opts.KeyPrefix, "failure_mode", opts.FailureMode, "local_cache_bytes", opts.LocalCacheBytes,
		"reservation", opts.Reservation)
	return s, nil
}

// Close gives back the blocks of quota this replica holds (bounded by
// Options.Timeout), stops the health check and closes the connections to
// Redis.
func (s *Store) Close() error {
	var err error
	s.once.Do(func() {
		if s.res != nil && s.state.Load() != stateDown {
			s.res.close(context.Background())
		}
		s.cancel()
		// Closing the connections also ends a probe waiting on a
		// stalled Redis, which go-redis does not end on cancel.
		err = s.client.Close()
		<-s.done
	})
	return err
}

// Do answers reqs with the window.Limiter contract, in one round trip to
// Redis (none when the local over-limit cache answers every request; two
// for a Cluster batch over several slots in which a Veto refuses, or which
// holds both a Veto request and a refund), shared with the calls of
// concurrent Do and Undo calls (see pipeliner). Options.Timeout bounds the
// whole call. Redis's clock decides the window; the replica's clock does
// not matter.
func (s *Store) Do(ctx context.Context, reqs []window.Request) ([]window.Result, error) {
	results := make([]window.Result, len(reqs))
	if len(reqs) == 0 {
		return results, nil
	}
	for i := range reqs {
		if err := CheckRequest(&reqs[i]); err != nil {
			return nil, fmt.Errorf("request %d (key %q): %w", i, reqs[i].Key, err)
		}
	}

	var now time.Duration
	var keys []string
	if s.res != nil {
		// A block of quota this replica holds answers without Redis.
		now = s.clock.Now()
		keys = make([]string, len(reqs))
		for i := range reqs {
			keys[i] = s.counterKey(&reqs[i])
		}
		if s.res.take(reqs, keys, now, results) {
			s.metrics.blockAnswers.Add(float64(len(reqs)))
			return results, nil
		}
	}

	// The local cache answers keys known to be over their limit.
	send := make([]int, 0, len(reqs))
	dry := false
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
			if r.ChargeAlways && r.Hits > 0 || r.Algorithm == window.Concurrency {
				// Recorded even when over, or freed by a refund any replica
				// may receive: only Redis knows.
				send = append(send, i)
				continue
			}
			if rem, reset, ok := s.cache.get(r.Key, now, min(r.Limit, window.MaxLimit), need(r.Hits)); ok {
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
		// Timeout bounds the whole call, every round trip and the wait
		// for a connection included: the pipeliner answers by the
		// deadline (without a timer per call).
		rctx := withDeadline(ctx, time.Now().Add(s.timeout))
		sent, localReset, lerr := s.withLocalHits(rctx, reqs, send)
		err = lerr
		if err == nil {
			err = s.allow(rctx, sent, results, keys, send, dry)
		}
		if err == nil && localReset != nil {
			for _, i := range send {
				if r := &results[i]; !r.Allowed {
					r.Reset = max(r.Reset, localReset[i])
				}
			}
		}
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

	if s.res != nil {
		s.res.sawRemote(reqs, results, keys, send, now)
	}
	if s.cache != nil {
		for _, i := range send {
			if r := &results[i]; !r.Allowed && !reqs[i].Negative && reqs[i].Algorithm != window.Concurrency {
				q := &reqs[i]
				s.cache.put(q.Key, now, r.Reset, min(q.Limit, window.MaxLimit), need(q.Hits), r.Remaining)
			}
		}
	}
	return results, nil
}

// deadlineCtx is a context with a deadline that no timer enforces, unlike
// context.WithDeadline's: Deadline reports it (or the parent's, if
// earlier), while Done and Err are the parent's. Everything Do waits on
// under it is bounded by Deadline: the pipeliner answers every job by its
// deadline (see pipeliner.do), and go-redis sets socket deadlines from it.
// It spares a timer and a cancellable context per call.
type deadlineCtx struct {
	context.Context
	deadline time.Time
}

// withDeadline returns ctx with deadline d (see deadlineCtx).
func withDeadline(ctx context.Context, d time.Time) context.Context {
	return deadlineCtx{Context: ctx, deadline: d}
}

// Deadline returns the earlier of the parent's deadline and the context's.
func (c deadlineCtx) Deadline() (time.Time, bool) {
	if d, ok := c.Context.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

// need is the quota a request needs: its hits, or one for check-only.
func need(hits uint64) uint64 { return max(hits, 1) }

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
		case !r.Recorded || reqs[i].Hits == 0 || reqs[i].Negative || CheckRequest(&reqs[i]) != nil:
		case s.res != nil && isBlockBucket(r.Bucket) && reqs[i].Algorithm == window.SlidingWindow:
			s.res.undo(s.counterKey(&reqs[i]), &reqs[i], &r)
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
		rctx, cancel := context.WithTimeout(ctx, s.timeout)
		err := s.undo(rctx, reqs, results, remote)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				s.suspect(err)
			}
			errs = append(errs, fmt.Errorf("redis: %w", err))
		}
	}
	return errors.Join(errs...)
}
