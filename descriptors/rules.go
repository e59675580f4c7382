package descriptors

import (
	"fmt"
	"time"

	"github.com/leapgate/leapgate/window"
)

// Limit is one rate limit of a rule.
type Limit struct {
	// Name is the limit's name (rate_limit.name): the target of replaces,
	// echoed in current_limit.name.
	Name string
	// RequestsPerUnit is the number of hits allowed per window; 0 bans.
	RequestsPerUnit uint32
	// Unit is the window unit reported to Envoy.
	Unit Unit
	// UnitMultiplier multiplies Unit into the window length (1 when unset).
	UnitMultiplier uint32
	// Length, when non-zero, is an explicit window length (YAML `window: 30s`)
	// that overrides Unit × UnitMultiplier; Unit and UnitMultiplier then
	// report it: the largest unit that divides it and the multiple, when
	// that fits in 32 bits, else UnitSecond and 1.
	Length time.Duration
	// Buckets is the number of time buckets per window of a TimeBuckets
	// limit (0: the service default); the loader refuses it on the others.
	Buckets int
	// Algorithm is the admission algorithm (the zero value is
	// window.SlidingWindow); the loader refuses a limit it cannot enforce
	// (window.CheckLimit) and Buckets on any but window.TimeBuckets.
	Algorithm window.Algorithm
	// ChargeAlways (charge: always, or Options.ChargeAlways for a limit
	// that does not set charge) records every hit even when it does not
	// fit, putting the window into debt (window.Request.ChargeAlways). The
	// loader sets it only on algorithms that serve it
	// (window.ChargeAlwaysSupported) and refuses charge: always on the
	// others.
	ChargeAlways bool
	// Spec is the limit's window layout, set by the loader: Window() in
	// Buckets buckets (Options.DefaultBuckets when 0) for a TimeBuckets
	// limit, in one bucket for the others.
	Spec window.Spec
	// KeySuffix ends the counter keys of the limit (AppendCounterKey), set
	// by the loader: it names the layout and the algorithm, so that a
	// counter never meets a layout it was not made with and a limit keeps
	// its counter across reloads while they stay the same, and it differs
	// between two limits of one rule with the same layout.
	KeySuffix string
}

// The values of a rate_limit's charge field.
const (
	// ChargeWhenAllowed, the default, records hits only when they fit:
	// a refused request consumes nothing.
	ChargeWhenAllowed = "when_allowed"
	// ChargeAlways records every hit, even one that does not fit (a debt).
	ChargeAlways = "always"
)

// Window returns the window length of the limit: Length if set, else
// Unit × UnitMultiplier.
func (l Limit) Window() time.Duration {
	if l.Length > 0 {
		return l.Length
	}
	m := l.UnitMultiplier
	if m == 0 {
		m = 1
	}
	return l.Unit.Duration() * time.Duration(m)
}

// BreakerStrategy is how a circuit breaker decides that its upstream is
// unhealthy.
type BreakerStrategy uint8

// The strategies of a circuit_breaker block.
const (
	// SlowRequestRatio opens when the share of requests slower than
	// MaxResponseTime (or aborted) reaches Threshold.
	SlowRequestRatio BreakerStrategy = iota + 1
	// ErrorRatio opens when the share of failed requests reaches Threshold.
	ErrorRatio
	// ErrorCount opens when the number of failed requests in the window
	// reaches Threshold.
	ErrorCount
	// LatencyPercentile opens when the Threshold-th percentile (a fraction
	// in (0,1], e.g. 0.99) of the response times in the window, by nearest
	// rank, is above MaxResponseTime. It is exact, with no histogram: the
	// percentile is above MaxResponseTime exactly when more than
	// total - ceil(Threshold*total) requests are slower than it.
	LatencyPercentile
)

// Timed reports whether the strategy judges response times (and so needs
// MaxResponseTime), rather than errors.
func (s BreakerStrategy) Timed() bool { return s == SlowRequestRatio || s == LatencyPercentile }

// String returns the strategy's name in rule files.
func (s BreakerStrategy) String() string {
	switch s {
	case SlowRequestRatio:
		return "slow_request_ratio"
	case ErrorRatio:
		return "error_ratio"
	case ErrorCount:
		return "error_count"
	case LatencyPercentile:
		return "latency_percentile"
	}
	return fmt.Sprintf("BreakerStrategy(%d)", uint8(s))
}

// parseBreakerStrategy returns the strategy String names.
func parseBreakerStrategy(name string) (BreakerStrategy, bool) {
	for s := SlowRequestRatio; s <= LatencyPercentile; s++ {
		if s.String() == name {
			return s, true
		}
	}
	return 0, false
}

// Defaults of the fields a circuit_breaker block leaves out; probe_timeout
// defaults to the open duration.
const (
	DefaultBreakerWindow       = 10 * time.Second
	DefaultBreakerBuckets      = 10
	DefaultBreakerOpenDuration = 5 * time.Second
	DefaultHalfOpenProbes      = 1
)

// Breaker is the circuit_breaker block of a descriptor, validated by the
// loader (the only validator) with every default applied; package breaker
// runs it.
type Breaker struct {
	// Strategy is slow_request_ratio, error_ratio or error_count.
	Strategy BreakerStrategy
	// Threshold is a ratio in (0,1] for the ratio strategies, a count for
	// error_count.
	Threshold float64
	// MaxResponseTime is the response time above which a request is slow.
	MaxResponseTime time.Duration
	// ErrorStatuses lists the HTTP statuses counted as errors, sorted; empty
	// means every status >= 500. Aborted requests always count as errors.
	ErrorStatuses []int
	// MinRequests is the least number of observations in the window before
	// the breaker may open.
	MinRequests uint64
	// Spec is the statistics window and its bucket count.
	Spec window.Spec
	// OpenDuration is how long the breaker stays open before half-opening
	// after it opens from closed.
	OpenDuration time.Duration
	// MaxOpenDuration bounds the backoff: each time the breaker reopens
	// from half-open (a probe failed or timed out) it stays open twice as
	// long as the time before, up to MaxOpenDuration; closing resets it
	// to OpenDuration. Equal to OpenDuration (the default): no backoff.
	MaxOpenDuration time.Duration
	// HalfOpenProbes is the most requests admitted while half-open; all must
	// succeed to close the breaker.
	HalfOpenProbes uint32
	// ProbeTimeout is how long a probe may go unreported before it counts as
	// failed.
	ProbeTimeout time.Duration
	// RampDuration, when positive, is how long the breaker takes after
	// closing from half-open to admit all traffic again: at a time d into
	// the ramp it admits the share d/RampDuration of requests. 0 (the
	// default): all at once.
	RampDuration time.Duration
}

// Rule is one matched node of the descriptor tree.
type Rule struct {
	// Domain is the rule's domain.
	Domain string
	// Path is the chain of key/value patterns from the domain root to this
	// node; Value is "" for a value-less key and may contain '*' wildcards.
	Path []Entry
	// ID identifies the rule uniquely within a Set and stays the same across
	// reloads as long as domain and path do: "domain.key_value.key...".
	// It is also the metric label for the rule.
	ID string
	// Limits are the rule's rate limits (rate_limit, and the rate_limits
	// list); all must pass. Empty for a node that limits nothing.
	Limits []Limit
	// Unlimited marks a rule that always answers OK and is never counted.
	Unlimited bool
	// Replaces lists the names of limits this rule replaces.
	Replaces []string
	// ShadowMode, QuotaMode, DetailedMetric, ValueToMetric and
	// ShareThreshold are the per-descriptor flags of envoyproxy/ratelimit.
	ShadowMode     bool
	QuotaMode      bool
	DetailedMetric bool
	ValueToMetric  bool
	ShareThreshold bool
	// Metadata is the descriptor's metadata map, as parsed from YAML.
	Metadata map[string]any
	// Breaker is the descriptor's circuit breaker, nil when it has none.
	Breaker *Breaker
	// HolderKey is the key of the entry that names a request holding
	// slots of the rule's concurrency_limit (holder_key), "" when it has
	// none: a descriptor that ends with an entry of this key is matched
	// without it, and its value is the holder (see Set.MatchHolder).
	HolderKey string
	// File and Line locate the descriptor in its rule file.
	File string
	Line int

	// levels holds, per element of Path, how AppendKey and MetricKey treat
	// the request's value at that level.
	levels []level
	// unlimitedName is the name of an unlimited rate_limit block.
	unlimitedName string
}

// level is the key-building behaviour of one element of a rule's path.
type level struct {
	exact         bool // the level matches one literal value
	share         bool // share_threshold on a wildcard level: the pattern stands for the value
	valueToMetric bool // value_to_metric: the request's value goes into the metric key
}

// Names returns the names of the rule's limits, including the name of an
// unlimited block: the names other rules' replaces refer to.
func (r *Rule) Names() []string {
	var names []string
	for _, l := range r.Limits {
		if l.Name != "" {
			names = append(names, l.Name)
		}
	}
	if r.unlimitedName != "" {
		names = append(names, r.unlimitedName)
	}
	return names
}
