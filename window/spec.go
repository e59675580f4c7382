package window

import (
	"fmt"
	"time"
)

// DefaultBuckets is the number of buckets per window of a TimeBuckets
// counter whose rule does not choose one.
const DefaultBuckets = 20

// Spec is a validated window layout: a window length split into equal buckets.
// The zero Spec is invalid; build one with NewSpec.
type Spec struct {
	length  int64 // window length in nanoseconds
	buckets int64 // buckets per window
}

// NewSpec returns the layout of a window of the given length split into
// buckets equal buckets. A length that the bucket count does not divide
// exactly (in nanoseconds) is an error, never a silent truncation.
func NewSpec(length time.Duration, buckets int) (Spec, error) {
	switch {
	case length <= 0:
		return Spec{}, fmt.Errorf("window length %v must be positive", length)
	case buckets < 1:
		return Spec{}, fmt.Errorf("bucket count %d must be at least 1", buckets)
	case int64(length)%int64(buckets) != 0:
		return Spec{}, fmt.Errorf("window length %v is not divisible into %d equal buckets", length, buckets)
	}
	return Spec{length: int64(length), buckets: int64(buckets)}, nil
}

// Length returns the window length.
func (s Spec) Length() time.Duration { return time.Duration(s.length) }

// Buckets returns the number of buckets per window.
func (s Spec) Buckets() int { return int(s.buckets) }

// BucketLength returns the length of one bucket.
func (s Spec) BucketLength() time.Duration { return time.Duration(s.length / s.buckets) }

// valid reports whether s was built by NewSpec (the zero Spec is not).
func (s Spec) valid() bool { return s.buckets >= 1 && s.length > 0 }
