package config

import "strings"

// The settings that take one of a few words are typed: each type's
// UnmarshalText reads its variable in any case (and spacing) and keeps the
// canonical spelling, and Validate refuses a word the type does not know,
// with every other invalid setting at once. Nothing downstream parses a
// setting again.

// BackendType is where windows live (BACKEND_TYPE).
type BackendType string

// The backends BACKEND_TYPE accepts.
const (
	// BackendMemory keeps every window in this process (the default).
	BackendMemory BackendType = "memory"
	// BackendRedis keeps every window in Redis (package redisstore),
	// shared by all replicas.
	BackendRedis BackendType = "redis"
)

// UnmarshalText reads a BACKEND_TYPE value in any case.
func (t *BackendType) UnmarshalText(text []byte) error {
	*t = BackendType(lowerWord(text))
	return nil
}

// SocketType is how Redis is reached (REDIS_SOCKET_TYPE).
type SocketType string

// The socket types REDIS_SOCKET_TYPE accepts.
const (
	SocketTCP  SocketType = "tcp"
	SocketUnix SocketType = "unix" // REDIS_URL is then the socket's path
)

// UnmarshalText reads a REDIS_SOCKET_TYPE value in any case.
func (t *SocketType) UnmarshalText(text []byte) error {
	*t = SocketType(lowerWord(text))
	return nil
}

func (t SocketType) valid() bool { return t == SocketTCP || t == SocketUnix }

// LogFormat is how log lines are written (LOG_FORMAT).
type LogFormat string

// The formats LOG_FORMAT accepts.
const (
	LogText LogFormat = "text"
	LogJSON LogFormat = "json"
)

// UnmarshalText reads a LOG_FORMAT value in any case.
func (f *LogFormat) UnmarshalText(text []byte) error {
	*f = LogFormat(lowerWord(text))
	return nil
}

func (f LogFormat) valid() bool { return f == LogText || f == LogJSON }

// HeaderMode selects the rate-limit headers added to answers
// (LIMIT_RESPONSE_HEADERS_ENABLED).
type HeaderMode string

// The modes LIMIT_RESPONSE_HEADERS_ENABLED accepts: false (or empty),
// true (upstream's word for draft03), draft03, draft11.
const (
	HeadersOff     HeaderMode = "false"
	HeadersDraft03 HeaderMode = "draft03"
	HeadersDraft11 HeaderMode = "draft11"
)

// UnmarshalText reads a LIMIT_RESPONSE_HEADERS_ENABLED value in any case:
// "" is HeadersOff and "true" HeadersDraft03.
func (m *HeaderMode) UnmarshalText(text []byte) error {
	switch w := lowerWord(text); w {
	case "":
		*m = HeadersOff
	case "true":
		*m = HeadersDraft03
	default:
		*m = HeaderMode(w)
	}
	return nil
}

func (m HeaderMode) valid() bool {
	return m == HeadersOff || m == HeadersDraft03 || m == HeadersDraft11
}

// Charge is the charge of a rate limit that does not set one
// (DEFAULT_CHARGE; descriptors' charge field).
type Charge string

// The charges DEFAULT_CHARGE accepts.
const (
	// ChargeWhenAllowed records hits only when they fit (the default).
	ChargeWhenAllowed Charge = "when_allowed"
	// ChargeAlways records every hit, even one that does not fit.
	ChargeAlways Charge = "always"
)

// UnmarshalText reads a DEFAULT_CHARGE value in any case.
func (c *Charge) UnmarshalText(text []byte) error {
	*c = Charge(lowerWord(text))
	return nil
}

func (c Charge) valid() bool { return c == ChargeWhenAllowed || c == ChargeAlways }

// ConfigType is the rule source (CONFIG_TYPE).
type ConfigType string

// The rule sources CONFIG_TYPE accepts.
const (
	// SourceFile reads rules from the rule directory and reloads them on change.
	SourceFile ConfigType = "FILE"
	// SourceXDS subscribes to rules from an xDS management server (SotW ADS).
	SourceXDS ConfigType = "GRPC_XDS_SOTW"
)

// UnmarshalText reads a CONFIG_TYPE value in any case.
func (t *ConfigType) UnmarshalText(text []byte) error {
	*t = ConfigType(strings.ToUpper(strings.TrimSpace(string(text))))
	return nil
}

// lowerWord is text trimmed and in lower case.
func lowerWord(text []byte) string { return strings.ToLower(strings.TrimSpace(string(text))) }
