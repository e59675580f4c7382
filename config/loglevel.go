package config

import (
	"fmt"
	"log/slog"
	"strings"
)

// LogLevel is a LOG_LEVEL setting. It reads every spelling envoyproxy/ratelimit
// accepts (logrus's): trace and debug are slog.LevelDebug, info, warn or
// warning, and error, fatal and panic are slog.LevelError (this service
// never exits or panics on a log line). Case is ignored.
type LogLevel slog.Level

// UnmarshalText implements encoding.TextUnmarshaler.
func (l *LogLevel) UnmarshalText(text []byte) error {
	switch strings.ToLower(strings.TrimSpace(string(text))) {
	case "trace", "debug":
		*l = LogLevel(slog.LevelDebug)
	case "info":
		*l = LogLevel(slog.LevelInfo)
	case "warn", "warning":
		*l = LogLevel(slog.LevelWarn)
	case "error", "fatal", "panic":
		*l = LogLevel(slog.LevelError)
	default:
		return fmt.Errorf("log level %q: want trace, debug, info, warn, warning, error, fatal or panic", text)
	}
	return nil
}

// String is the level's slog name (DEBUG, INFO, WARN, ERROR).
func (l LogLevel) String() string { return slog.Level(l).String() }
