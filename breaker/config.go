package breaker

import (
	"math"
	"slices"
	"time"

	"github.com/leapgate/leapgate/descriptors"
)

// Config is what a breaker runs: a circuit_breaker block as the rule loader
// validated it, defaults applied (descriptors.Breaker: strategy, threshold,
// statistics window, open duration, probes). It adds the behaviour: which
// outcomes fail and when the failures open the breaker.
type Config struct {
	descriptors.Breaker
}

// Equal reports whether two configurations describe the same breaker.
func (c Config) Equal(o Config) bool {
	return c.Strategy == o.Strategy && c.Threshold == o.Threshold &&
		c.MaxResponseTime == o.MaxResponseTime && slices.Equal(c.ErrorStatuses, o.ErrorStatuses) &&
		c.MinRequests == o.MinRequests && c.Spec == o.Spec && c.OpenDuration == o.OpenDuration && c.MaxOpenDuration == o.MaxOpenDuration &&
		c.HalfOpenProbes == o.HalfOpenProbes && c.ProbeTimeout == o.ProbeTimeout && c.RampDuration == o.RampDuration
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
	// Probes are the probe ids the request carried (envoyhdr.ProbeHeader), if any.
	Probes []uint64
}

// Failed reports whether the outcome counts against the breaker: for
// slow_request_ratio and latency_percentile a response time above
// MaxResponseTime (strictly) or an abort; for the error strategies an abort, a declared error or a status in
// ErrorStatuses (default: >= 500).
func (c Config) Failed(o Outcome) bool {
	if o.Aborted {
		return true
	}
	if c.Strategy.Timed() {
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
	switch c.Strategy {
	case descriptors.ErrorCount:
		return float64(failed) >= c.Threshold
	case descriptors.LatencyPercentile:
		// The rank-th smallest response time (nearest rank) is above
		// MaxResponseTime iff fewer than rank are at most it.
		rank := uint64(math.Ceil(c.Threshold*float64(total) - 1e-9))
		return failed > total-min(rank, total)
	}
	return float64(failed)/float64(total) >= c.Threshold-1e-9
}
