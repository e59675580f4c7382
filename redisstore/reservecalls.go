package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"time"

	"github.com/leapgate/leapgate/window"
)

// The calls for blocks of quota (see reserve.go): asking for a block,
// topping it up and giving it back, sent off the request path by the
// reserver's own goroutine, several per round trip.

// run sends the queued calls, several per round trip, and sweeps the
// table every eighth of the validity, until ctx is done.
func (rv *reserver) run(ctx context.Context) {
	tick := time.NewTicker(rv.sweepEvery())
	defer tick.Stop()
	keys := make([]string, 0, maxBatchCalls)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			rv.sweep(rv.s.clock.Now())
			continue
		case k := <-rv.queue:
			keys = rv.drain(append(keys[:0], k))
		}
		rv.send(ctx, keys)
	}
}

// drain appends to keys the keys waiting in the queue, without waiting,
// until keys holds maxBatchCalls (the most one round trip carries).
func (rv *reserver) drain(keys []string) []string {
	for len(keys) < maxBatchCalls {
		select {
		case k := <-rv.queue:
			keys = append(keys, k)
		default:
			return keys
		}
	}
	return keys
}

// sweepEvery is the period of the sweep.
func (rv *reserver) sweepEvery() time.Duration { return max(rv.validity/8, time.Millisecond) }

// grace is how long after its deadline a block of validity v may be
// settled before Redis takes it as spent in full: v, or two sweeps if
// longer (blocks of short windows have a V under the sweep's period), so
// that an idle block is given back before then.
func (rv *reserver) grace(v time.Duration) time.Duration { return max(v, 2*rv.sweepEvery()) }

// sweep gives back the blocks idle for half their validity or past their
// deadline, tops up the busy ones within an eighth of it, and forgets keys
// idle for a few validities.
func (rv *reserver) sweep(now time.Duration) {
	for i := range rv.shards {
		sh := &rv.shards[i]
		sh.mu.Lock()
		for key, b := range sh.keys {
			if b.pending {
				continue
			}
			v := rv.validity
			if b.holder != 0 {
				v = rv.validFor(b.spec)
			}
			switch {
			case b.holder != 0 && (now-b.lastUse >= v/2 || now >= b.deadline):
				rv.enqueue(key, b, true)
			case b.holder != 0 && b.deadline-now < v/8:
				rv.enqueue(key, b, false)
			case b.holder == 0 && now-b.seen >= 4*v:
				delete(sh.keys, key)
			}
		}
		sh.mu.Unlock()
	}
}

// callAt is what b's queued call is when it is sent at now (v its
// validity): a give-back when one was asked for; when the key has gone
// idle (no request for half of v) while the call waited (a slow round
// trip, a starved goroutine), no call if no block is held (none is
// wanted now) and a give-back if one is (it is not renewed for nobody);
// else the top-up (or first grant) asked for.
func (b *block) callAt(now, v time.Duration) (send, giveBack bool) {
	switch {
	case b.giveBack:
		return true, true
	case now-max(b.seen, b.lastUse) >= v/2:
		return b.holder != 0, true
	}
	return true, false
}

// reservation is one queued call as sent.
type reservation struct {
	key      string
	b        *block
	holder   float64
	used     float64 // -1: a new block
	want     uint64
	giveBack bool
	sent     time.Duration
	// age is how long before sent the newest of the used hits was spent.
	age time.Duration
}

// send asks Redis for every key's block in one job (one script call per
// slot), and applies the answers.
func (rv *reserver) send(ctx context.Context, keys []string) {
	now := rv.s.clock.Now()
	ops := make([]reservation, 0, len(keys))
	calls := make([]call, 0, len(keys))
	for _, k := range keys {
		sh := rv.shard(k)
		sh.mu.Lock()
		b := sh.keys[k]
		if b == nil || !b.pending {
			sh.mu.Unlock()
			continue
		}
		v := rv.validFor(b.spec)
		send, giveBack := b.callAt(now, v)
		if !send {
			b.pending = false
			sh.mu.Unlock()
			continue
		}
		b.giveBack = giveBack
		op := reservation{key: k, b: b, holder: b.holder, used: float64(b.spent), giveBack: b.giveBack, sent: now}
		if b.spent > 0 {
			op.age = max(now-b.lastSpent, 0)
		}
		if b.holder == 0 {
			op.holder, op.used = rv.nextHolder(), -1
		}
		if !op.giveBack {
			op.want = b.want(v, now)
		}
		b.spent = 0
		b.demand, b.since = 0, now
		ops = append(ops, op)
		calls = append(calls, rv.s.reserveCall(k, b.spec, b.limit, op.holder, op.used, op.age, op.want, v, rv.grace(v)))
		sh.mu.Unlock()
	}
	if len(ops) == 0 {
		return
	}
	err := rv.s.runReserve(ctx, calls)
	for i := range ops {
		sh := rv.shard(ops[i].key)
		sh.mu.Lock()
		rv.apply(&ops[i], &calls[i], err, now)
		sh.mu.Unlock()
	}
}

// apply applies the answer c (or err) to op, its block's shard locked;
// now is when the calls were sent.
func (rv *reserver) apply(op *reservation, c *call, err error, now time.Duration) {
	b := op.b
	b.pending, b.giveBack = false, false
	if errors.Is(err, ErrUnavailable) {
		// Not sent (Redis is down): the block stands as it was.
		b.spent += uint64(max(op.used, 0))
		return
	}
	if err != nil || len(c.vals) != 5 {
		// Unknown whether Redis settled it: spend no more, and give
		// it back once Redis answers, with every hit spent since the
		// last settling known to Redis (recording them twice, if this
		// call did reach Redis, only costs capacity; Redis takes an
		// unsettled block as spent in full at its exp anyway).
		rv.s.metrics.reservations.WithLabelValues("failed").Inc()
		if op.used < 0 {
			b.holder, b.remainingAt = 0, 0 // never granted, or orphaned: Redis's exp covers it
		} else {
			b.spent += uint64(op.used)
		}
		b.avail, b.deadline = 0, 0
		return
	}
	v := c.vals
	status, total := v[0], uint64(v[1])
	switch {
	case op.giveBack || total == 0:
		rv.s.metrics.reservations.WithLabelValues("returned").Inc()
		b.holder, b.avail, b.spent, b.remainingAt = 0, 0, 0, 0
		b.retryAt = now + rv.validFor(b.spec)
		return
	case status == resCut:
		// The key came near its limit (the block would keep more than
		// an eighth of what is left): Redis kept it as it was (its
		// deadline stands) and it goes back at once, with the hits spent
		// meanwhile.
		rv.s.metrics.reservations.WithLabelValues("cut").Inc()
		b.avail = total - min(b.spent, total)
		b.remaining = uint64(v[2])
		rv.enqueue(op.key, b, true)
		return
	case status == resRenewed:
		// The block Redis holds covers the hits spent while the call
		// was in flight: they are settled next time.
		rv.s.metrics.reservations.WithLabelValues("renewed").Inc()
		b.avail = total - min(b.spent, total)
	default:
		// A new block; or Redis took the old one as spent in full,
		// which covers the hits spent in flight.
		rv.s.metrics.reservations.WithLabelValues("granted").Inc()
		b.avail, b.spent = total, 0
	}
	b.holder, b.grantedAt = op.holder, v[4]
	b.noteRemaining(uint64(v[2]), v[4])
	b.deadline = op.sent + rv.validFor(b.spec)
	b.lastUse = max(b.lastUse, op.sent)
}

// close gives back every block held, before the Store closes: it stops
// asking for blocks, waits (up to the Store's timeout) for the calls in
// flight, then gives back what is held, in as few jobs as it can.
func (rv *reserver) close(ctx context.Context) {
	rv.closing.Store(true)
	pending := func() bool {
		for i := range rv.shards {
			sh := &rv.shards[i]
			sh.mu.Lock()
			for _, b := range sh.keys {
				if b.pending {
					sh.mu.Unlock()
					return true
				}
			}
			sh.mu.Unlock()
		}
		return false
	}
	for wait := time.Now().Add(rv.s.timeout); pending() && time.Now().Before(wait); {
		time.Sleep(time.Millisecond)
	}
	var keys []string
	for i := range rv.shards {
		sh := &rv.shards[i]
		sh.mu.Lock()
		for k, b := range sh.keys {
			if b.holder != 0 && !b.pending {
				b.pending, b.giveBack = true, true
				keys = append(keys, k)
			}
		}
		sh.mu.Unlock()
	}
	for len(keys) > 0 {
		n := min(len(keys), maxBatchCalls)
		rv.send(ctx, keys[:n])
		keys = keys[n:]
	}
}

// The status of a reservation's answer (SlidingWindow.reserve's RES_*),
// when it is not 0 (the block was not held: a new one, or one Redis lost
// or took as spent): held and renewed, or held and cut (not renewed, the
// key being near its limit: to be given back at once).
const (
	resRenewed = 1
	resCut     = 2
)

// reserveCall is the allow-script group of one reservation of key (a
// counter key) on a sliding window of spec and limit: see
// SlidingWindow.reserve in lua/sliding_window.lua. used hits were spent,
// the newest of them age ago (rounded down to a microsecond, so never
// taken as older than it is).
func (s *Store) reserveCall(key string, spec window.Spec, limit uint64, holder, used float64, age time.Duration, want uint64, validity, grace time.Duration) call {
	req := window.Request{Spec: spec, Limit: limit}
	packed := packArgs(nil, &req)
	packed[len(packed)-1] |= 4
	for _, v := range []float64{holder, used, float64(want), float64(validity / time.Microsecond), float64(grace / time.Microsecond), float64(age / time.Microsecond)} {
		packed = binary.LittleEndian.AppendUint64(packed, math.Float64bits(v))
	}
	c := call{keys: []string{key}, args: []any{1, "0", packed}}
	if s.cluster {
		c.slot = keySlot(key)
	}
	return c
}

// runReserve sends calls (reserveCall's) in one job, bounded by the
// Store's timeout; each call's vals then holds its 5 integers.
func (s *Store) runReserve(ctx context.Context, calls []call) error {
	if s.state.Load() == stateDown {
		return ErrUnavailable
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_, err := s.timed(ctx, "reserve", &job{script: allowScript, calls: calls, merged: true, now: s.nowArg()})
	return err
}
