package redisstore

import (
	"context"
	"fmt"

	"github.com/leapgate/leapgate/window"
)

// failed answers the requests reqs[send] by the failure mode after err.
func (s *Store) failed(ctx context.Context, reqs []window.Request, results []window.Result, send []int, err error) ([]window.Result, error) {
	s.metrics.fallbacks.WithLabelValues(s.mode.String()).Inc()
	switch s.mode {
	case FailAllow:
		// Nothing is counted; the quota left is unknown: report the limit.
		for _, i := range send {
			results[i] = window.Result{Allowed: true, Remaining: min(reqs[i].Limit, maxLimit)}
		}
		return results, nil
	case FailDeny:
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
	case FailLocal:
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
