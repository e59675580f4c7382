package config

import (
	"os"
	"sort"
	"strings"
)

// UnhonouredSetting is a variable envoyproxy/ratelimit reads that Leapgate
// does not, and why.
type UnhonouredSetting struct {
	// Name is the environment variable.
	Name string
	// Why says what Leapgate does instead.
	Why string
	// Same, when set, is the value with which upstream behaves as
	// Leapgate does anyway: set to it, the variable is not reported.
	Same string
}

// unhonoured lists every variable of envoyproxy/ratelimit's settings
// (src/settings/settings.go) that Leapgate does not read, with what it does
// instead. Every other upstream variable is read with upstream's meaning
// (TestUpstreamSettingsAreAccountedFor checks the two lists cover
// upstream's). A name ending in "*" stands for every variable with that
// prefix.
var unhonoured = []UnhonouredSetting{
	{"USE_STATSD", "metrics are served for Prometheus on /metrics; there is no statsd sink", "false"},
	{"STATSD_HOST", "no statsd sink: scrape /metrics", ""},
	{"STATSD_PORT", "no statsd sink: scrape /metrics", ""},
	{"USE_DOG_STATSD", "no DogStatsD sink: scrape /metrics", ""},
	{"USE_DOG_STATSD_MOGRIFIERS", "no DogStatsD sink: relabel in Prometheus instead (docs/migrating.md)", ""},
	{"DOG_STATSD_MOGRIFIER_*", "no DogStatsD sink: relabel in Prometheus instead (docs/migrating.md)", ""},
	{"EXTRA_TAGS", "no statsd tags: add target labels in the Prometheus scrape configuration", ""},
	{"STATS_FLUSH_INTERVAL", "Prometheus pulls; nothing is flushed", ""},
	{"DISABLE_STATS", "/metrics is always served; do not scrape it to disable", "false"},
	{"PROMETHEUS_MAPPER_YAML", "native Prometheus metrics need no statsd mapping", ""},
	{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "durations are in seconds, as Prometheus conventions ask", ""},
	{"RUNTIME_IGNOREDOTFILES", "dotfiles and dot-directories are always skipped (a ConfigMap's ..data is never read twice)", "true"},
	{"EXPIRATION_JITTER_MAX_SECONDS", "Redis keys expire with their window, computed per key; no jitter is needed", ""},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "refused hits are never recorded, always", "true"},
	{"REDIS_PIPELINE_WINDOW", "requests are pipelined to Redis automatically (redisstore's pipeliner)", ""},
	{"REDIS_PIPELINE_LIMIT", "requests are pipelined to Redis automatically (redisstore's pipeliner)", ""},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "the pool waits for a connection, bounded by REDIS_TIMEOUT", ""},
	{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "Redis health is a PING every second (leapgate_redis_up)", ""},
	{"REDIS_PERSECOND_PIPELINE_WINDOW", "requests are pipelined to Redis automatically (redisstore's pipeliner)", ""},
	{"REDIS_PERSECOND_PIPELINE_LIMIT", "requests are pipelined to Redis automatically (redisstore's pipeliner)", ""},
	{"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "the pool waits for a connection, bounded by REDIS_PERSECOND_TIMEOUT", ""},
	{"MEMCACHE_*", "there is no Memcached backend: BACKEND_TYPE is memory or redis", ""},
}

// Unhonoured returns the unhonoured upstream variables set in environ (a
// list of "NAME=value", as os.Environ returns), in name order, for one
// start-up warning each; a variable set to its Same value is left out. The
// returned Same fields are empty.
func Unhonoured(environ []string) []UnhonouredSetting {
	var out []UnhonouredSetting
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		for _, u := range unhonoured {
			if u.Name == name || (strings.HasSuffix(u.Name, "*") && strings.HasPrefix(name, strings.TrimSuffix(u.Name, "*"))) {
				if u.Same == "" || !strings.EqualFold(strings.TrimSpace(value), u.Same) {
					out = append(out, UnhonouredSetting{Name: name, Why: u.Why})
				}
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// UnhonouredInEnvironment is Unhonoured of the process's environment.
func UnhonouredInEnvironment() []UnhonouredSetting { return Unhonoured(os.Environ()) }
