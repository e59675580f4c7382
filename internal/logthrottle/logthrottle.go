// Package logthrottle keeps a repeated warning from flooding the log: a
// Throttle writes a line at most once per Interval and says how many it held
// back in between.
package logthrottle

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Interval is the least time between two lines of one Throttle.
const Interval = 5 * time.Second

// Throttle writes a warning at most once per Interval; the lines it holds
// back in between are counted, and the next line written carries the count
// as "suppressed". A failing backend under load so logs a line every few
// seconds instead of one per request. The zero value is ready to use, and a
// Throttle is safe for concurrent use.
type Throttle struct {
	// Now reads the time; if nil, time.Now.
	Now func() time.Time

	mu         sync.Mutex   // held by the one call that writes a line
	last       atomic.Int64 // unix nanoseconds of the last line written; 0: none yet
	suppressed atomic.Int64 // lines held back since
}

// Warn writes msg with args to logger at warn level, unless a line was
// written less than Interval ago, in which case it only counts it.
func (t *Throttle) Warn(logger *slog.Logger, msg string, args ...any) {
	clock := t.Now
	if clock == nil {
		clock = time.Now
	}
	now := clock().UnixNano()
	if t.holds(now) { // the common case under a flood: no lock
		t.suppressed.Add(1)
		return
	}
	t.mu.Lock()
	if t.holds(now) {
		t.mu.Unlock()
		t.suppressed.Add(1)
		return
	}
	// Take the count before the line's time is set: a call held back from
	// then on counts toward the next line, not this one.
	n := t.suppressed.Swap(0)
	t.last.Store(now)
	t.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	logger.Warn(msg, args...)
}

// holds reports whether a line at now is held back: one was written less
// than Interval before.
func (t *Throttle) holds(now int64) bool {
	last := t.last.Load()
	return last != 0 && now-last < int64(Interval)
}
