package breaker

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/window"
)

// Strategy is how a breaker decides that its upstream is unhealthy.
type Strategy uint8

// Strategies of a breaker, named in YAML as slow_request_ratio, error_ratio
// and error_count.
const (
	// SlowRequestRatio opens when the share of requests slower than
	// MaxResponseTime (or aborted) reaches Threshold.
	SlowRequestRatio Strategy = iota + 1
	// ErrorRatio opens when the share of failed requests reaches Threshold.
	ErrorRatio
	// ErrorCount opens when the number of failed requests in the window
	// reaches Threshold.
	ErrorCount
)

// String returns the YAML name of the strategy.
func (s Strategy) String() string {
	switch s {
	case SlowRequestRatio:
		return "slow_request_ratio"
	case ErrorRatio:
		return "error_ratio"
	case ErrorCount:
		return "error_count"
	}
	return fmt.Sprintf("Strategy(%d)", uint8(s))
}

// ParseStrategy returns the Strategy named s.
func ParseStrategy(s string) (Strategy, error) {
	switch s {
	case "slow_request_ratio":
		return SlowRequestRatio, nil
	case "error_ratio":
		return ErrorRatio, nil
	case "error_count":
		return ErrorCount, nil
	}
	return 0, fmt.Errorf("unknown circuit breaker strategy %q (want slow_request_ratio, error_ratio or error_count)", s)
}

// Defaults applied by NewConfig to fields the circuit_breaker block leaves
// at zero (the same as the YAML loader's); a zero ProbeTimeout defaults to
// the OpenDuration.
const (
	DefaultWindow         = 10 * time.Second
	DefaultBuckets        = 10
	DefaultOpenDuration   = 5 * time.Second
	DefaultHalfOpenProbes = 1
)

// Config is a validated breaker configuration with defaults applied.
type Config struct {
	Strategy        Strategy
	Threshold       float64
	MaxResponseTime time.Duration
	ErrorStatuses   []int // sorted; empty means every status >= 500
	MinRequests     uint64
	Spec            window.Spec
	OpenDuration    time.Duration
	HalfOpenProbes  uint32
	ProbeTimeout    time.Duration
}

// NewConfig validates the circuit_breaker block b and applies the defaults
// to its zero fields.
func NewConfig(b descriptors.Breaker) (Config, error) {
	strategy, err := ParseStrategy(b.Strategy)
	if err != nil {
		return Config{}, err
	}
	c := Config{
		Strategy:        strategy,
		Threshold:       b.Threshold,
		MaxResponseTime: b.MaxResponseTime,
		ErrorStatuses:   slices.Sorted(slices.Values(b.ErrorStatuses)),
		MinRequests:     b.MinRequests,
		OpenDuration:    b.OpenDuration,
		HalfOpenProbes:  b.HalfOpenProbes,
		ProbeTimeout:    b.ProbeTimeout,
	}
	switch strategy {
	case SlowRequestRatio, ErrorRatio:
		if !(b.Threshold > 0 && b.Threshold <= 1) {
			return Config{}, fmt.Errorf("threshold %v of %s must be a ratio in (0, 1]", b.Threshold, strategy)
		}
	case ErrorCount:
		if b.Threshold < 1 {
			return Config{}, fmt.Errorf("threshold %v of error_count must be at least 1", b.Threshold)
		}
	}
	if strategy == SlowRequestRatio && b.MaxResponseTime <= 0 {
		return Config{}, errors.New("slow_request_ratio needs a positive max_response_time")
	}
	if b.MaxResponseTime < 0 || b.OpenDuration < 0 || b.ProbeTimeout < 0 || b.Window < 0 || b.Buckets < 0 {
		return Config{}, errors.New("durations and bucket count must not be negative")
	}
	for _, s := range c.ErrorStatuses {
		if s < 100 || s > 599 {
			return Config{}, fmt.Errorf("error status %d is not an HTTP status", s)
		}
	}
	length, buckets := b.Window, b.Buckets
	if length == 0 {
		length = DefaultWindow
	}
	if buckets == 0 {
		buckets = DefaultBuckets
		if int64(length)%int64(buckets) != 0 {
			buckets = 1 // never silently: NewSpec below still demands divisibility
			for _, k := range []int{10, 8, 5, 4, 2} {
				if int64(length)%int64(k) == 0 {
					buckets = k
					break
				}
			}
		}
	}
	if c.Spec, err = window.NewSpec(length, buckets); err != nil {
		return Config{}, fmt.Errorf("statistics window: %w", err)
	}
	if c.OpenDuration == 0 {
		c.OpenDuration = DefaultOpenDuration
	}
	if c.HalfOpenProbes == 0 {
		c.HalfOpenProbes = DefaultHalfOpenProbes
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = c.OpenDuration
	}
	return c, nil
}

// Equal reports whether two configurations describe the same breaker.
func (c Config) Equal(o Config) bool {
	return c.Strategy == o.Strategy && c.Threshold == o.Threshold &&
		c.MaxResponseTime == o.MaxResponseTime && slices.Equal(c.ErrorStatuses, o.ErrorStatuses) &&
		c.MinRequests == o.MinRequests && c.Spec == o.Spec && c.OpenDuration == o.OpenDuration &&
		c.HalfOpenProbes == o.HalfOpenProbes && c.ProbeTimeout == o.ProbeTimeout
}

// Outcome is what one observed request tells a breaker.
type Outcome struct {
	// ResponseTime is the observed response time; for an in-flight request,
	// the time it has been open so far.
	ResponseTime time.Duration
	// Status is the HTTP status, 0 when unknown.
	Status int
	// Aborted marks a request that never got a response (reset, connection
	// failure): a failure for every strategy.
	Aborted bool
	// Error marks a request its reporter declared failed.
	Error bool
	// InFlight marks a request still open: ResponseTime is a lower bound.
	InFlight bool
}

// Failed reports whether the outcome counts against the breaker: for
// slow_request_ratio a response time above MaxResponseTime (strictly) or an
// abort; for the error strategies an abort, a declared error or a status in
// ErrorStatuses (default: >= 500).
func (c Config) Failed(o Outcome) bool {
	if o.Aborted {
		return true
	}
	if c.Strategy == SlowRequestRatio {
		return o.ResponseTime > c.MaxResponseTime
	}
	if o.Error {
		return true
	}
	if len(c.ErrorStatuses) == 0 {
		return o.Status >= 500
	}
	_, found := slices.BinarySearch(c.ErrorStatuses, o.Status)
	return found
}

// tripped reports whether failed of total observations open the breaker.
// Ratios compare with a small tolerance so that 3 of 10 reaches 0.3.
func (c Config) tripped(failed, total uint64) bool {
	if total == 0 || total < c.MinRequests {
		return false
	}
	if c.Strategy == ErrorCount {
		return float64(failed) >= c.Threshold
	}
	return float64(failed)/float64(total) >= c.Threshold-1e-9
}
