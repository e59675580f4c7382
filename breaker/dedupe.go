package breaker

import (
	"hash/maphash"
	"sync"
)

// dedupeCapacity is how many request IDs the registry remembers, waiting
// for the other feed to report the same request (about 1.5 MiB).
const dedupeCapacity = 1 << 16

// dedupe pairs the reports of one request from the two Envoy feeds, ext_proc
// and the access-log service, by Envoy's request ID, so that a mesh that
// configures both counts each request once. The first feed to report a
// request claims it; the other feed's report of the same ID is a duplicate,
// dropped, and ends the claim. Reports of one feed never drop each other
// (ext_proc's in-flight report and its final one are the same request's
// two steps). IDs are kept as keyed 64-bit hashes in a ring of
// dedupeCapacity: an ID whose pair never comes ages out.
type dedupe struct {
	seed maphash.Seed

	mu     sync.Mutex
	claims map[uint64]feed
	ring   []uint64
	next   int
}

// feed is a family of observation sources that report each request once.
type feed uint8

const (
	feedNone feed = iota
	feedExtProc
	feedALS
)

// feedOf is the feed of a Source* constant; feedNone for sources that carry
// no request ID (reports).
func feedOf(source string) feed {
	switch source {
	case SourceExtProc, SourceExtProcInFlight:
		return feedExtProc
	case SourceALS:
		return feedALS
	}
	return feedNone
}

func newDedupe() *dedupe {
	return &dedupe{seed: maphash.MakeSeed(), claims: make(map[uint64]feed, dedupeCapacity), ring: make([]uint64, dedupeCapacity)}
}

// duplicate reports whether an observation of request id from source was
// already reported by the other feed.
func (d *dedupe) duplicate(id, source string) bool {
	f := feedOf(source)
	if id == "" || f == feedNone {
		return false
	}
	h := maphash.String(d.seed, id)
	d.mu.Lock()
	defer d.mu.Unlock()
	switch claimed, ok := d.claims[h]; {
	case !ok:
		if old := d.ring[d.next]; old != 0 {
			delete(d.claims, old)
		}
		d.ring[d.next] = h
		d.next = (d.next + 1) % len(d.ring)
		d.claims[h] = f
		return false
	case claimed == f:
		return false
	default:
		delete(d.claims, h) // its slot in the ring is reclaimed in turn
		return true
	}
}
