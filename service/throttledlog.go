package service

import (
	"log/slog"
	"sync/atomic"
	"time"
)

// throttledLogInterval is the least time between two lines of one
// throttledLog.
const throttledLogInterval = 5 * time.Second

// throttledLog writes a warning at most once per throttledLogInterval and
// says how many it held back in between, so that a failing backend under
// load logs a line every few seconds instead of one per request. The zero
// value is ready to use.
type throttledLog struct {
	last       atomic.Int64 // unix nanoseconds of the last line written
	suppressed atomic.Int64 // lines held back since
}

// log writes msg with args at warn level unless a line was written less
// than throttledLogInterval ago, in which case it only counts it.
func (t *throttledLog) log(logger *slog.Logger, msg string, args ...any) {
	now := time.Now().UnixNano()
	last := t.last.Load()
	if now-last < int64(throttledLogInterval) || !t.last.CompareAndSwap(last, now) {
		t.suppressed.Add(1)
		return
	}
	if n := t.suppressed.Swap(0); n > 0 {
		args = append(args, "suppressed", n)
	}
	logger.Warn(msg, args...)
}
