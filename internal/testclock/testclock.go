// Package testclock is the one test clock of Leapgate's tests: a
// window.Clock (Now returns a Duration since an origin) that moves only when
// told, so time-based behaviour is tested without sleeping.
package testclock

import (
	"sync/atomic"
	"time"
)

// Clock reads the time last set, plus Tick for every earlier call of Now.
// Its zero value reads 0 and does not tick. It is safe for concurrent use;
// Tick is set before the clock is shared.
type Clock struct {
	now atomic.Int64
	// Tick, when set, moves the clock forward by Tick on every Now, before
	// reading it (for code that must see time pass between calls).
	Tick time.Duration
}

// At returns a Clock that reads t.
func At(t time.Duration) *Clock {
	c := &Clock{}
	c.Set(t)
	return c
}

// Now returns the clock's time, first moving it Tick forward.
func (c *Clock) Now() time.Duration {
	if c.Tick != 0 {
		return time.Duration(c.now.Add(int64(c.Tick)))
	}
	return time.Duration(c.now.Load())
}

// Set moves the clock to t, backwards too.
func (c *Clock) Set(t time.Duration) { c.now.Store(int64(t)) }

// Advance moves the clock d forward (backward for a negative d).
func (c *Clock) Advance(d time.Duration) { c.now.Add(int64(d)) }
