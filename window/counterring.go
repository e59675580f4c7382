package window

import "encoding/binary"

// The ring of a Counter: its capacity, the stamps of its closed blocks
// (16-bit ticks, or full times for an exact log), and the size cycle of
// the blocks.

// exact reports whether the ring holds full times (an exact log).
func (c *Counter) exact() bool { return c.quota < Blocks }

// slots is the ring's capacity in closed blocks.
func (c *Counter) slots() int {
	if c.exact() {
		return ExactLimit
	}
	return Blocks
}

// stamp returns the time (ns) of the block in ring slot j: its full time,
// or its tick lifted against anchor, in ns.
func (c *Counter) stamp(j int, anchor int64) int64 {
	if c.exact() {
		return int64(binary.LittleEndian.Uint64(c.ring[8*j:]))
	}
	return c.lift(binary.LittleEndian.Uint16(c.ring[2*j:]), anchor) * c.tick
}

// setStamp stamps the block in ring slot j with time t (ns), whose tick is
// tick: in full, or as the tick.
func (c *Counter) setStamp(j int, t, tick int64) {
	if c.exact() {
		binary.LittleEndian.PutUint64(c.ring[8*j:], uint64(t))
		return
	}
	binary.LittleEndian.PutUint16(c.ring[2*j:], uint16(tick))
}

// stampTick returns the tick of the block in ring slot j (its time rounded
// up to a tick, for an exact log), 16 bits of it.
func (c *Counter) stampTick(j int) uint16 {
	if c.exact() {
		return uint16(c.absTick(int64(binary.LittleEndian.Uint64(c.ring[8*j:]))))
	}
	return binary.LittleEndian.Uint16(c.ring[2*j:])
}

// filled is the hits of the blocks of slots 0 .. x-1 of the size cycle
// (x < 2*slots; slot x stands for ring slot x mod slots): floor(x*q/Blocks),
// q being at least Blocks (an exact log has blocks of one hit).
func (c *Counter) filled(x int) uint64 { return uint64(x) * uint64(max(c.quota, Blocks)) / Blocks }

// size is the hits of the block in slot x of the size cycle.
func (c *Counter) size(x int) uint64 { return c.filled(x+1) - c.filled(x) }

// absTick is t rounded up to a whole tick, in ticks.
func (c *Counter) absTick(t int64) int64 { return (t + c.tick - 1) / c.tick }

// lift turns a 16-bit tick into the full tick at or before anchor that it
// stands for.
func (c *Counter) lift(tick uint16, anchor int64) int64 {
	return anchor - int64(uint16(anchor)-tick)
}

// index is the ring position of the i-th oldest closed block.
func (c *Counter) index(i int) int {
	j := int(c.head) + i
	if n := c.slots(); j >= n {
		j -= n
	}
	return j
}
