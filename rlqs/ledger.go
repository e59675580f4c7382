package rlqs

import (
	"math"
	"slices"

	"github.com/leapgate/leapgate/rlqs/quota"
)

// summarize returns the demand points of demands: all of them, or at most
// quota.MaxClaimPoints groups of equal size (each its mean; +Inf demands as
// the limit).
func summarize(demands []float64, limit float64) (points, weights []float64) {
	ds := make([]float64, len(demands))
	for i, d := range demands {
		ds[i] = min(d, limit)
	}
	slices.Sort(ds)
	if len(ds) <= quota.MaxClaimPoints {
		weights = make([]float64, len(ds))
		for i := range weights {
			weights[i] = 1
		}
		return ds, weights
	}
	for g := 0; g < quota.MaxClaimPoints; g++ {
		from, to := g*len(ds)/quota.MaxClaimPoints, (g+1)*len(ds)/quota.MaxClaimPoints
		sum := 0.0
		for _, d := range ds[from:to] {
			sum += d
		}
		points = append(points, sum/float64(to-from))
		weights = append(weights, float64(to-from))
	}
	return points, weights
}

// divideLocal is the quota.Division of a pool served by this replica alone: the
// same arithmetic as a Ledger's, over this replica's claim, with all the
// room left granted (no other replica needs it).
func divideLocal(c quota.Claim) quota.Division {
	level, spare := waterLevel(c.Limit-c.Reserve-c.Fixed-quota.MinBurst*sum(c.Weights), c.Demands, c.Weights)
	return quota.Division{Level: level, Spare: spare, Replicas: 1, Grant: math.Max(0, c.Limit-c.Reserve-c.Fixed-c.Committed)}
}

// waterLevel is the max-min division of capacity among weighted demand
// points (sorted or not), with a second pass that takes out what the
// bursts of large shares add beyond quota.MinBurst: the level (+Inf when every
// demand fits) and the spare each claim gets on top.
func waterLevel(capacity float64, demands, weights []float64) (level, spare float64) {
	level, spare = fill(capacity, demands, weights)
	extra := 0.0
	for i, d := range demands {
		extra += weights[i] * math.Max(0, math.Floor(quota.BurstShare*(math.Min(d, level)+spare))-quota.MinBurst)
	}
	if extra > 0 {
		level, spare = fill(capacity-extra, demands, weights)
	}
	return level, spare
}

// fill is one pass of the division of capacity among weighted demands.
func fill(capacity float64, demands, weights []float64) (level, spare float64) {
	idx := make([]int, len(demands))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmpFloat(demands[a], demands[b]) })
	left, w := math.Max(capacity, 0), sum(weights)
	total := w
	for _, i := range idx {
		if w <= 0 {
			break
		}
		if fair := left / w; demands[i] > fair {
			return fair, 0
		}
		left -= math.Max(demands[i], 0) * weights[i]
		w -= weights[i]
	}
	if total <= 0 {
		return math.Inf(1), 0
	}
	return math.Inf(1), left / total
}

func sum(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s
}
