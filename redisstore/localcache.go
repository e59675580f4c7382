package redisstore

import (
	"sync"
	"time"
)

// overLimitCache remembers, per key, a refusal Redis gave: until the time
// the request could pass again, a request for that key needing at least as
// many hits, under a limit no higher, is refused without asking Redis. The
// counts of a sliding window only fall by ageing (or Undo), so such a
// request would be refused by Redis too, unless another replica's Undo freed
// quota in between.
//
// The cache is bounded by an estimate of its bytes (key length plus a fixed
// overhead per entry); when full it drops expired entries, then arbitrary
// ones, down to 3/4 of the bound.
type overLimitCache struct {
	mu       sync.Mutex
	maxBytes int
	bytes    int
	m        map[string]overLimitEntry
}

type overLimitEntry struct {
	until     time.Duration // on the Store's local clock
	limit     uint64
	need      uint64 // hits of the refused request (1 for check-only)
	remaining uint64
}

// entryOverhead estimates the bytes of one entry beyond its key: the map
// slot, the string header and the entry.
const entryOverhead = 80

func newOverLimitCache(maxBytes int) *overLimitCache {
	return &overLimitCache{maxBytes: maxBytes, m: make(map[string]overLimitEntry)}
}

// get reports whether key is known to refuse need hits under limit at now,
// and if so the remaining quota last seen and the time until it may pass.
func (c *overLimitCache) get(key string, now time.Duration, limit, need uint64) (remaining uint64, reset time.Duration, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, found := c.m[key]
	if !found {
		return 0, 0, false
	}
	if now >= e.until {
		c.delete(key)
		return 0, 0, false
	}
	if limit > e.limit || need < e.need {
		return 0, 0, false
	}
	return e.remaining, e.until - now, true
}

// put remembers that key refused need hits under limit at now, for reset.
func (c *overLimitCache) put(key string, now, reset time.Duration, limit, need, remaining uint64) {
	if reset <= 0 {
		return
	}
	cost := len(key) + entryOverhead
	if cost > c.maxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, found := c.m[key]; found {
		c.delete(key)
	}
	if c.bytes+cost > c.maxBytes {
		c.shrink(now)
	}
	c.m[key] = overLimitEntry{until: now + reset, limit: limit, need: need, remaining: remaining}
	c.bytes += cost
}

// forget drops what is known about key.
func (c *overLimitCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, found := c.m[key]; found {
		c.delete(key)
	}
}

// len returns the number of entries and their estimated bytes.
func (c *overLimitCache) len() (entries, bytes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m), c.bytes
}

func (c *overLimitCache) delete(key string) {
	delete(c.m, key)
	c.bytes -= len(key) + entryOverhead
}

// shrink drops expired entries, then arbitrary ones (Go's map order), until
// the cache is at most 3/4 full.
func (c *overLimitCache) shrink(now time.Duration) {
	for k, e := range c.m {
		if now >= e.until {
			c.delete(k)
		}
	}
	for k := range c.m {
		if c.bytes <= c.maxBytes*3/4 {
			break
		}
		c.delete(k)
	}
}
