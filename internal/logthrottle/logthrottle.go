// Package logthrottle keeps a repeated warning from flooding the log: a
// Throttle writes a line at most once per Interval and says how many it held
// back in between.
package logthrottle

import (
	"log/slog"
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
	last := t.last.Load()
	if (last != 0 && now-last < int64(Interval)) || !t.last.CompareAndSwap(last, now) {
		t.suppressed.Add(1)
		return
	}
	if n := t.suppressed.Swap(0); n > 0 {
		args = append(args, "suppressed", n)
	}
	logger.Warn(msg, args...)
}
