// Package envoyhdr is the vocabulary of Leapgate's answers that Envoy and
// the clients behind it read, shared by every package that refuses a
// request (the rate-limit service, ext_proc's blocking mode) or follows one
// (the breakers' probes): header names and values, and how a wait becomes
// Retry-After. It imports nothing of Leapgate's.
package envoyhdr

import (
	"strconv"
	"strings"
	"time"
)

// ReasonHeader is the response header that tells why a request was refused:
// ReasonCircuitOpen when a circuit breaker refused it, ReasonRateLimited when
// only rate limits did. It is added only to refusals.
const (
	ReasonHeader      = "x-ratelimit-reason"
	ReasonCircuitOpen = "circuit-open"
	ReasonRateLimited = "rate-limited"
)

// RetryAfterHeader is the response header of RFC 9110 §10.2.3, in whole
// seconds (RetryAfter).
const RetryAfterHeader = "Retry-After"

// RetryAfter is the Retry-After value for a wait of d: whole seconds
// rounded up, so a client that waits that long is never early, and at
// least 1 (a refused client retrying at once would be refused again).
func RetryAfter(d time.Duration) int64 { return max(Seconds(d), 1) }

// Seconds rounds d up to whole seconds, 0 for d <= 0.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// ProbeHeader is the request header that carries the ids of the probes a
// request is for (FormatProbes) from the rate-limit answer
// (request_headers_to_add) to the observations of its outcome.
const ProbeHeader = "x-leapgate-probe"

// MaxProbeIDs bounds the ids ParseProbes reads from one ProbeHeader value
// (a request is a probe of at most one breaker per descriptor).
const MaxProbeIDs = 64

// FormatProbes is the ProbeHeader value carrying ids: hexadecimal, comma
// separated.
func FormatProbes(ids []uint64) string {
	b := make([]byte, 0, 17*len(ids))
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, id, 16)
	}
	return string(b)
}

// ParseProbes reads the ids of a ProbeHeader value, skipping what is not
// a non-zero hexadecimal id, at most MaxProbeIDs of them.
func ParseProbes(v string) []uint64 {
	var ids []uint64
	for part := range strings.SplitSeq(v, ",") {
		if id, err := strconv.ParseUint(strings.TrimSpace(part), 16, 64); err == nil && id != 0 {
			ids = append(ids, id)
			if len(ids) == MaxProbeIDs {
				break
			}
		}
	}
	return ids
}
