package window

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"
)

// model is the BucketCounter's specification, written plainly: a map from bucket
// epoch to count, every bucket from e-k to e counted in full.
type model struct {
	k, b   int64
	latest int64
	counts map[int64]uint64
}

func newModel(spec Spec) *model {
	return &model{k: spec.buckets, b: spec.length / spec.buckets, counts: map[int64]uint64{}}
}

func (m *model) advance(now time.Duration) int64 {
	m.latest = max(m.latest, int64(max(now, 0))/m.b)
	for x := range m.counts {
		if x <= m.latest-m.k-1 {
			delete(m.counts, x)
		}
	}
	return m.latest
}

func (m *model) sum() (s uint64) {
	for _, c := range m.counts {
		s += c
	}
	return s
}

func (m *model) ageOut(now time.Duration, x int64) time.Duration {
	return max(0, time.Duration((x+m.k+1)*m.b)-now)
}

func (m *model) allow(now time.Duration, n, limit uint64) Result {
	limit = min(limit, MaxLimit)
	e := m.advance(now)
	s := m.sum()
	r := Result{Remaining: limit - min(s, limit)}
	if n == 0 && s < limit {
		r.Allowed = true
		for x := e; x >= e-m.k; x-- {
			if m.counts[x] > 0 {
				r.Reset = m.ageOut(now, x)
				break
			}
		}
		return r
	}
	need := max(n, 1)
	if s+need > limit {
		if need > limit {
			r.Reset = time.Duration(m.k * m.b)
			return r
		}
		var freed uint64
		for x := e - m.k; x <= e; x++ {
			freed += m.counts[x]
			if s-freed+need <= limit {
				r.Reset = m.ageOut(now, x)
				break
			}
		}
		return r
	}
	m.counts[e] += n
	return Result{Allowed: true, Recorded: true, Remaining: limit - s - n, Reset: m.ageOut(now, e), Bucket: e}
}

func (m *model) undo(bucket int64, n uint64) {
	if c, ok := m.counts[bucket]; ok {
		m.counts[bucket] = c - min(c, n)
	}
}

func (m *model) refund(now time.Duration, n uint64) {
	e := m.advance(now)
	for x := e; x >= e-m.k && n > 0; x-- {
		sub := min(m.counts[x], n)
		m.counts[x] -= sub
		n -= sub
	}
}

// checkAgainstModel drives a BucketCounter and the model with the operations
// encoded in ops, from the time start on, and fails at the first
// difference.
func checkAgainstModel(t *testing.T, k int, start time.Duration, ops []byte) {
	spec := mustSpec(t, time.Duration(k)*10*time.Millisecond, k)
	c, m := NewBucketCounter(spec), newModel(spec)
	now := start
	var buckets []int64
	for len(ops) >= 4 {
		op, arg, n := ops[0]%8, binary.LittleEndian.Uint16(ops[1:3]), uint64(ops[3]%8)
		ops = ops[4:]
		limit := uint64(arg%24) + n/2 // sometimes below n
		switch op {
		case 0, 1, 2: // time moves forward a little
			now += time.Duration(arg) * 37 * time.Microsecond
		case 3: // clock steps back
			now -= time.Duration(arg) * 53 * time.Microsecond
		case 4: // undo a recorded bucket
			if len(buckets) > 0 {
				b := buckets[int(arg)%len(buckets)]
				c.UndoAt(b, n)
				m.undo(b, n)
			}
			continue
		case 5:
			c.RefundAt(now, n)
			m.refund(now, n)
			continue
		}
		got, want := c.AllowAt(now, n, limit), m.allow(now, n, limit)
		if !got.Recorded {
			got.Bucket = 0
		}
		if got != want {
			t.Fatalf("k=%d now=%v AllowAt(%d, limit %d) = %+v, model %+v", k, now, n, limit, got, want)
		}
		if got.Recorded {
			buckets = append(buckets, got.Bucket)
		}
		if cnt, s := c.CountAt(now), m.sum(); cnt != s {
			t.Fatalf("k=%d now=%v: count %d, model %d", k, now, cnt, s)
		}
	}
}

// TestBucketCounterMatchesModel runs random operations from epoch 0 and
// from epochs whose 32-bit slot tags sit just below 2^31 and 2^32 (and 3
// times 2^31), where serial comparisons of tags wrap: the counter answers
// as the model does wherever its epochs fall.
func TestBucketCounterMatchesModel(t *testing.T) {
	for _, epoch := range []int64{0, 1<<31 - 50, 1<<32 - 50, 3<<31 - 50} {
		for _, k := range []int{1, 2, 3, 10, 20} {
			rng := rand.New(rand.NewPCG(uint64(k), 99))
			for range 50 {
				ops := make([]byte, 4*400)
				for i := range ops {
					ops[i] = byte(rng.Uint32())
				}
				checkAgainstModel(t, k, time.Duration(epoch)*10*time.Millisecond, ops)
			}
		}
	}
}

func FuzzBucketCounterMatchesModel(f *testing.F) {
	f.Add(uint8(10), []byte{0, 1, 0, 3, 3, 200, 0, 1, 0, 0, 0, 7, 4, 0, 0, 2, 5, 0, 0, 5})
	f.Add(uint8(1), []byte{1, 255, 255, 7, 0, 0, 0, 1, 3, 255, 255, 1})
	f.Fuzz(func(t *testing.T, k uint8, ops []byte) {
		checkAgainstModel(t, int(k%30)+1, 0, ops)
	})
}
