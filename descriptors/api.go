package descriptors

import (
	"fmt"
	"strings"
	"time"
)

// Unit is the time unit of a rate limit, with the numbering of Envoy's
// RateLimitResponse.RateLimit.Unit (note WEEK is 7, after YEAR).
type Unit int32

// Units, numbered as in envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit.
const (
	UnitUnknown Unit = 0
	UnitSecond  Unit = 1
	UnitMinute  Unit = 2
	UnitHour    Unit = 3
	UnitDay     Unit = 4
	UnitMonth   Unit = 5
	UnitYear    Unit = 6
	UnitWeek    Unit = 7
)

// Duration returns the window length of one unit: month is 30 days and year
// 365 days, as in envoyproxy/ratelimit.
func (u Unit) Duration() time.Duration {
	switch u {
	case UnitSecond:
		return time.Second
	case UnitMinute:
		return time.Minute
	case UnitHour:
		return time.Hour
	case UnitDay:
		return 24 * time.Hour
	case UnitWeek:
		return 7 * 24 * time.Hour
	case UnitMonth:
		return 30 * 24 * time.Hour
	case UnitYear:
		return 365 * 24 * time.Hour
	}
	return 0
}

// String returns the unit's name as in Envoy's enum: "SECOND", "MINUTE", ...
func (u Unit) String() string {
	switch u {
	case UnitSecond:
		return "SECOND"
	case UnitMinute:
		return "MINUTE"
	case UnitHour:
		return "HOUR"
	case UnitDay:
		return "DAY"
	case UnitWeek:
		return "WEEK"
	case UnitMonth:
		return "MONTH"
	case UnitYear:
		return "YEAR"
	}
	return "UNKNOWN"
}

// ParseUnit returns the unit named s, case-insensitively ("second", "Minute",
// "HOUR", ...). It reports false for "unknown" and for any other name.
func ParseUnit(s string) (Unit, bool) {
	switch strings.ToUpper(s) {
	case "SECOND":
		return UnitSecond, true
	case "MINUTE":
		return UnitMinute, true
	case "HOUR":
		return UnitHour, true
	case "DAY":
		return UnitDay, true
	case "WEEK":
		return UnitWeek, true
	case "MONTH":
		return UnitMonth, true
	case "YEAR":
		return UnitYear, true
	}
	return UnitUnknown, false
}

// Entry is one key/value pair of a request descriptor.
type Entry struct {
	Key   string
	Value string
}

// Error is a rule-file error with its position.
type Error struct {
	File   string
	Line   int // 1-based; 0 when unknown
	Reason string

	err error // the underlying error, if any (e.g. from reading the file)
	// lineInReason: Reason names the line itself, as envoyproxy/ratelimit
	// words YAML syntax errors ("yaml: line N: ..."), so Error does not
	// repeat it.
	lineInReason bool
}

// Unwrap returns the underlying error, such as the fs error of a file that
// could not be read, or nil.
func (e *Error) Unwrap() error { return e.err }

// Error is "file:line: reason", or "file: reason" when the line is unknown
// or the reason names it (a YAML syntax error, worded as upstream:
// "file: error loading config file: yaml: line N: ...").
func (e *Error) Error() string {
	if e.Line > 0 && !e.lineInReason {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Reason)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Reason)
}
