package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/leapgate/leapgate/window"
)

// failed answers the requests reqs[send] by the failure mode after err.
func (s *Store) failed(ctx context.Context, reqs []window.Request, results []window.Result, send []int, err error) ([]window.Result, error) {
	s.metrics.fallbacks.WithLabelValues(s.mode.String()).Inc()
	switch s.mode {
	case FailAllow:
		// Nothing is counted; the quota left is unknown: report the limit.
		for _, i := range send {
			results[i] = window.Result{Allowed: true, Remaining: min(reqs[i].Limit, window.MaxLimit)}
		}
		return results, nil
	case FailDeny:
		// Refuse; ask the caller to retry after a bucket, when the health
		// check will long have noticed Redis's return. A refund is never
		// refused (it is not applied either; the quota left is unknown).
		for _, i := range send {
			if reqs[i].Negative {
				results[i] = window.Result{Allowed: true, Remaining: min(reqs[i].Limit, window.MaxLimit)}
				continue
			}
			results[i] = window.Result{Reset: reqs[i].Spec.BucketLength()}
		}
		return results, nil
	case FailLocal:
		// The whole batch goes to the local windows: they decide alone.
		local, lerr := s.fallback.Do(ctx, reqs)
		if lerr != nil {
			return nil, fmt.Errorf("redis: %w; local fallback: %w", err, lerr)
		}
		recorded := false
		for i := range local {
			if local[i].Recorded {
				local[i].Bucket = localBucket(local[i].Bucket)
				recorded = true
			}
		}
		if recorded {
			s.lastLocal.Store(max(int64(s.clock.Now()), 1)) // 0 is never
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

// withLocalHits returns the requests to send to Redis after an outage in
// local failure mode, while hits the local windows admitted may still be
// inside a request's window: Redis never saw them, so each such request
// goes to Redis with its limit lowered by the hits the local window still
// counts for its key, and no window admits more than the limit on this
// replica. (Each replica knows only its own local hits: replicas that were
// all in local mode may together have admitted more, as during the outage.)
// localReset[i] is the local window's reset for reqs[i], for an honest
// Retry-After. Without recent local hits, reqs itself is returned.
func (s *Store) withLocalHits(ctx context.Context, reqs []window.Request, send []int) (adjusted []window.Request, localReset []time.Duration, err error) {
	last := s.lastLocal.Load()
	if last == 0 || s.fallback == nil {
		return reqs, nil, nil
	}
	now := s.clock.Now()
	var checks []window.Request
	var idx []int
	for _, i := range send {
		r := &reqs[i]
		if r.Negative || now-time.Duration(last) >= r.Spec.Length() {
			continue
		}
		checks = append(checks, window.Request{Key: r.Key, Spec: r.Spec, Limit: r.Limit, Algorithm: r.Algorithm})
		idx = append(idx, i)
	}
	if len(checks) == 0 {
		return reqs, nil, nil
	}
	counted, err := s.fallback.Do(ctx, checks)
	if err != nil {
		return nil, nil, fmt.Errorf("local windows after an outage: %w", err)
	}
	adjusted = make([]window.Request, len(reqs))
	copy(adjusted, reqs)
	localReset = make([]time.Duration, len(reqs))
	for j, i := range idx {
		limit := min(reqs[i].Limit, window.MaxLimit)
		used := limit - min(counted[j].Remaining, limit)
		adjusted[i].Limit = limit - used
		localReset[i] = counted[j].Reset
	}
	return adjusted, localReset, nil
}
