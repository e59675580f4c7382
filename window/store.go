package window

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// storeShards is the number of independently locked parts of a Store's key
// map. A power of two.
const storeShards = 256

// Store is the in-memory Limiter: one counter per key (a Counter, or the
// counter of the Request's Algorithm), created on first use.
//
// A key is bound to the Spec it was created with: a request with the same
// Key but another Spec (a rule whose window changed on reload) replaces the
// counter with an empty one. The limit is per call, so a raised or lowered
// limit applies at once to the existing window.
//
// Memory is bounded three ways. Sweep (run periodically by Run) reclaims
// counters with nothing inside their window. With StoreOptions.MaxKeys and
// StoreOptions.MaxBytes, creating a key beyond either bound first evicts
// approximately least recently used ones. Evicting a counter forgets its
// hits.
//
// A Store keeps no key: its maps are keyed by a 128-bit keyed digest of
// Request.Key (see digest), so a key costs the same whatever its length,
// and a caller may pass a Key that aliases a reused buffer (built with
// unsafe.String) for the duration of the call. Looking up an existing key
// does not allocate.
//
// A Store is safe for concurrent use.
type Store struct {
	clock    Clock
	seeds    [2]maphash.Seed // of the keyed digest; random per Store
	maxKeys  int64
	maxBytes int64

	keys      atomic.Int64
	bytes     atomic.Int64 // accounted bytes: entryBytes + footprint per key
	evictions atomic.Uint64
	reclaims  atomic.Uint64
	replaced  atomic.Uint64

	shards [storeShards]storeShard
}

type storeShard struct {
	mu   sync.RWMutex
	m    map[digest]meter
	idx  int                       // position in Store.shards
	peak int                       // most keys held since m was allocated
	_    [64 - 24 - 8 - 8 - 8]byte // keep shards on separate cache lines
}

// shrinkBelow is the key count under which Sweep considers rebuilding a
// shard's map: Go maps never give back the room of deleted keys, so after a
// burst of keys a shard's map is copied into a right-sized one once it
// holds under a quarter of its peak.
const shrinkBelow = 256

// StoreOptions configure a Store.
type StoreOptions struct {
	// Clock is what Do reads the time from; if nil, a MonotonicClock.
	Clock Clock
	// MaxKeys bounds the number of keys (counters) the Store holds; if 0 or
	// less, there is no bound. When a new key would exceed it, the Store
	// evicts from the new key's shard the least recently used of a few
	// sampled keys, preferring one with nothing in its window (approximate
	// LRU, as in Redis); if that shard holds too few, also from other shards
	// whose locks are free. Under contention the bound may be exceeded
	// briefly by a few keys.
	//
	// The memory of one key is measured by BenchmarkBytesPerKey;
	// TestStoreBoundedMemory streams 1,000,000 distinct keys through a Store
	// with MaxKeys 20000 and checks that the heap stays within its bound
	// while a hot key's limit holds.
	MaxKeys int
	// MaxBytes bounds the bytes the Store's counters take, as accounted:
	// per key, entryBytes for its map entry plus its counter's footprint
	// (256 bytes for a SlidingWindow Counter, 8 per unit of limit plus 80
	// for a SlidingLog, 64 plus 8 per bucket for TimeBuckets; see
	// StoreStats.Bytes). If 0 or less, there is no bound. When a new key
	// would exceed it, the Store evicts as MaxKeys does until it fits, or
	// until no key can be evicted at once (its shard is busy: the bound is
	// then exceeded briefly); a sliding log that grows because its limit
	// was raised is accounted at once but makes room only at the next new
	// key. The Go heap holding these counters is larger by
	// the garbage collector's headroom (up to GOGC percent, 100 by
	// default).
	MaxBytes int64
}

// entryBytes is what the Store accounts for one key's map entry: the
// 16-byte digest and the 16-byte interface of the slot, Swiss-table control
// bytes and load-factor slack, and the table's growth by doubling
// (BenchmarkBytesPerKey measures 48 on average).
const entryBytes = 64

// NewStore returns an empty Store.
func NewStore(opts StoreOptions) *Store {
	clock := opts.Clock
	if clock == nil {
		clock = NewMonotonicClock()
	}
	s := &Store{
		clock:    clock,
		maxKeys:  int64(opts.MaxKeys),
		maxBytes: opts.MaxBytes,
		seeds:    [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
	}
	for i := range s.shards {
		s.shards[i].m = make(map[digest]meter)
		s.shards[i].idx = i
	}
	return s
}

// StoreStats are cumulative counts of a Store's memory management.
type StoreStats struct {
	// Keys is the number of counters held now.
	Keys int64
	// Bytes is the bytes the counters held now are accounted for (see
	// StoreOptions.MaxBytes).
	Bytes int64
	// Evictions counts counters evicted because MaxKeys or MaxBytes was
	// reached.
	Evictions uint64
	// Reclaims counts idle counters removed by Sweep.
	Reclaims uint64
	// Replaced counts counters replaced because their key came with a new Spec.
	Replaced uint64
}

// Stats returns the Store's current key count and cumulative evictions,
// reclaims and replacements, for export as metrics.
func (s *Store) Stats() StoreStats {
	return StoreStats{
		Keys:      s.keys.Load(),
		Bytes:     s.bytes.Load(),
		Evictions: s.evictions.Load(),
		Reclaims:  s.reclaims.Load(),
		Replaced:  s.replaced.Load(),
	}
}

// ErrInvalidSpec is returned (wrapped) for a Request whose Spec is the zero
// Spec rather than one built by NewSpec.
var ErrInvalidSpec = errors.New("window: invalid Spec (build it with NewSpec)")

// ErrLogLimit is returned (wrapped) for a SlidingLog Request whose Limit is
// above MaxLogLimit.
var ErrLogLimit = fmt.Errorf("window: sliding_log limit above its maximum of %d (one 8-byte timestamp per hit)", MaxLogLimit)

// ErrConcurrencyLimit is returned (wrapped) for a Concurrency Request whose
// Limit is above MaxLogLimit.
var ErrConcurrencyLimit = fmt.Errorf("window: concurrency limit above its maximum of %d (one lease per request in flight)", MaxLogLimit)

// CheckRequest returns window.CheckRequest(req): the Store serves every
// request that every Limiter must (see RequestChecker).
func (s *Store) CheckRequest(req *Request) error { return CheckRequest(req) }

// Do answers reqs at the Store clock's current time, with the Limiter
// contract: results[i] answers reqs[i]; if any request with Veto is refused
// nothing is recorded (allowed requests are admitted in order, then undone)
// but the hits of ChargeAlways requests, which are always recorded; other
// refused requests never consume quota. Refunds (Negative requests) are
// applied after the admissions, only if nothing was vetoed; a vetoed
// refund's result is a check. A check-only request (Hits 0), a refund, or
// a request no window can take (Hits > Limit) on an unknown key creates no
// counter.
func (s *Store) Do(ctx context.Context, reqs []Request) ([]Result, error) {
	results := make([]Result, len(reqs))
	return results, s.DoAt(ctx, s.clock.Now(), reqs, results)
}

// DoAt is Do at an explicit time now, writing results[i] for reqs[i]
// (results must be at least as long as reqs). It does not allocate for
// existing keys.
func (s *Store) DoAt(ctx context.Context, now time.Duration, reqs []Request, results []Result) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(results) < len(reqs) {
		return fmt.Errorf("window: %d results for %d requests", len(results), len(reqs))
	}
	for i := range reqs {
		if err := CheckRequest(&reqs[i]); err != nil {
			return fmt.Errorf("request %d (key %q): %w", i, reqs[i].Key, err)
		}
	}
	vetoed, refunds := false, false
	for i := range reqs {
		if reqs[i].Negative {
			refunds = true
			continue
		}
		results[i] = s.allow(now, &reqs[i])
		if !results[i].Allowed && reqs[i].Veto {
			vetoed = true
		}
	}
	if refunds {
		for i := range reqs {
			if !reqs[i].Negative {
				continue
			}
			if vetoed {
				results[i] = s.allow(now, &Request{Key: reqs[i].Key, Spec: reqs[i].Spec, Limit: reqs[i].Limit, Algorithm: reqs[i].Algorithm})
			} else {
				results[i] = s.refund(now, &reqs[i])
			}
		}
	}
	if vetoed {
		for i := range reqs {
			r := &results[i]
			if !r.Recorded || reqs[i].ChargeAlways {
				continue // an always-charged request keeps its hits
			}
			s.undo(&reqs[i], r.Bucket)
			r.Unrecord(&reqs[i])
		}
	}
	return nil
}

// Undo takes back the hits of results[i] with Recorded set, as recorded for
// reqs[i] by an earlier Do. Hits whose bucket already left the window, or
// whose counter was evicted or replaced since, are already forgotten.
func (s *Store) Undo(ctx context.Context, reqs []Request, results []Result) error {
	if len(results) < len(reqs) {
		return fmt.Errorf("window: %d results for %d requests", len(results), len(reqs))
	}
	for i := range reqs {
		if results[i].Recorded {
			s.undo(&reqs[i], results[i].Bucket)
		}
	}
	return nil
}

// CountAt returns the hits counted for key at now by a SlidingWindow,
// SlidingLog or TimeBuckets counter, or the slots held by a Concurrency
// one (0 for an unknown key or another algorithm).
func (s *Store) CountAt(key string, now time.Duration) uint64 {
	d := s.digest(key)
	sh := s.shard(d)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	switch c := sh.m[d].(type) {
	case *Counter:
		return c.CountAt(now)
	case *LogCounter:
		return c.CountAt(now)
	case *BucketCounter:
		return c.CountAt(now)
	case *LeaseCounter:
		return c.CountAt(now)
	}
	return 0
}

// Sweep removes every counter with nothing inside its window at now and
// returns how many it removed. It also gives back the memory of a burst of
// keys that has since gone (see shrinkBelow).
func (s *Store) Sweep(now time.Duration) int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, c := range sh.m {
			if c.idleAt(now) {
				s.bytes.Add(-entryBytes - c.footprint())
				delete(sh.m, k)
				n++
			}
		}
		if sh.peak > shrinkBelow && len(sh.m) < sh.peak/4 {
			m := make(map[digest]meter, len(sh.m))
			for k, c := range sh.m {
				m[k] = c
			}
			sh.m, sh.peak = m, len(m)
		}
		sh.mu.Unlock()
	}
	s.keys.Add(-int64(n))
	s.reclaims.Add(uint64(n))
	return n
}

// Run sweeps the Store every interval until ctx is done, then returns
// ctx's error. A window length is a sensible interval.
func (s *Store) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("window: sweep interval %v must be positive", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			s.Sweep(s.clock.Now())
		}
	}
}

// digest identifies a key in a Store's maps: a 128-bit keyed hash of it
// (two maphash hashes under random per-Store seeds), so every key costs the
// same whatever its length, and nobody who does not know the seeds can
// choose keys that collide. Two distinct keys share a counter with
// probability about n²/2^129 for n keys.
type digest [2]uint64

func (s *Store) digest(key string) digest {
	return digest{maphash.String(s.seeds[0], key), maphash.String(s.seeds[1], key)}
}

func (s *Store) shard(d digest) *storeShard {
	return &s.shards[d[0]&(storeShards-1)]
}

// allow answers one request.
func (s *Store) allow(now time.Duration, req *Request) Result {
	d := s.digest(req.Key)
	sh := s.shard(d)
	sh.mu.RLock()
	m := sh.m[d]
	if m != nil && matches(m, req) {
		// The read lock keeps Sweep and eviction from removing the counter
		// while hits go in, so no admitted hit is lost with it.
		r := admit(m, now, req)
		s.addGrowth(m)
		sh.mu.RUnlock()
		return r
	}
	sh.mu.RUnlock()
	// Nothing is counted for this key: answer checks and requests that no
	// window can take without creating a counter (unless they are charged
	// all the same).
	if limit := min(req.Limit, MaxLimit); req.Hits == 0 {
		return Result{Allowed: limit > 0, Remaining: limit}
	} else if req.Hits > limit && !req.ChargeAlways {
		return Result{Remaining: limit, Reset: req.Spec.Length()}
	}

	sh.mu.Lock()
	defer sh.mu.Unlock()
	old := sh.m[d]
	if old != nil && matches(old, req) {
		r := admit(old, now, req)
		s.addGrowth(old)
		return r
	}
	m = newMeter(req.Spec, req.Algorithm)
	r := admit(m, now, req)
	if g, ok := m.(grower); ok {
		g.takeGrowth() // in the footprint already
	}
	charge := entryBytes + m.footprint()
	if old != nil {
		charge -= entryBytes + old.footprint()
		s.replaced.Add(1)
	} else if s.maxKeys > 0 && s.keys.Load() >= s.maxKeys {
		s.makeRoom(sh, now)
	}
	// Evict until the new counter fits. Each key is evicted at most once
	// after being created once, so the evictions cost O(1) per new key
	// amortised, though one large key (a sliding log) may evict many
	// small ones.
	for s.maxBytes > 0 && s.bytes.Load()+charge > s.maxBytes && s.makeRoom(sh, now) {
	}
	sh.m[d] = m
	s.bytes.Add(charge)
	if old == nil {
		sh.peak = max(sh.peak, len(sh.m))
		s.keys.Add(1)
	}
	return r
}

// admit answers req on its counter m: AcquireAt with its holder for a
// Concurrency request, ChargeAt for an always-charged request (DoAt checked
// that m serves it), AllowAt otherwise.
func admit(m meter, now time.Duration, req *Request) Result {
	if l, ok := m.(*LeaseCounter); ok {
		return l.AcquireAt(now, HolderID(req.Holder), req.Hits, req.Limit)
	}
	if req.ChargeAlways {
		if c, ok := m.(charger); ok {
			return c.ChargeAt(now, req.Hits, req.Limit)
		}
	}
	return m.AllowAt(now, req.Hits, req.Limit)
}

// refund answers a Negative request: its hits are taken back from the
// key's counter, if it has one with the request's layout.
func (s *Store) refund(now time.Duration, req *Request) Result {
	d := s.digest(req.Key)
	sh := s.shard(d)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	if m := sh.m[d]; m != nil && matches(m, req) {
		var r Result
		if l, ok := m.(*LeaseCounter); ok {
			l.ReleaseAt(now, HolderID(req.Holder), req.Hits)
			r = l.AcquireAt(now, 0, 0, req.Limit)
		} else {
			r = m.refund(now, req.Hits, req.Limit)
		}
		s.addGrowth(m)
		return r
	}
	limit := min(req.Limit, MaxLimit)
	return Result{Allowed: limit > 0, Remaining: limit}
}

// addGrowth adds to the accounted bytes the change in m's footprint since
// the last call, for a meter whose footprint changes (see grower): a
// SlidingLog's or a Concurrency one's, the algorithms checked first so that
// the others' calls cost no interface assertion.
func (s *Store) addGrowth(m meter) {
	switch m.(type) {
	case *LogCounter, *LeaseCounter:
		s.bytes.Add(m.(grower).takeGrowth())
	}
}

// matches reports whether m is the counter req's Spec and Algorithm call
// for. Only TimeBuckets counters have buckets; the others are bound to the
// window length alone.
func matches(m meter, req *Request) bool {
	spec, alg := m.layout()
	if alg != req.Algorithm {
		return false
	}
	if alg == TimeBuckets {
		return spec == req.Spec
	}
	return spec.length == req.Spec.length
}

// undo takes back hits of req recorded in bucket, if req's counter is
// still the one they were recorded in.
func (s *Store) undo(req *Request, bucket int64) {
	d := s.digest(req.Key)
	sh := s.shard(d)
	sh.mu.RLock()
	if m := sh.m[d]; m != nil && matches(m, req) {
		if l, ok := m.(*LeaseCounter); ok {
			l.undoAt(bucket, HolderID(req.Holder), req.Hits)
		} else {
			m.undo(bucket, req.Hits, req.Limit)
		}
		s.addGrowth(m)
	}
	sh.mu.RUnlock()
}
