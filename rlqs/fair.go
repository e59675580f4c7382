package rlqs

import (
	"math"
	"slices"
)

// maxMinShares divides capacity among claims max-min fairly and writes
// each claim's share to shares (len(shares) == len(demands)): a claim
// demanding less than an equal part of what is left gets its demand, and
// the others divide the rest equally. When the demands sum to less than
// capacity, the spare is handed out too, in equal parts to every claim, so
// that no capacity stays idle while a claim could grow into it. A negative
// capacity counts as 0; a demand of +Inf claims all it can get.
func maxMinShares(capacity float64, demands, shares []float64) {
	n := len(demands)
	if n == 0 {
		return
	}
	capacity = max(capacity, 0)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		switch {
		case demands[a] < demands[b]:
			return -1
		case demands[a] > demands[b]:
			return 1
		}
		return 0
	})
	left := capacity
	for k, i := range order {
		fair := left / float64(n-k)
		share := min(max(demands[i], 0), fair)
		shares[i] = share
		left -= share
	}
	if left > 0 && !math.IsInf(left, 0) {
		spare := left / float64(n)
		for i := range shares {
			shares[i] += spare
		}
	}
}
