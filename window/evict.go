package window

import "time"

// evictSample is how many keys eviction compares.
const evictSample = 8

// candidate is a key considered for eviction.
type candidate struct {
	sh   *storeShard
	key  digest
	c    meter
	used time.Duration
	idle bool
}

// makeRoom evicts one key and reports whether it did: of up to evictSample keys sampled from sh
// (locked by the caller) and, if it holds fewer, from the following shards
// whose locks are free at once, the first idle one, else the least recently
// used. It never waits for a second lock while holding one, so shards
// cannot deadlock; if the victim's shard is busy nothing is evicted this
// time.
func (s *Store) makeRoom(sh *storeShard, now time.Duration) bool {
	var cands [evictSample]candidate
	n := sample(sh, now, cands[:])
	for i := 1; i < storeShards && n < evictSample; i++ {
		other := &s.shards[(sh.idx+i)%storeShards]
		if other.mu.TryRLock() {
			n += sample(other, now, cands[n:])
			other.mu.RUnlock()
		}
	}
	if n == 0 {
		return false
	}
	v := &cands[0]
	for i := 1; i < n && !v.idle; i++ {
		if cands[i].idle || cands[i].used < v.used {
			v = &cands[i]
		}
	}
	if v.sh != sh {
		if !v.sh.mu.TryLock() {
			return false
		}
		defer v.sh.mu.Unlock()
	}
	if v.sh.m[v.key] != v.c {
		return false
	}
	s.bytes.Add(-entryBytes - v.c.footprint())
	delete(v.sh.m, v.key)
	s.keys.Add(-1)
	s.evictions.Add(1)
	return true
}

// sample fills dst with keys of sh (locked), stopping early at an idle one,
// and returns how many it filled.
func sample(sh *storeShard, now time.Duration, dst []candidate) int {
	n := 0
	for k, c := range sh.m {
		if n == len(dst) {
			break
		}
		used := c.LastUsed()
		// Only a counter untouched for a window and a bucket can be idle:
		// skip the exact (draining) check for the others.
		spec, _ := c.layout()
		idle := now-used > spec.Length()+spec.BucketLength() && c.idleAt(now)
		dst[n] = candidate{sh: sh, key: k, c: c, used: used, idle: idle}
		n++
		if idle {
			break
		}
	}
	return n
}
