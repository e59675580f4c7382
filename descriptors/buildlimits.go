package descriptors

import (
	"math"
	"time"

	"github.com/leapgate/leapgate/window"
)

// The limits of one descriptor: its rate_limit and rate_limits blocks and
// its concurrency_limit, validated into the Rule's Limits.

// addConcurrency validates the descriptor's concurrency_limit block into
// rule: one Limit of algorithm window.Concurrency, and its holder key.
func (b *builder) addConcurrency(f *rawFile, d *rawDescriptor, rule *Rule) {
	c := d.concurrency
	if c == nil || c.bad {
		return
	}
	if len(d.limits) > 0 {
		b.errorf(f.name, c.line, "concurrency_limit cannot be combined with rate_limit or rate_limits on one descriptor (a refund would give back both)")
		return
	}
	switch {
	case !c.maxSet:
		b.errorf(f.name, c.line, "concurrency_limit: max_in_flight is required")
	case !c.leaseSet:
		b.errorf(f.name, c.line, "concurrency_limit: lease is required (the longest a request may hold its slot when its end is never reported)")
	case window.CheckLimit(window.Concurrency, uint64(c.maxInFlight)) != nil:
		b.errorf(f.name, at(c.lines, "max_in_flight", c.line), "concurrency_limit: max_in_flight %d is above the maximum of %d", c.maxInFlight, window.MaxLogLimit)
	case c.holderKey != "" && c.holderKey == d.key:
		b.errorf(f.name, at(c.lines, "holder_key", c.line), "concurrency_limit: holder_key '%s' is the descriptor's own key", c.holderKey)
	default:
		l := Limit{RequestsPerUnit: c.maxInFlight, Length: c.lease, Algorithm: window.Concurrency}
		l.Unit, l.UnitMultiplier = reportingUnit(c.lease)
		spec, err := window.NewSpec(c.lease, 1)
		if err != nil {
			b.errorf(f.name, at(c.lines, "lease", c.line), "concurrency_limit: lease: %v", err)
			return
		}
		l.Spec = spec
		rule.Limits = append(rule.Limits, l)
		rule.HolderKey = c.holderKey
		b.set.holders = b.set.holders || c.holderKey != ""
	}
}

// addLimits validates the descriptor's rate_limit blocks into rule.
func (b *builder) addLimits(f *rawFile, d *rawDescriptor, rule *Rule) {
	for _, rl := range d.limits {
		if rl.bad {
			continue
		}
		for _, r := range rl.replaces {
			if r.name == "" {
				b.errorf(f.name, r.line, "should not have an empty replaces entry")
				continue
			}
			rule.Replaces = append(rule.Replaces, r.name)
		}
		if rl.unlimited {
			if rl.unit != "" {
				b.errorf(f.name, at(rl.lines, "unit", rl.line), "should not specify rate limit unit when unlimited")
			}
			for _, field := range []string{"window", "unit_multiplier", "buckets", "algorithm", "charge"} {
				if _, set := rl.lines[field]; set {
					b.errorf(f.name, at(rl.lines, field, rl.line), "should not specify %s when unlimited", field)
				}
			}
			if len(d.limits) > 1 {
				b.errorf(f.name, at(rl.lines, "unlimited", rl.line), "an unlimited rate limit cannot be combined with other rate limits on one descriptor")
			}
			rule.Unlimited = true
			rule.unlimitedName = rl.name
			continue
		}
		l, ok := b.limit(f, rl)
		if ok && window.CheckLimit(l.Algorithm, uint64(l.RequestsPerUnit)) != nil {
			b.errorf(f.name, at(rl.lines, "requests_per_unit", rl.line),
				"rule %s: requests_per_unit %d is above the sliding_log maximum of %d (it keeps one 8-byte timestamp per hit); use sliding_window for large limits",
				rule.ID, l.RequestsPerUnit, window.MaxLogLimit)
			ok = false
		}
		if ok {
			rule.Limits = append(rule.Limits, l)
		}
	}
	for _, rl := range d.limits {
		for _, r := range rl.replaces {
			for _, name := range rule.Names() {
				if r.name == name {
					b.errorf(f.name, r.line, "replaces should not contain name of same descriptor")
				}
			}
		}
	}
}

// limit validates one non-unlimited rate_limit block.
func (b *builder) limit(f *rawFile, rl *rawLimit) (Limit, bool) {
	l := Limit{
		Name:            rl.name,
		RequestsPerUnit: rl.requestsPerUnit,
		UnitMultiplier:  1,
		Buckets:         rl.buckets,
		Algorithm:       rl.algorithm,
	}
	ok := true
	if rl.multiplierSet {
		if rl.unitMultiplier == 0 {
			b.errorf(f.name, at(rl.lines, "unit_multiplier", rl.line), "unit_multiplier must be at least 1")
			ok = false
		}
		l.UnitMultiplier = rl.unitMultiplier
	}
	if rl.bucketsSet && rl.buckets < 1 {
		b.errorf(f.name, at(rl.lines, "buckets", rl.line), "buckets must be at least 1, got %d", rl.buckets)
		return l, false
	}
	if rl.bucketsSet && rl.algorithm != window.TimeBuckets {
		alg := rl.algorithm.String()
		if !rl.algorithmSet {
			alg += ", the default,"
		}
		b.errorf(f.name, at(rl.lines, "buckets", rl.line), "buckets applies only to algorithm %s (%s keeps no time buckets)", window.TimeBuckets, alg)
		return l, false
	}
	switch {
	case !rl.chargeSet:
		l.ChargeAlways = b.opts.ChargeAlways && window.ChargeAlwaysSupported(l.Algorithm)
	case rl.charge == ChargeAlways:
		if !window.ChargeAlwaysSupported(l.Algorithm) {
			b.errorf(f.name, at(rl.lines, "charge", rl.line),
				"charge %s applies only to algorithms %s (%s cannot count beyond its limit)",
				ChargeAlways, list(chargeableAlgorithms(), "and"), l.Algorithm)
			return l, false
		}
		l.ChargeAlways = true
	case rl.charge == ChargeWhenAllowed:
	default:
		b.errorf(f.name, at(rl.lines, "charge", rl.line), "unknown charge '%s' (want %s or %s)", rl.charge, ChargeWhenAllowed, ChargeAlways)
		return l, false
	}
	if rl.window > 0 {
		l.Length = rl.window
		l.Unit, l.UnitMultiplier = reportingUnit(rl.window)
		if rl.unit != "" {
			if _, known := ParseUnit(rl.unit); !known {
				b.errorf(f.name, at(rl.lines, "unit", rl.line), "invalid rate limit unit '%s'", rl.unit)
				ok = false
			}
		}
	} else {
		u, known := ParseUnit(rl.unit)
		if !known {
			b.errorf(f.name, at(rl.lines, "unit", rl.line), "invalid rate limit unit '%s'", rl.unit)
			return l, false
		}
		l.Unit = u
		if time.Duration(l.UnitMultiplier) > math.MaxInt64/u.Duration() {
			b.errorf(f.name, at(rl.lines, "unit_multiplier", rl.line), "unit_multiplier %d makes the window longer than %v", l.UnitMultiplier, time.Duration(math.MaxInt64))
			ok = false
		}
	}
	if !ok {
		return l, false
	}
	buckets, field := 1, "window" // only time_buckets has buckets
	if l.Algorithm.Info().Bucketed {
		buckets = l.Buckets
		if buckets == 0 {
			buckets = b.opts.defaultBuckets()
		} else {
			field = "buckets"
		}
	}
	spec, err := window.NewSpec(l.Window(), buckets)
	if err != nil {
		reason := err.Error()
		if l.Algorithm.Info().Bucketed && !rl.bucketsSet {
			reason += " (the default bucket count, WINDOW_BUCKETS); set buckets to a divisor of the window"
		}
		b.errorf(f.name, at(rl.lines, field, rl.line), "%s", reason)
		return l, false
	}
	l.Spec = spec
	return l, true
}

// chargeableAlgorithms returns the names of the rule algorithms that serve
// charge: always (window.AlgorithmInfo.ChargeAlways).
func chargeableAlgorithms() []string {
	var names []string
	for _, a := range window.Algorithms() {
		if info := a.Info(); info.InRules && info.ChargeAlways {
			names = append(names, info.Name)
		}
	}
	return names
}

// reportingUnit returns the largest unit whose length divides w and the
// multiplier that makes up w, or SECOND and 1 when no unit divides w (a
// sub-second window) or the multiplier would overflow.
func reportingUnit(w time.Duration) (Unit, uint32) {
	for _, u := range []Unit{UnitYear, UnitMonth, UnitWeek, UnitDay, UnitHour, UnitMinute, UnitSecond} {
		if w%u.Duration() == 0 {
			m := w / u.Duration()
			if m > math.MaxUint32 {
				break
			}
			return u, uint32(m)
		}
	}
	return UnitSecond, 1
}
