package config

import (
	"reflect"
	"testing"
)

// documentedDefaults is every setting's default as docs/settings.md states
// it, written out as literals so that a changed default fails a test (the
// docs' table is checked against the same tags in package examples).
var documentedDefaults = map[string]string{
	"TRACING_ENABLED":                               "false",
	"TRACING_EXPORTER_PROTOCOL":                     "http",
	"TRACING_SERVICE_NAME":                          "leapgate",
	"TRACING_SERVICE_NAMESPACE":                     "",
	"TRACING_SERVICE_INSTANCE_ID":                   "",
	"TRACING_SAMPLING_RATE":                         "1",
	"USE_PROMETHEUS":                                "false",
	"PROMETHEUS_ADDR":                               ":9090",
	"PROMETHEUS_PATH":                               "/metrics",
	"REDIS_PERSECOND":                               "false",
	"REDIS_PERSECOND_SOCKET_TYPE":                   "tcp",
	"REDIS_PERSECOND_TYPE":                          "single",
	"REDIS_PERSECOND_URL":                           "",
	"REDIS_PERSECOND_POOL_SIZE":                     "10",
	"REDIS_PERSECOND_AUTH":                          "",
	"REDIS_PERSECOND_SENTINEL_AUTH":                 "",
	"REDIS_PERSECOND_TLS":                           "false",
	"REDIS_PERSECOND_TIMEOUT":                       "100ms",
	"GRPC_HOST":                                     "0.0.0.0",
	"GRPC_PORT":                                     "8081",
	"HOST":                                          "0.0.0.0",
	"PORT":                                          "8080",
	"DEBUG_HOST":                                    "127.0.0.1",
	"DEBUG_PORT":                                    "6070",
	"REPORT_HOST":                                   "127.0.0.1",
	"REPORT_PORT":                                   "8082",
	"REPORT_TOKEN":                                  "",
	"GRPC_MAX_CONNECTION_AGE":                       "24h",
	"GRPC_MAX_CONNECTION_AGE_GRACE":                 "1h",
	"GRPC_REFLECTION":                               "true",
	"GRPC_MAX_CONCURRENT_STREAMS":                   "1024",
	"GRPC_MAX_CONNECTIONS":                          "0",
	"GRPC_CONNECTION_TIMEOUT":                       "5s",
	"GRPC_MAX_CONNECTION_IDLE":                      "30s",
	"FEED_TOKEN":                                    "",
	"MAX_OBSERVATION_STREAMS":                       "16384",
	"MAX_OBSERVATION_STREAMS_PER_PEER":              "4096",
	"FEED_ALLOW_ANY_PEER":                           "false",
	"OBSERVATION_STREAM_IDLE_TIMEOUT":               "10m",
	"RLQS_ENABLED":                                  "true",
	"RLQS_TICK":                                     "500ms",
	"RLQS_ASSIGNMENT_TTL":                           "4s",
	"RLQS_BUCKET_IDLE":                              "1m",
	"RLQS_MAX_BUCKETS_PER_STREAM":                   "1000",
	"RLQS_MAX_BUCKETS_PER_DOMAIN":                   "200000",
	"MAX_RLQS_STREAMS":                              "4096",
	"MAX_RLQS_STREAMS_PER_PEER":                     "64",
	"RLQS_STREAM_IDLE_TIMEOUT":                      "1m",
	"HTTP_READ_TIMEOUT":                             "10s",
	"HTTP_WRITE_TIMEOUT":                            "10s",
	"HTTP_IDLE_TIMEOUT":                             "2m",
	"HTTP_MAX_CONNECTIONS":                          "512",
	"DRAIN_TIMEOUT":                                 "20s",
	"GRPC_SERVER_USE_TLS":                           "false",
	"GRPC_SERVER_TLS_CERT":                          "",
	"GRPC_SERVER_TLS_KEY":                           "",
	"GRPC_CLIENT_TLS_CACERT":                        "",
	"GRPC_CLIENT_TLS_SAN":                           "",
	"MAX_REQUEST_BYTES":                             "1048576",
	"MAX_DESCRIPTORS_PER_REQUEST":                   "64",
	"RUNTIME_ROOT":                                  "/srv/runtime_data/current",
	"RUNTIME_SUBDIRECTORY":                          "",
	"RUNTIME_APPDIRECTORY":                          "config",
	"RUNTIME_WATCH_ROOT":                            "true",
	"MERGE_DOMAIN_CONFIG":                           "false",
	"DEFAULT_CHARGE":                                "when_allowed",
	"EXAMPLE_RULES":                                 "false",
	"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED":       "false",
	"FORCE_START_WITHOUT_INITIAL_CONFIG":            "false",
	"GRPC_UDS":                                      "",
	"CONFIG_RELOAD_DEBOUNCE":                        "250ms",
	"LOG_LEVEL":                                     "info",
	"LOG_FORMAT":                                    "text",
	"SHADOW_MODE":                                   "false",
	"QUOTA_MODE":                                    "false",
	"REFUSAL_HEADERS":                               "false",
	"NEAR_LIMIT_RATIO":                              "0.8",
	"WINDOW_BUCKETS":                                "20",
	"LIMIT_RESPONSE_HEADERS_ENABLED":                "false",
	"LIMIT_LIMIT_HEADER":                            "RateLimit-Limit",
	"LIMIT_REMAINING_HEADER":                        "RateLimit-Remaining",
	"LIMIT_RESET_HEADER":                            "RateLimit-Reset",
	"RESPONSE_DYNAMIC_METADATA":                     "false",
	"BREAKER_CLUSTER_KEY":                           "destination_cluster",
	"BREAKER_ROUTE_KEY":                             "route",
	"BREAKER_HEADERS":                               "",
	"MAX_KEYS":                                      "1000000",
	"MAX_MEMORY_BYTES":                              "134217728",
	"SWEEP_INTERVAL":                                "10s",
	"BACKEND_TYPE":                                  "memory",
	"REDIS_SOCKET_TYPE":                             "tcp",
	"REDIS_URL":                                     "localhost:6379",
	"REDIS_TYPE":                                    "single",
	"REDIS_AUTH":                                    "",
	"REDIS_SENTINEL_AUTH":                           "",
	"REDIS_TLS":                                     "false",
	"REDIS_TLS_CLIENT_CERT":                         "",
	"REDIS_TLS_CLIENT_KEY":                          "",
	"REDIS_TLS_CACERT":                              "",
	"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION":          "false",
	"REDIS_POOL_SIZE":                               "10",
	"REDIS_TIMEOUT":                                 "100ms",
	"CACHE_KEY_PREFIX":                              "",
	"LOCAL_CACHE_SIZE_IN_BYTES":                     "0",
	"REDIS_FAILURE_MODE":                            "error",
	"REDIS_RESERVATION":                             "2s",
	"CONFIG_TYPE":                                   "FILE",
	"CONFIG_GRPC_XDS_SERVER_URL":                    "localhost:18000",
	"CONFIG_GRPC_XDS_NODE_ID":                       "default",
	"CONFIG_GRPC_XDS_NODE_METADATA":                 "",
	"CONFIG_GRPC_XDS_SERVER_USE_TLS":                "false",
	"CONFIG_GRPC_XDS_CLIENT_TLS_CERT":               "",
	"CONFIG_GRPC_XDS_CLIENT_TLS_KEY":                "",
	"CONFIG_GRPC_XDS_SERVER_TLS_CACERT":             "",
	"CONFIG_GRPC_XDS_SERVER_TLS_SAN":                "",
	"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL":           "1s",
	"XDS_CLIENT_BACKOFF_JITTER":                     "true",
	"XDS_CLIENT_BACKOFF_RANDOM_FACTOR":              "0.5",
	"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES":              "0",
	"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "3s",
	"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS":     "",
	"XDS_CLIENT_BACKOFF_MAX_INTERVAL":               "60s",
}

// TestDocumentedDefaults: every variable config reads has the documented
// default, and every documented variable is read.
func TestDocumentedDefaults(t *testing.T) {
	got := map[string]string{}
	var walk func(reflect.Type)
	walk = func(typ reflect.Type) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			if f.Type.Kind() == reflect.Struct && f.Tag.Get("envconfig") == "" {
				walk(f.Type)
				continue
			}
			if name := f.Tag.Get("envconfig"); name != "" {
				got[name] = f.Tag.Get("default")
			}
		}
	}
	walk(reflect.TypeFor[Settings]())
	for name, want := range documentedDefaults {
		if def, ok := got[name]; !ok {
			t.Errorf("%s is documented but not read", name)
		} else if def != want {
			t.Errorf("%s defaults to %q, documented %q", name, def, want)
		}
	}
	for name := range got {
		if _, ok := documentedDefaults[name]; !ok {
			t.Errorf("%s is read but has no documented default here", name)
		}
	}
}
