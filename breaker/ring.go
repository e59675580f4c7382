package breaker

import (
	"time"

	"github.com/leapgate/leapgate/window"
)

// ring is the statistics window of one breaker: k buckets of (failed, total)
// counts over the window length, in the LeapArray layout of package window
// (bucket i of epoch e covers [e·len, (e+1)·len), slot e mod k, reset in
// place when a newer epoch reaches it). It is guarded by its breaker's
// mutex; the admission counter of package window has a different job
// (check-and-add against a limit) so it is not reused here.
type ring struct {
	bucketLen int64
	buckets   []bucket
	newest    int64 // newest epoch seen: an earlier clock reading is clamped to it
}

type bucket struct {
	epoch  int64 // -1: never used
	failed uint64
	total  uint64
}

func newRing(spec window.Spec) ring {
	r := ring{bucketLen: int64(spec.BucketLength()), buckets: make([]bucket, spec.Buckets())}
	r.reset()
	return r
}

// reset forgets every observation.
func (r *ring) reset() {
	for i := range r.buckets {
		r.buckets[i] = bucket{epoch: -1}
	}
}

func (r *ring) epoch(now time.Duration) int64 {
	e := max(int64(now), 0) / r.bucketLen
	if e < r.newest {
		e = r.newest // clock stepped back: count into the newest bucket
	}
	r.newest = e
	return e
}

// add counts one observation at now.
func (r *ring) add(now time.Duration, failed bool) {
	e := r.epoch(now)
	b := &r.buckets[e%int64(len(r.buckets))]
	if b.epoch != e {
		*b = bucket{epoch: e}
	}
	b.total++
	if failed {
		b.failed++
	}
}

// sum returns the counts of the buckets inside the window ending at now.
func (r *ring) sum(now time.Duration) (failed, total uint64) {
	e := r.epoch(now)
	oldest := e - int64(len(r.buckets)) + 1
	for _, b := range r.buckets {
		if b.epoch >= oldest && b.epoch <= e {
			failed += b.failed
			total += b.total
		}
	}
	return failed, total
}
