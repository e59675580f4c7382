package service

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/leapgate/leapgate/window"
)

// decisionLinesPerSecond bounds the decision log: a flood of refusals
// writes at most this many lines a second, then one line saying how many
// it left out.
const decisionLinesPerSecond = 100

// decisionLog writes, at debug level, one line per refused descriptor, at
// most decisionLinesPerSecond a second of its clock.
type decisionLog struct {
	clock   window.Clock
	mu      sync.Mutex
	second  int64 // the clock's second of the current budget
	written int
	dropped int
}

// refused logs the descriptors of sc that were answered OVER_LIMIT. It is
// called only when the logger takes debug lines.
func (d *decisionLog) refused(ctx context.Context, logger *slog.Logger, domain string, sc *scratch, reason string) {
	for i := range sc.plans {
		p := &sc.plans[i]
		if !p.answer.over {
			continue
		}
		if !d.take(ctx, logger) {
			continue
		}
		attrs := []slog.Attr{slog.String("domain", domain), slog.Int("descriptor", i), slog.String("reason", reason),
			slog.Uint64("remaining", uint64(p.answer.remaining)), slog.Duration("reset", p.answer.reset)}
		if p.info != nil {
			// The rule's metric key: its ID, or with detailed_metric or
			// value_to_metric the request's values, shown capped and valid.
			attrs = append(attrs, slog.String("rule", p.info.rule.MetricKey(p.entries)))
		}
		if li := p.answer.limit; li != nil {
			attrs = append(attrs, slog.Uint64("limit", li.limit), slog.Duration("window", li.spec.Length()))
		}
		logger.LogAttrs(ctx, slog.LevelDebug, "refused", attrs...)
	}
}

// take reports whether a line fits this second's budget, first writing
// the count of lines the previous second left out.
func (d *decisionLog) take(ctx context.Context, logger *slog.Logger) bool {
	now := int64(d.clock.Now() / time.Second)
	d.mu.Lock()
	defer d.mu.Unlock()
	if now != d.second {
		if d.dropped > 0 {
			logger.LogAttrs(ctx, slog.LevelDebug, "refused lines left out", slog.Int("count", d.dropped), slog.Int("per_second", decisionLinesPerSecond))
		}
		d.second, d.written, d.dropped = now, 0, 0
	}
	if d.written >= decisionLinesPerSecond {
		d.dropped++
		return false
	}
	d.written++
	return true
}
