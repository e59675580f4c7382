package rlqs

import (
	"context"
	"math"
	"slices"
	"time"
)

// Ledger shares the division of every limit among the replicas that serve
// RLQS for it (package redisstore's QuotaLedger on Redis): each replica
// divides among its own streams with the level and spare the ledger
// computes over every replica's claims, and raises only what the ledger
// grants it, so that two replicas never hand out the same capacity.
type Ledger interface {
	// Divide records, atomically per key, this replica's claim on each
	// key, forgets the claims of replicas that have not renewed theirs
	// within their Hold, and returns one Division per claim, in order.
	// The Grant of a Division is reserved for this replica until its next
	// claim on the key. A claim with no demand points and nothing fixed,
	// committed or wanted withdraws this replica's claim on the key (the
	// replica no longer serves it): its capacity is free at once.
	Divide(ctx context.Context, claims []Claim) ([]Division, error)
}

// MaxClaimPoints is the most demand points a Claim carries: a replica with
// more buckets on a key sends their demands grouped (each group's mean,
// weighted by its size).
const MaxClaimPoints = 64

// Claim is one replica's claim on one limit, in tokens per window of the
// limit.
type Claim struct {
	// Key is the limit's counter key (the pool).
	Key string
	// Limit and Reserve are the limit's requests per window and the part
	// kept for newcomers' holds.
	Limit, Reserve float64
	// Hold is how long the claim stands without being renewed: long
	// enough that every assignment the replica sent has expired.
	Hold time.Duration
	// Demands and Weights are the demand points of the replica's live
	// buckets on the key (+Inf for an unknown demand): Weights[i] buckets
	// claim Demands[i] each.
	Demands, Weights []float64
	// Fixed is the cost of the assignments of the replica's closed
	// streams, in force until they expire; Committed the cost of what its
	// live buckets may enforce now.
	Fixed, Committed float64
	// Want is the most by which the replica would raise Committed now.
	Want float64
}

// Division is a limit's division over every replica's claims.
type Division struct {
	// Level is the max-min water level: a bucket's share is the lesser of
	// its demand and Level, plus Spare. +Inf when every demand fits.
	Level, Spare float64
	// Replicas is the number of replicas with a live claim on the key.
	Replicas int
	// Grant is how much this replica may raise its committed cost by now.
	Grant float64
}

// summarize returns the demand points of demands: all of them, or at most
// MaxClaimPoints groups of equal size (each its mean; +Inf demands as
// the limit).
func summarize(demands []float64, limit float64) (points, weights []float64) {
	ds := make([]float64, len(demands))
	for i, d := range demands {
		ds[i] = min(d, limit)
	}
	slices.Sort(ds)
	if len(ds) <= MaxClaimPoints {
		weights = make([]float64, len(ds))
		for i := range weights {
			weights[i] = 1
		}
		return ds, weights
	}
	for g := 0; g < MaxClaimPoints; g++ {
		from, to := g*len(ds)/MaxClaimPoints, (g+1)*len(ds)/MaxClaimPoints
		sum := 0.0
		for _, d := range ds[from:to] {
			sum += d
		}
		points = append(points, sum/float64(to-from))
		weights = append(weights, float64(to-from))
	}
	return points, weights
}

// divideLocal is the Division of a pool served by this replica alone: the
// same arithmetic as a Ledger's, over this replica's claim, with all the
// room left granted (no other replica needs it).
func divideLocal(c Claim) Division {
	level, spare := waterLevel(c.Limit-c.Reserve-c.Fixed-MinBurst*sum(c.Weights), c.Demands, c.Weights)
	return Division{Level: level, Spare: spare, Replicas: 1, Grant: math.Max(0, c.Limit-c.Reserve-c.Fixed-c.Committed)}
}

// waterLevel is the max-min division of capacity among weighted demand
// points (sorted or not), with a second pass that takes out what the
// bursts of large shares add beyond MinBurst: the level (+Inf when every
// demand fits) and the spare each claim gets on top.
func waterLevel(capacity float64, demands, weights []float64) (level, spare float64) {
	level, spare = fill(capacity, demands, weights)
	extra := 0.0
	for i, d := range demands {
		extra += weights[i] * math.Max(0, math.Floor(BurstShare*(math.Min(d, level)+spare))-MinBurst)
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
