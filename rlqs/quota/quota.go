// Package quota is the contract between RLQS's allocation (package rlqs)
// and the ledgers through which replicas share it (package redisstore's
// QuotaLedger): the claims a replica makes on each limit, the division a
// ledger answers, and the constants both sides count bursts with. It has
// no dependencies, so that a backend implements it without importing the
// gRPC service.
package quota

import (
	"context"
	"time"
)

// BurstShare is the share of a bucket's tokens per window given as burst
// (max_tokens), at least MinBurst: enough for requests that do not arrive
// evenly, small enough that the bursts of a fleet stay a small part of the
// limit. A division counts bursts with it.
const BurstShare = 1.0 / 100

// MinBurst is the least burst (a division counts it per bucket): with one
// token, a bucket whose requests arrive between two refills wastes what it
// refills past the one, and admits less than its rate.
const MinBurst = 2

// Ledger shares the division of every limit among the replicas that serve
// RLQS for it (package redisstore's QuotaLedger on Redis; without one,
// package rlqs divides alone): each replica divides among its own streams
// with the level and spare the ledger computes over every replica's
// claims, and raises only what the ledger grants it, so that two replicas
// never hand out the same capacity.
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
