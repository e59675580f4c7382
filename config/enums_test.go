package config

import (
	"fmt"
	"strings"
	"testing"
)

// The word settings are read in any case and spacing into their canonical
// spelling, upstream's words included, and Validate refuses the others by
// their variable's name.
func TestWordSettings(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want func(Settings) bool
	}{
		{map[string]string{"BACKEND_TYPE": " Redis ", "REDIS_URL": "localhost:6379"}, func(s Settings) bool { return s.BackendType == BackendRedis }},
		{map[string]string{"REDIS_SOCKET_TYPE": "TCP"}, func(s Settings) bool { return s.Redis.SocketType == SocketTCP }},
		{map[string]string{"LOG_FORMAT": "JSON"}, func(s Settings) bool { return s.LogFormat == LogJSON }},
		{map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "TRUE"}, func(s Settings) bool { return s.LimitResponseHeaders == HeadersDraft03 }},
		{map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": " Draft03 "}, func(s Settings) bool { return s.LimitResponseHeaders == HeadersDraft03 }},
		{map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "draft11"}, func(s Settings) bool { return s.LimitResponseHeaders == HeadersDraft11 }},
		{map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "FALSE"}, func(s Settings) bool { return s.LimitResponseHeaders == HeadersOff }},
		{map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": ""}, func(s Settings) bool { return s.LimitResponseHeaders == HeadersOff }},
		{map[string]string{"DEFAULT_CHARGE": "Always"}, func(s Settings) bool { return s.DefaultCharge == ChargeAlways }},
		{map[string]string{"CONFIG_TYPE": "file"}, func(s Settings) bool { return s.XDS.ConfigType == SourceFile }},
	} {
		t.Run(fmt.Sprint(tc.env), func(t *testing.T) {
			unsetAll(t)
			unsetRedis(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			s, err := Load()
			if err != nil || !tc.want(s) {
				t.Errorf("%v: %v, settings %s", tc.env, err, s)
			}
		})
	}
	for _, tc := range []struct{ name, value string }{
		{"BACKEND_TYPE", "postgres"}, {"REDIS_SOCKET_TYPE", "udp"}, {"LOG_FORMAT", "xml"},
		{"LIMIT_RESPONSE_HEADERS_ENABLED", "yes"}, {"LIMIT_RESPONSE_HEADERS_ENABLED", "draft04"},
		{"DEFAULT_CHARGE", "sometimes"}, {"CONFIG_TYPE", "GRPC_XDS_DELTA"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			unsetAll(t)
			unsetRedis(t)
			t.Setenv(tc.name, tc.value)
			if tc.name == "REDIS_SOCKET_TYPE" {
				t.Setenv("BACKEND_TYPE", "redis")
				t.Setenv("REDIS_URL", "localhost:6379")
			}
			_, err := Load()
			if err == nil || !strings.Contains(err.Error(), tc.name+":") {
				t.Fatalf("Load: %v, want an error naming %s", err, tc.name)
			}
		})
	}
}
