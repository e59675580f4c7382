package redisstore

import (
	"crypto/rand"
	"encoding/binary"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leapgate/leapgate/window"
)

// Reservations (Options.Reservation): a replica takes a block of a busy
// sliding window's quota from Redis and spends it locally, so that a key
// far from its limit costs Redis one script call per block rather than one
// per request. The rules that keep every window within the limit are in
// lua/sliding_window.lua (SlidingWindow.reserve):
//
//   - a block counts in Redis, in full, from the moment it is granted;
//   - the replica spends it only until its deadline, the time the request
//     for it was sent plus the validity V (so before the grant's time plus
//     V, by Redis's clock, whatever the replicas' clocks say), and settles
//     it before Redis's exp (the grant's time plus V and a grace): the hits
//     it spent are then recorded at the time of the newest of them (the
//     replica sends how long ago that was, measured on its own clock up to
//     the sending, so Redis's time minus it is no earlier), never later
//     than the grant's time plus V, and the rest is given back; a block not
//     settled by then is taken as spent in full, at the grant's time plus
//     V; so how late a settling runs costs no capacity;
//   - blocks are only for keys far from their limit: a grant (or a
//     top-up's growth) is made only if the demand it is sized for, over a
//     whole window, from this replica and every other that holds a block,
//     fits in what the limit has left (so a burst that would reach the
//     limit, or steady traffic near it, goes to Redis hit by hit, as
//     without blocks); it takes at most an eighth of what is left, so
//     blocks shrink to nothing as a key approaches its limit; and a held
//     block that would keep more than an eighth of what is left besides it
//     is cut: not renewed, and given back at once.
//
// The block's size follows the key's demand on this replica: twice the hits
// asked in the last validity, so that an idle replica strands little. A
// first block is asked for only once the key has been busy on this replica
// for a whole validity, so that a burst shorter than that (a cron job) is
// never taken for steady demand and never left holding hits it no longer
// needs. A block is topped up (the hits spent settled, more granted, the
// deadline moved on) when a quarter of it is left or its deadline is an
// eighth of V away, without a pause in local answers; a block left idle
// for half of V is given back whole.

// DefaultReservationKeys is Options.ReservationKeys when it is 0.
const DefaultReservationKeys = 100_000

// reservationShares is how many validities a counter's window holds at
// least: V is at most W/reservationShares. A hit spent from a block is
// recorded at the newest hit the block spent before its settling, up to V
// after it was spent, so it may count up to V longer than it would have: at
// most a 32nd of a window (TestReservationsNeverOvershootAWindow and
// TestBlocksCostCronNothing measure what blocks cost against an exact log).
const reservationShares = 32

// reserver is a Store's table of blocks, by counter key.
type reserver struct {
	s        *Store
	validity time.Duration
	maxKeys  int // per shard
	// base numbers this replica's blocks (see nextHolder): each block its
	// own holder in Redis (an orphaned block never meets a later one).
	base float64
	seq  atomic.Uint64

	// closing stops new calls once the Store closes (see close).
	closing atomic.Bool

	// shards hold the blocks by counter key, each under its own lock, so
	// that a sweep holds up one shard's requests at a time.
	seed   maphash.Seed
	shards [reserveShards]shard
	// queue carries the keys whose block is to be asked for, topped up or
	// given back (each at most once: block.pending).
	queue chan string
}

// reserveShards is the number of shards of a reserver's table.
const reserveShards = 64

// shard is one part of a reserver's table.
type shard struct {
	mu   sync.Mutex
	keys map[string]*block
}

// shardIndex is the index of key's shard.
func (rv *reserver) shardIndex(key string) int {
	return int(maphash.String(rv.seed, key) % reserveShards)
}

// shard returns key's shard.
func (rv *reserver) shard(key string) *shard { return &rv.shards[rv.shardIndex(key)] }

// block is this replica's reservation on one counter, and the demand that
// sizes it.
type block struct {
	spec  window.Spec
	limit uint64
	// holder names the block in Redis (0: none held).
	holder float64
	// avail is what may still be spent; spent is what was spent since the
	// last settling was sent.
	avail, spent uint64
	// remaining is what the limit had left beside every block, as of
	// Redis's stamp remainingAt (µs; see noteRemaining).
	remaining   uint64
	remainingAt int64
	grantedAt   int64         // Redis time of the grant, µs
	deadline    time.Duration // local clock: spend only before it
	// pending: a call for this block is queued or in flight; giveBack:
	// that call gives the block back (nothing is spent meanwhile).
	pending, giveBack bool
	// lastUse is when the block last answered (or was asked for);
	// lastSpent when it last answered hits, so no earlier than any of
	// spent (Redis records them at that time).
	lastUse, lastSpent time.Duration
	// seen is when a request for the key last went to Redis; demand the
	// hits asked since since.
	seen, since time.Duration
	demand      uint64
	// retryAt: Redis granted nothing (the key is near its limit); no block
	// is asked for before then.
	retryAt time.Duration
}

// newReserver returns the table of s, or nil when reservations are off.
func newReserver(s *Store, validity time.Duration, maxKeys int) *reserver {
	if validity <= 0 {
		return nil
	}
	if maxKeys <= 0 {
		maxKeys = DefaultReservationKeys
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	rv := &reserver{
		s: s, validity: validity, maxKeys: max(maxKeys/reserveShards, 1),
		base:  float64(binary.LittleEndian.Uint32(b[:])) * holderIDs,
		seed:  maphash.MakeSeed(),
		queue: make(chan string, 4*maxBatchCalls),
	}
	for i := range rv.shards {
		rv.shards[i].keys = map[string]*block{}
	}
	return rv
}

// holderIDs is how many holder ids a replica numbers its blocks with
// before it uses one again.
const holderIDs = 1 << 20

// nextHolder returns the holder id of a new block: base plus 1 to
// holderIDs. base is a random multiple of holderIDs, so replicas (unless
// they drew the same base) never share an id, and one replica repeats an
// id only after holderIDs blocks. Every id is a whole number below 2^53,
// exact as a float64 and as a Lua number.
func (rv *reserver) nextHolder() float64 {
	return rv.base + float64(rv.seq.Add(1)%holderIDs+1)
}

// validFor is the validity of blocks of a counter of spec.
func (rv *reserver) validFor(spec window.Spec) time.Duration {
	return min(rv.validity, spec.Length()/reservationShares)
}

// eligible reports whether r may be answered from a block: a sliding
// window's check or hits, while no local-failure-mode hits are in its
// window (Redis does not know them, see withLocalHits).
func (rv *reserver) eligible(r *window.Request, now time.Duration) bool {
	if r.Algorithm != window.SlidingWindow || r.Negative || r.ChargeAlways || r.Hits > window.MaxLimit {
		return false
	}
	last := rv.s.lastLocal.Load()
	return last == 0 || now-time.Duration(last) >= r.Spec.Length()
}

// take answers reqs from this replica's blocks into results, all or none:
// it reports false (and spends nothing) unless every request is eligible
// and its key's block has room for it before its deadline.
func (rv *reserver) take(reqs []window.Request, keys []string, now time.Duration, results []window.Result) bool {
	// Lock every shard the batch touches, in order.
	var held [8]int
	locked := held[:0]
	for _, k := range keys {
		if i := rv.shardIndex(k); !slices.Contains(locked, i) {
			locked = append(locked, i)
		}
	}
	slices.Sort(locked)
	for _, i := range locked {
		rv.shards[i].mu.Lock()
	}
	defer func() {
		for _, i := range locked {
			rv.shards[i].mu.Unlock()
		}
	}()
	blocks := make([]*block, 0, 8) // on the stack for batches of up to 8
	for i := range reqs {
		r, b := &reqs[i], rv.shard(keys[i]).keys[keys[i]]
		if b == nil || !rv.eligible(r, now) || !b.spendable(r, now) {
			return false
		}
		blocks = append(blocks, b)
	}
	// Spend, checking the room that earlier requests of the batch left.
	for i := range reqs {
		r, b := &reqs[i], blocks[i]
		if need(r.Hits) > b.avail {
			for j := range i {
				blocks[j].avail += reqs[j].Hits
				blocks[j].spent -= reqs[j].Hits
			}
			return false
		}
		b.avail -= r.Hits
		b.spent += r.Hits
	}
	for i := range reqs {
		r, b := &reqs[i], blocks[i]
		b.lastUse = now
		if r.Hits > 0 {
			b.lastSpent = now
		}
		b.demand += r.Hits
		results[i] = window.Result{
			Allowed:   true,
			Recorded:  r.Hits > 0,
			Remaining: b.remaining + b.avail,
			// Every hit counted ages out within a window of the block's
			// settling, at its deadline at the latest.
			Reset:  r.Spec.Length() + b.deadline - now,
			Bucket: blockBucket(b.grantedAt),
		}
		if v := rv.validFor(b.spec); !b.pending && (b.avail < b.want(v, now)/4 || b.deadline-now < v/8) {
			rv.enqueue(keys[i], b, false)
		}
	}
	return true
}

// spendable reports whether b may answer r at now (room is checked by
// take).
func (b *block) spendable(r *window.Request, now time.Duration) bool {
	return b.holder != 0 && !b.giveBack && now < b.deadline && b.limit == min(r.Limit, window.MaxLimit) && b.spec == r.Spec
}

// want is the block b should hold: twice the hits asked per validity v
// since the last call, at least the script's smallest grant.
func (b *block) want(v, now time.Duration) uint64 {
	elapsed := max(now-b.since, v/8, time.Microsecond)
	w := uint64(math.Ceil(2 * float64(b.demand) * float64(v) / float64(elapsed)))
	return max(w, resMin)
}

// farFromLimit reports whether a key whose limit has remaining left could
// get a block of want hits valid for v on a window of w (the script's
// test, for this replica alone): the demand the block stands for, want
// per two v, over a window, fits in what is left, and an eighth of that
// is at least the smallest grant.
func farFromLimit(remaining, want uint64, w, v time.Duration) bool {
	return remaining/8 >= resMin && float64(want)*float64(w)/float64(v) <= 2*float64(remaining)
}

// resMin is the smallest block the script grants (RES_MIN in
// lua/sliding_window.lua).
const resMin = 4

// sawRemote notes the requests reqs[idx] that Redis answered (results):
// a key asked for twice within the validity, whose demand over at least
// one validity leaves room for a block, gets one, and a held block that
// could not answer is topped up.
func (rv *reserver) sawRemote(reqs []window.Request, results []window.Result, keys []string, idx []int, now time.Duration) {
	for _, i := range idx {
		if r := &reqs[i]; rv.eligible(r, now) {
			sh := rv.shard(keys[i])
			sh.mu.Lock()
			rv.sawOne(sh, r, &results[i], keys[i], now)
			sh.mu.Unlock()
		}
	}
}

// sawOne is sawRemote for one request r and its result res; sh, key's
// shard, is locked.
func (rv *reserver) sawOne(sh *shard, r *window.Request, res *window.Result, key string, now time.Duration) {
	b := sh.keys[key]
	if b == nil {
		if len(sh.keys) < rv.maxKeys {
			sh.keys[key] = &block{since: now, seen: now, demand: r.Hits}
		}
		return
	}
	v := rv.validFor(r.Spec)
	// After a pause of a validity (no request to Redis or to the block)
	// the key's demand is measured afresh: a burst after it is not
	// averaged with the quiet time before it.
	paused := now-max(b.seen, b.lastUse) >= v
	if paused {
		b.demand, b.since = 0, now
	}
	b.demand += r.Hits
	b.seen = now
	if b.holder != 0 {
		// Redis's answer excludes the whole block, which the block's own
		// answers add back.
		b.noteRemaining(res.Remaining, res.Bucket/timeBucket)
	}
	switch {
	case b.pending:
	case paused:
		if b.holder != 0 {
			// Its deadline has passed (a validity after its last
			// use): given back, not topped up; a new block waits
			// for demand measured from now.
			rv.enqueue(key, b, true)
		}
	case b.holder != 0:
		if !b.spendable(r, now) || b.avail < need(r.Hits) {
			b.spec, b.limit = r.Spec, min(r.Limit, window.MaxLimit)
			rv.enqueue(key, b, false)
		}
	case now >= b.retryAt && now-b.since >= v && farFromLimit(res.Remaining, b.want(v, now), r.Spec.Length(), v):
		b.spec, b.limit = r.Spec, min(r.Limit, window.MaxLimit)
		rv.enqueue(key, b, false)
	}
}

// noteRemaining takes remaining, what Redis's answer stamped at (its time,
// µs) says the limit has left beside every block, unless b holds a fresher
// one: answers reach the replica in any order, so the newest stamp wins
// and, of answers of one stamp, the lowest (between them hits were only
// counted, none aged out).
func (b *block) noteRemaining(remaining uint64, at int64) {
	if at > b.remainingAt || at == b.remainingAt && remaining < b.remaining {
		b.remaining, b.remainingAt = remaining, at
	}
}

// enqueue queues a call for key's block: a top-up, or with giveBack its
// return. Its shard's lock is held.
func (rv *reserver) enqueue(key string, b *block, giveBack bool) {
	if rv.closing.Load() {
		return
	}
	select {
	case rv.queue <- key:
		b.pending, b.giveBack = true, giveBack
	default: // full: the next request or sweep asks again
	}
}

// blockBucket is the Result.Bucket of hits a block answered: the grant's
// time in ns plus one, which no answer of Redis's has (theirs are whole
// microseconds), so that Undo knows them.
func blockBucket(grantedAt int64) int64 { return grantedAt*timeBucket + 1 }

// isBlockBucket reports whether bucket is a blockBucket.
func isBlockBucket(bucket int64) bool { return bucket > 0 && bucket%timeBucket == 1 }

// undo takes back hits a block answered (a Result.Bucket of blockBucket)
// into the block, if it is still held and not being settled; otherwise
// they stay counted (they were, or will be, settled as spent: taking them
// from Redis's counter could take another replica's newer hits instead).
func (rv *reserver) undo(key string, r *window.Request, res *window.Result) {
	sh := rv.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b := sh.keys[key]
	if b == nil || b.holder == 0 || b.pending || res.Bucket != blockBucket(b.grantedAt) || b.spent < r.Hits {
		return
	}
	b.spent -= r.Hits
	b.avail += r.Hits
}
