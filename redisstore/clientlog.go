package redisstore

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
)

// clientLogger carries go-redis's own log lines (dial failures, pool
// events) into a slog.Logger, so they share the process's format and level.
type clientLogger struct{ logger *slog.Logger }

// Printf logs one go-redis line at warn level: go-redis only logs trouble.
func (c clientLogger) Printf(ctx context.Context, format string, v ...any) {
	c.logger.WarnContext(ctx, "redis client", "msg", fmt.Sprintf(format, v...))
}

// RouteClientLogs sends go-redis's log lines to logger. go-redis keeps its
// logger in a package variable, so this is process-wide: call it once, from
// main, before any Store is built.
func RouteClientLogs(logger *slog.Logger) {
	redis.SetLogger(clientLogger{logger: logger})
}
