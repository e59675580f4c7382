package config

import (
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// unsetRedis removes every variable Redis reads, restoring them after the test.
func unsetRedis(t *testing.T) {
	t.Helper()
	typ := reflect.TypeOf(Redis{})
	for i := 0; i < typ.NumField(); i++ {
		name := typ.Field(i).Tag.Get("envconfig")
		t.Setenv(name, "")
		os.Unsetenv(name)
		t.Setenv("REDIS_"+name, "") // envconfig's nested-prefix spelling
		os.Unsetenv("REDIS_" + name)
	}
}

func TestRedisDefaults(t *testing.T) {
	unsetAll(t)
	unsetRedis(t)
	s, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	want := Redis{
		SocketType: "tcp", URL: "localhost:6379", Type: RedisSingle, PoolSize: 10,
		Timeout: 100 * time.Millisecond, FailureMode: RedisFailError, Reservation: 2 * time.Second,
	}
	if s.Redis != want {
		t.Fatalf("defaults %+v, want %+v", s.Redis, want)
	}
	if d := Defaults().Redis; d != want {
		t.Fatalf("Defaults().Redis = %+v, want %+v", d, want)
	}
}

func TestRedisFromEnvironment(t *testing.T) {
	unsetAll(t)
	unsetRedis(t)
	env := map[string]string{
		"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "a:1,b:2,c:3",
		"REDIS_TYPE": "CLUSTER", "REDIS_AUTH": "user:pw", "REDIS_TLS": "true",
		"REDIS_TLS_CACERT": "/ca.pem", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true",
		"REDIS_POOL_SIZE": "32", "REDIS_TIMEOUT": "250ms", "CACHE_KEY_PREFIX": "prod_",
		"LOCAL_CACHE_SIZE_IN_BYTES": "1048576", "REDIS_FAILURE_MODE": "Local", // any case, kept in lower case
		"REDIS_RESERVATION": "250ms",
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	s, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	want := Redis{
		SocketType: "tcp", URL: "a:1,b:2,c:3", Type: RedisCluster, Auth: "user:pw", TLS: true,
		TLSCACert: "/ca.pem", TLSSkipHostnameVerification: true, PoolSize: 32,
		Timeout: 250 * time.Millisecond, CacheKeyPrefix: "prod_", LocalCacheSizeInBytes: 1 << 20,
		FailureMode: RedisFailLocal, Reservation: 250 * time.Millisecond,
	}
	if s.BackendType != BackendRedis || s.Redis != want {
		t.Fatalf("got %s %+v, want %+v", s.BackendType, s.Redis, want)
	}
}

func TestRedisValidate(t *testing.T) {
	ok := Defaults().Redis
	for _, tc := range []struct {
		name   string
		change func(*Redis)
		bad    string // variable named in the error; "" for valid
	}{
		{"defaults", func(*Redis) {}, ""},
		{"sentinel", func(r *Redis) { r.Type = "sentinel"; r.URL = "mymaster,h1:26379,h2:26379" }, ""},
		{"unix", func(r *Redis) { r.SocketType = "unix"; r.URL = "/run/redis.sock" }, ""},
		{"socket type", func(r *Redis) { r.SocketType = "udp" }, "REDIS_SOCKET_TYPE"},
		{"unix cluster", func(r *Redis) { r.SocketType = "unix"; r.Type = "cluster" }, "REDIS_SOCKET_TYPE"},
		{"type", func(r *Redis) { r.Type = "ring" }, "REDIS_TYPE"},
		{"empty url", func(r *Redis) { r.URL = " " }, "REDIS_URL"},
		{"sentinel without sentinels", func(r *Redis) { r.Type = "sentinel"; r.URL = "mymaster" }, "REDIS_URL"},
		{"sentinel auth without sentinel", func(r *Redis) { r.SentinelAuth = "x" }, "REDIS_SENTINEL_AUTH"},
		{"cert without key", func(r *Redis) { r.TLS = true; r.TLSClientCert = "c.pem" }, "REDIS_TLS_CLIENT_CERT"},
		{"tls options without tls", func(r *Redis) { r.TLSCACert = "ca.pem" }, "REDIS_TLS"},
		{"one sentinel", func(r *Redis) { r.Type = "sentinel"; r.URL = "mymaster,h1:26379" }, ""},
		{"pool of one", func(r *Redis) { r.PoolSize = 1 }, ""},
		{"no reservations", func(r *Redis) { r.Reservation = 0 }, ""},
		{"pool", func(r *Redis) { r.PoolSize = 0 }, "REDIS_POOL_SIZE"},
		{"timeout", func(r *Redis) { r.Timeout = 0 }, "REDIS_TIMEOUT"},
		{"cache size", func(r *Redis) { r.LocalCacheSizeInBytes = -1 }, "LOCAL_CACHE_SIZE_IN_BYTES"},
		{"negative reservation", func(r *Redis) { r.Reservation = -time.Second }, "REDIS_RESERVATION"},
		{"prefix with braces", func(r *Redis) { r.CacheKeyPrefix = "{x}" }, "CACHE_KEY_PREFIX"},
		{"failure mode", func(r *Redis) { r.FailureMode = "open" }, "REDIS_FAILURE_MODE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.change(&r)
			err := r.Validate()
			switch {
			case tc.bad == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
				t.Fatalf("error %v, want one naming %s", err, tc.bad)
			}
		})
	}

	// Settings.Validate checks the Redis settings only for the redis backend.
	s := Defaults()
	s.Redis.Type = "ring"
	if err := s.Validate(); err != nil {
		t.Fatalf("memory backend rejected for a Redis setting: %v", err)
	}
	s.BackendType = BackendRedis
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "REDIS_TYPE") {
		t.Fatalf("redis backend with a bad REDIS_TYPE: %v", err)
	}
}

func TestRedisSecretsMasked(t *testing.T) {
	r := Defaults().Redis
	r.Auth = "admin:hunter2"
	r.SentinelAuth = "sentinel-secret"
	s := Defaults()
	s.Redis = r
	var logs strings.Builder
	slog.New(slog.NewTextHandler(&logs, nil)).Info("settings", "redis", r)
	for name, out := range map[string]string{
		"String":     r.String(),
		"%v":         fmt.Sprintf("%v", r),
		"%+v":        fmt.Sprintf("%+v", r),
		"%#v":        fmt.Sprintf("%#v", r),
		"slog":       logs.String(),
		"Settings":   s.String(),
		"Settings%v": fmt.Sprintf("%v", s),
	} {
		if strings.Contains(out, "hunter2") || strings.Contains(out, "sentinel-secret") {
			t.Errorf("%s leaks a password: %s", name, out)
		}
	}
	if !strings.Contains(r.String(), "<redacted>") {
		t.Errorf("String does not say a password is set: %s", r.String())
	}
}
