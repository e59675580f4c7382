package redisstore

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/leapgate/leapgate/internal/logthrottle"
)

// clientLogger carries go-redis's own log lines (dial failures, pool
// events) into a slog.Logger, so they share the process's format and level.
// go-redis repeats a dial failure on every attempt while Redis is down: the
// lines are throttled (logthrottle), with a count of those held back.
type clientLogger struct {
	logger   *slog.Logger
	throttle *logthrottle.Throttle
}

// Printf logs one go-redis line at warn level (go-redis only logs trouble),
// its text under "detail".
func (c clientLogger) Printf(_ context.Context, format string, v ...any) {
	c.throttle.Warn(c.logger, "redis client", "detail", fmt.Sprintf(format, v...))
}

// RouteClientLogs sends go-redis's log lines to logger. go-redis keeps its
// logger in a package variable, so this is process-wide: call it once, from
// main, before any Store is built.
func RouteClientLogs(logger *slog.Logger) {
	redis.SetLogger(clientLogger{logger: logger, throttle: new(logthrottle.Throttle)})
}
