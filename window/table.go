package window

import "fmt"

// AlgorithmInfo is everything the layers above window know of an
// Algorithm: rule parsing, the Redis backend's keys and scripts, the
// conformance and parity tests and the docs read it from Algorithm.Info,
// so that an algorithm is described in one place (the table below).
type AlgorithmInfo struct {
	// Name is the algorithm's name in rule files, errors and metrics.
	Name string
	// KeySuffix ends the Redis key of the algorithm's counters, so that a
	// key never meets a layout it was not written with. It is persisted
	// state: changing it resets every counter of the algorithm on deploy.
	// (Time buckets keep the bare key, which earlier versions used.)
	KeySuffix string
	// InRules reports whether rule files name it as a rate_limit
	// algorithm (ParseAlgorithm accepts it).
	InRules bool
	// ChargeAlways reports whether it serves Request.ChargeAlways: whether
	// its counts can exceed the limit.
	ChargeAlways bool
	// Bucketed reports whether it reads Spec.Buckets(); the others are
	// given Specs of one bucket.
	Bucketed bool
	// Holders reports whether it reads Request.Holder.
	Holders bool
	// BucketIsTime reports whether Result.Bucket is a time (ns on the
	// Limiter's clock) rather than a bucket or window number.
	BucketIsTime bool
	// MaxLimit is the largest limit it enforces; a Request above it is
	// refused with LimitErr. Algorithms that clamp larger limits to
	// window.MaxLimit have MaxLimit set to it and LimitErr nil.
	MaxLimit uint64
	// LimitErr is the error (ErrLogLimit, ErrConcurrencyLimit) for a
	// limit above MaxLimit, nil when larger limits are clamped.
	LimitErr error

	newMeter func(Spec) meter
}

// algorithms is the table every Algorithm is described in, indexed by it.
var algorithms = [...]AlgorithmInfo{
	SlidingWindow: {Name: "sliding_window", KeySuffix: ":sw", InRules: true, ChargeAlways: true, BucketIsTime: true,
		MaxLimit: MaxLimit, newMeter: func(s Spec) meter { return NewCounter(s) }},
	TokenBucket: {Name: "token_bucket", KeySuffix: ":tb", InRules: true,
		MaxLimit: MaxLimit, newMeter: func(s Spec) meter { return NewGCRA(s) }},
	FixedWindow: {Name: "fixed_window", KeySuffix: ":fw", InRules: true, ChargeAlways: true,
		MaxLimit: MaxLimit, newMeter: func(s Spec) meter { return NewFixedCounter(s) }},
	SlidingLog: {Name: "sliding_log", KeySuffix: ":lz", InRules: true, BucketIsTime: true,
		MaxLimit: MaxLogLimit, LimitErr: ErrLogLimit, newMeter: func(s Spec) meter { return NewLogCounter(s) }},
	TimeBuckets: {Name: "time_buckets", KeySuffix: "", InRules: true, Bucketed: true,
		MaxLimit: MaxLimit, newMeter: func(s Spec) meter { return NewBucketCounter(s) }},
	Concurrency: {Name: "concurrency", KeySuffix: ":cz", BucketIsTime: true, Holders: true,
		MaxLimit: MaxLogLimit, LimitErr: ErrConcurrencyLimit, newMeter: func(s Spec) meter { return NewLeaseCounter(s) }},
}

// Algorithms returns every Algorithm, in the order of their numbers.
func Algorithms() []Algorithm {
	all := make([]Algorithm, len(algorithms))
	for i := range all {
		all[i] = Algorithm(i)
	}
	return all
}

// Valid reports whether a is one of the Algorithms.
func (a Algorithm) Valid() bool { return int(a) < len(algorithms) }

// Info returns a's description, the zero AlgorithmInfo for an invalid a.
func (a Algorithm) Info() AlgorithmInfo {
	if !a.Valid() {
		return AlgorithmInfo{}
	}
	return algorithms[a]
}

// String returns the algorithm's name in rule files (Info().Name), or
// "Algorithm(n)" for an invalid one.
func (a Algorithm) String() string {
	if !a.Valid() {
		return fmt.Sprintf("Algorithm(%d)", uint8(a))
	}
	return algorithms[a].Name
}

// ParseAlgorithm returns the Algorithm that rule files name (one whose
// Info().InRules is set: sliding_window, token_bucket, fixed_window,
// sliding_log, time_buckets), and false for any other name.
func ParseAlgorithm(name string) (Algorithm, bool) {
	for a := range algorithms {
		if algorithms[a].InRules && algorithms[a].Name == name {
			return Algorithm(a), true
		}
	}
	return 0, false
}

// RuleAlgorithmNames returns the names ParseAlgorithm accepts, in the order
// of the algorithms' numbers (for error texts and docs).
func RuleAlgorithmNames() []string {
	var names []string
	for _, info := range algorithms {
		if info.InRules {
			names = append(names, info.Name)
		}
	}
	return names
}

// ChargeAlwaysSupported reports whether algorithm a serves
// Request.ChargeAlways (Info().ChargeAlways): SlidingWindow and
// FixedWindow, whose counts can exceed the limit.
func ChargeAlwaysSupported(a Algorithm) bool { return a.Info().ChargeAlways }

// CheckLimit reports whether alg can enforce limit: nil when limit is at
// most Info().MaxLimit or the algorithm clamps larger limits to MaxLimit
// (every algorithm but SlidingLog and Concurrency, which refuse limits
// above MaxLogLimit with ErrLogLimit and ErrConcurrencyLimit).
func CheckLimit(alg Algorithm, limit uint64) error {
	if info := alg.Info(); info.LimitErr != nil && limit > info.MaxLimit {
		return info.LimitErr
	}
	return nil
}
