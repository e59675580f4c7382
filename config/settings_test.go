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

// unsetAll removes every variable Settings reads, restoring them after the test.
func unsetAll(t *testing.T) {
	t.Helper()
	typ := reflect.TypeOf(Settings{})
	for i := 0; i < typ.NumField(); i++ {
		if name := typ.Field(i).Tag.Get("envconfig"); name != "" {
			t.Setenv(name, "")
			os.Unsetenv(name)
		}
	}
}

func TestLoadDefaultsMatchDefaults(t *testing.T) {
	unsetAll(t)
	got, err := Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if want := Defaults(); !reflect.DeepEqual(got, want) {
		t.Errorf("Load() with an empty environment = %+v, Defaults() = %+v", got, want)
	}
	for _, c := range []struct{ name, got, want string }{
		{"gRPC", got.GRPCAddr(), "0.0.0.0:8081"},
		{"HTTP", got.HTTPAddr(), "0.0.0.0:8080"},
		{"debug (loopback by default)", got.DebugAddr(), "127.0.0.1:6070"},
		{"config dir", got.ConfigDir(), "/srv/runtime_data/current/config"},
		{"backend", string(got.BackendType), string(BackendMemory)},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
	if got.LogLevel != LogLevel(slog.LevelInfo) || got.NearLimitRatio != 0.8 || got.WindowBuckets != 20 {
		t.Errorf("defaults: level %v ratio %v buckets %d", got.LogLevel, got.NearLimitRatio, got.WindowBuckets)
	}
}

func TestLoadFromEnvironment(t *testing.T) {
	unsetAll(t)
	env := map[string]string{
		"GRPC_HOST": "::1", "GRPC_PORT": "9001", "HOST": "127.0.0.1", "PORT": "9002",
		"DEBUG_HOST": "0.0.0.0", "DEBUG_PORT": "9003",
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_APPDIRECTORY": "rules",
		"LOG_LEVEL": "DEBUG", "LOG_FORMAT": "json", "SHADOW_MODE": "true",
		"NEAR_LIMIT_RATIO": "0.5", "WINDOW_BUCKETS": "10", "DRAIN_TIMEOUT": "3s",
		"MAX_DESCRIPTORS_PER_REQUEST": "8",
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	s, err := Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if s.GRPCAddr() != "[::1]:9001" || s.HTTPAddr() != "127.0.0.1:9002" || s.DebugAddr() != "0.0.0.0:9003" {
		t.Errorf("addresses %s %s %s", s.GRPCAddr(), s.HTTPAddr(), s.DebugAddr())
	}
	if s.ConfigDir() != "/data/ratelimit/rules" {
		t.Errorf("ConfigDir = %q", s.ConfigDir())
	}
	if s.LogLevel != LogLevel(slog.LevelDebug) || s.LogFormat != "json" || !s.ShadowMode ||
		s.NearLimitRatio != 0.5 || s.WindowBuckets != 10 || s.DrainTimeout != 3*time.Second || s.MaxDescriptors != 8 {
		t.Errorf("settings not read: %+v", s)
	}
}

func TestLoadRejectsBadValues(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want string // substring of the error
	}{
		{map[string]string{"GRPC_PORT": "eighty"}, "GRPC_PORT"},
		{map[string]string{"PORT": "70000"}, "PORT: port 70000"},
		{map[string]string{"DEBUG_PORT": "-1"}, "DEBUG_PORT"},
		{map[string]string{"LOG_FORMAT": "xml"}, "LOG_FORMAT"},
		{map[string]string{"LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		{map[string]string{"NEAR_LIMIT_RATIO": "1.5"}, "NEAR_LIMIT_RATIO"},
		{map[string]string{"NEAR_LIMIT_RATIO": "0"}, "NEAR_LIMIT_RATIO"},
		{map[string]string{"WINDOW_BUCKETS": "0"}, "WINDOW_BUCKETS"},
		{map[string]string{"WINDOW_BUCKETS": "0", "BACKEND_TYPE": "redis"}, "WINDOW_BUCKETS"},
		{map[string]string{"WINDOW_BUCKETS": "7"}, "WINDOW_BUCKETS: 7 does not divide"},
		// 512 divides one second into whole nanoseconds, not microseconds:
		// fine in memory, refused for Redis, whose clock is in microseconds.
		{map[string]string{"WINDOW_BUCKETS": "512", "BACKEND_TYPE": "redis"}, "WINDOW_BUCKETS: 512 buckets per second are not whole microseconds"},
		{map[string]string{"BACKEND_TYPE": "memcache"}, "BACKEND_TYPE"},
		{map[string]string{"DRAIN_TIMEOUT": "-1s"}, "DRAIN_TIMEOUT"},
		{map[string]string{"GRPC_MAX_CONNECTION_AGE": "0s"}, "GRPC_MAX_CONNECTION_AGE"},
		{map[string]string{"CONFIG_RELOAD_DEBOUNCE": "-1s"}, "CONFIG_RELOAD_DEBOUNCE"},
		{map[string]string{"MAX_REQUEST_BYTES": "0"}, "MAX_REQUEST_BYTES"},
		{map[string]string{"MAX_DESCRIPTORS_PER_REQUEST": "0"}, "MAX_DESCRIPTORS_PER_REQUEST"},
		{map[string]string{"RUNTIME_ROOT": ""}, "RUNTIME_ROOT"},
		{map[string]string{"MAX_KEYS": "-1"}, "MAX_KEYS"},
		{map[string]string{"MAX_MEMORY_BYTES": "-1"}, "MAX_MEMORY_BYTES"},
		{map[string]string{"GRPC_MAX_CONCURRENT_STREAMS": "0"}, "GRPC_MAX_CONCURRENT_STREAMS"},
		{map[string]string{"MAX_OBSERVATION_STREAMS": "0"}, "MAX_OBSERVATION_STREAMS"},
		{map[string]string{"OBSERVATION_STREAM_IDLE_TIMEOUT": "0s"}, "OBSERVATION_STREAM_IDLE_TIMEOUT"},
		{map[string]string{"RLQS_ASSIGNMENT_TTL": "2500ms"}, "RLQS_ASSIGNMENT_TTL"},
		{map[string]string{"RLQS_ASSIGNMENT_TTL": "2s", "RLQS_TICK": "2s"}, "RLQS_ASSIGNMENT_TTL"},
		{map[string]string{"RLQS_TICK": "0s"}, "RLQS_TICK"},
		{map[string]string{"RLQS_ASSIGNMENT_TTL": "3s", "RLQS_TICK": "2s"}, "RLQS_ASSIGNMENT_TTL"},
		{map[string]string{"RLQS_ASSIGNMENT_TTL": "1s", "RLQS_TICK": "100ms"}, "RLQS_ASSIGNMENT_TTL"},
		{map[string]string{"FEED_ALLOW_ANY_PEER": "true", "FEED_TOKEN": "t"}, "FEED_ALLOW_ANY_PEER"},
		{map[string]string{"TRACING_SAMPLING_RATE": "1.01"}, "TRACING_SAMPLING_RATE"},
		{map[string]string{"MAX_RLQS_STREAMS_PER_PEER": "0"}, "MAX_RLQS_STREAMS_PER_PEER"},
		{map[string]string{"HTTP_READ_TIMEOUT": "0s"}, "HTTP_READ_TIMEOUT"},
		{map[string]string{"HTTP_WRITE_TIMEOUT": "-1s"}, "HTTP_WRITE_TIMEOUT"},
		{map[string]string{"HTTP_IDLE_TIMEOUT": "0s"}, "HTTP_IDLE_TIMEOUT"},
		{map[string]string{"HTTP_MAX_CONNECTIONS": "0"}, "HTTP_MAX_CONNECTIONS"},
		{map[string]string{"REPORT_HOST": "0.0.0.0"}, "REPORT_HOST: \"0.0.0.0\" is not a loopback address: set REPORT_TOKEN"},
		{map[string]string{"REPORT_HOST": "10.1.2.3"}, "REPORT_HOST"},
		{map[string]string{"REPORT_PORT": "70000"}, "REPORT_PORT"},
		{map[string]string{"BACKEND_TYPE": "redis", "REDIS_PERSECOND": "true"}, "REDIS_PERSECOND_URL: required"},
		{map[string]string{"BACKEND_TYPE": "redis", "REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "r:1", "REDIS_PERSECOND_TYPE": "ring"}, "REDIS_PERSECOND_TYPE"},
		{map[string]string{"BACKEND_TYPE": "redis", "REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "r:1", "REDIS_PERSECOND_TIMEOUT": "0s"}, "REDIS_PERSECOND_TIMEOUT"},
		{map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "draft99"}, "LIMIT_RESPONSE_HEADERS_ENABLED"},
		{map[string]string{"LIMIT_RESET_HEADER": " "}, "LIMIT_RESET_HEADER"},
		{map[string]string{"BREAKER_ROUTE_KEY": ""}, "BREAKER_ROUTE_KEY"},
		{map[string]string{"SWEEP_INTERVAL": "0s"}, "SWEEP_INTERVAL"},
		{map[string]string{"GRPC_SERVER_USE_TLS": "true"}, "GRPC_SERVER_TLS_CERT: required"},
		{map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c.pem"}, "GRPC_SERVER_TLS_KEY: required"},
		{map[string]string{"GRPC_CLIENT_TLS_CACERT": "ca.pem"}, "GRPC_CLIENT_TLS_CACERT"},
		{map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c", "GRPC_SERVER_TLS_KEY": "k", "GRPC_CLIENT_TLS_SAN": "x"}, "GRPC_CLIENT_TLS_SAN"},
	} {
		t.Run(c.want, func(t *testing.T) {
			unsetAll(t)
			unsetRedis(t)
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			_, err := Load()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Load() error = %v, want one mentioning %q", err, c.want)
			}
		})
	}
}

// TestLoadAcceptsEdgeValues: the least and greatest value each bound
// allows loads (each on its own, the rest at their defaults).
func TestLoadAcceptsEdgeValues(t *testing.T) {
	for _, env := range []map[string]string{
		{"PORT": "0"}, {"DEBUG_PORT": "65535"},
		{"NEAR_LIMIT_RATIO": "1"},
		{"WINDOW_BUCKETS": "1"}, {"WINDOW_BUCKETS": "1", "BACKEND_TYPE": "redis"},
		{"DRAIN_TIMEOUT": "0s"}, {"CONFIG_RELOAD_DEBOUNCE": "0s"}, {"GRPC_MAX_CONNECTION_AGE_GRACE": "0s"},
		{"MAX_KEYS": "0"}, {"MAX_MEMORY_BYTES": "0"},
		{"MAX_REQUEST_BYTES": "1"}, {"MAX_DESCRIPTORS_PER_REQUEST": "1"},
		{"HTTP_MAX_CONNECTIONS": "1"}, {"MAX_RLQS_STREAMS_PER_PEER": "1"},
		{"RLQS_ASSIGNMENT_TTL": "2s", "RLQS_TICK": "1s"},
		{"TRACING_SAMPLING_RATE": "0"}, {"TRACING_SAMPLING_RATE": "1"},
		{"FEED_ALLOW_ANY_PEER": "true"},
	} {
		t.Run(fmt.Sprint(env), func(t *testing.T) {
			unsetAll(t)
			unsetRedis(t)
			for k, v := range env {
				t.Setenv(k, v)
			}
			if _, err := Load(); err != nil {
				t.Errorf("Load() with %v: %v", env, err)
			}
		})
	}
}

func TestValidateReportsEveryError(t *testing.T) {
	s := Defaults()
	s.Port, s.LogFormat, s.WindowBuckets = 99999, "xml", 0
	err := s.Validate()
	for _, name := range []string{"PORT", "LOG_FORMAT", "WINDOW_BUCKETS"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("Validate() = %v, want it to mention %s", err, name)
		}
	}
}

func TestStringRedactsSecrets(t *testing.T) {
	type inner struct {
		Password string `envconfig:"INNER_PASSWORD" secret:"true"`
		Empty    string `envconfig:"INNER_EMPTY" secret:"true"`
		URL      string `envconfig:"INNER_URL"`
	}
	attrs := settingAttrs(reflect.ValueOf(struct {
		Port  int `envconfig:"PORT"`
		Inner inner
	}{Port: 1, Inner: inner{Password: "hunter2", URL: "redis:6379"}}), nil)
	got := slog.GroupValue(attrs...).String()
	if strings.Contains(got, "hunter2") {
		t.Errorf("dump leaks a secret: %s", got)
	}
	for _, want := range []string{"PORT=1", "INNER_PASSWORD=<redacted>", "INNER_EMPTY= ", "INNER_URL=redis:6379"} {
		if !strings.Contains(got, want) {
			t.Errorf("dump %s lacks %s", got, want)
		}
	}
	if d := Defaults().String(); !strings.Contains(d, "GRPC_PORT=8081") || !strings.Contains(d, "DEBUG_HOST=127.0.0.1") {
		t.Errorf("Settings.String() = %s", d)
	}
	var b strings.Builder
	Defaults().NewLogger(&b).Info("starting", "settings", Defaults())
	if !strings.Contains(b.String(), "settings.GRPC_PORT=8081") {
		t.Errorf("logged settings: %s", b.String())
	}
}

func TestNewLoggerFormat(t *testing.T) {
	for _, c := range []struct {
		format LogFormat
		want   string
	}{{LogJSON, `"msg":"hello"`}, {LogText, "msg=hello"}} {
		var b strings.Builder
		s := Defaults()
		s.LogFormat = c.format
		s.NewLogger(&b).Info("hello")
		s.NewLogger(&b).Debug("hidden at info level")
		if !strings.Contains(b.String(), c.want) || strings.Contains(b.String(), "hidden") {
			t.Errorf("%s logger wrote %q", c.format, b.String())
		}
	}
}

func TestRealSecretsAreRedacted(t *testing.T) {
	s := Defaults()
	s.Redis.Auth, s.Redis.SentinelAuth = "hunter2", "sentinel-secret"
	var b strings.Builder
	s.NewLogger(&b).Info("starting", "settings", s)
	for _, out := range []string{s.String(), b.String()} {
		if strings.Contains(out, "hunter2") || strings.Contains(out, "sentinel-secret") {
			t.Errorf("a Redis password leaks: %s", out)
		}
		if !strings.Contains(out, "REDIS_AUTH=<redacted>") {
			t.Errorf("REDIS_AUTH not shown as redacted: %s", out)
		}
	}
}

// TestWindowBucketsInMemory: WINDOW_BUCKETS=512 (whole nanoseconds, not
// microseconds) is accepted with the in-memory backend; only Redis refuses
// it (TestLoadRejectsBadValues).
func TestWindowBucketsInMemory(t *testing.T) {
	unsetAll(t)
	t.Setenv("WINDOW_BUCKETS", "512")
	if s, err := Load(); err != nil || s.WindowBuckets != 512 {
		t.Fatalf("Load() = %d, %v; want 512 accepted in memory", s.WindowBuckets, err)
	}
}

// A report listener off loopback is accepted with a token, and on any
// loopback name without one.
func TestReportListenerNeedsTokenOffLoopback(t *testing.T) {
	for _, env := range []map[string]string{
		{"REPORT_HOST": "0.0.0.0", "REPORT_TOKEN": "s3cret"},
		{"REPORT_HOST": "localhost"},
		{"REPORT_HOST": "::1"},
		{"REPORT_HOST": "127.0.0.2"},
	} {
		unsetAll(t)
		for k, v := range env {
			t.Setenv(k, v)
		}
		s, err := Load()
		if err != nil {
			t.Errorf("%v: %v", env, err)
			continue
		}
		if strings.Contains(s.String(), "s3cret") {
			t.Errorf("REPORT_TOKEN printed: %s", s)
		}
	}
}

// TestLogLevelSpellings: every LOG_LEVEL spelling envoyproxy/ratelimit
// accepts starts the service.
func TestLogLevelSpellings(t *testing.T) {
	for _, c := range []struct {
		value string
		want  slog.Level
	}{
		{"trace", slog.LevelDebug}, {"DEBUG", slog.LevelDebug}, {"info", slog.LevelInfo}, {"Warn", slog.LevelWarn},
		{"warning", slog.LevelWarn}, {"WARNING", slog.LevelWarn}, {"error", slog.LevelError}, {"fatal", slog.LevelError}, {"panic", slog.LevelError},
	} {
		t.Run(c.value, func(t *testing.T) {
			unsetAll(t)
			unsetRedis(t)
			t.Setenv("LOG_LEVEL", c.value)
			s, err := Load()
			if err != nil || slog.Level(s.LogLevel) != c.want {
				t.Errorf("LOG_LEVEL=%s: %v, %v; want %v", c.value, slog.Level(s.LogLevel), err, c.want)
			}
		})
	}
	unsetAll(t)
	t.Setenv("LOG_LEVEL", "verbose")
	if _, err := Load(); err == nil || !strings.Contains(err.Error(), "LOG_LEVEL") {
		t.Errorf("LOG_LEVEL=verbose: %v, want an error naming LOG_LEVEL", err)
	}
}

// TestErrorsNameRealVariables: a malformed value is reported under the
// variable's own name (the nested settings once read as REDIS_REDIS_TIMEOUT).
func TestErrorsNameRealVariables(t *testing.T) {
	for _, name := range []string{"REDIS_TIMEOUT", "REDIS_POOL_SIZE", "XDS_CLIENT_BACKOFF_MAX_INTERVAL"} {
		t.Run(name, func(t *testing.T) {
			unsetAll(t)
			unsetRedis(t)
			t.Setenv(name, "bogus")
			_, err := Load()
			if err == nil || !strings.Contains(err.Error(), "assigning "+name+" ") {
				t.Errorf("%s=bogus: %v, want an error naming %s", name, err, name)
			}
		})
	}
}

// TestBackendInferredFromRedisSettings: an envoyproxy/ratelimit deployment
// (whose default backend is Redis) that sets REDIS_URL but not BACKEND_TYPE
// keeps sharing its limits through Redis, and the reason is given.
func TestBackendInferredFromRedisSettings(t *testing.T) {
	for _, c := range []struct {
		name     string
		env      map[string]string
		want     BackendType
		inferred bool
	}{
		{"nothing set", nil, BackendMemory, false},
		{"REDIS_URL", map[string]string{"REDIS_URL": "redis:6379"}, BackendRedis, true},
		{"REDIS_SOCKET_TYPE", map[string]string{"REDIS_SOCKET_TYPE": "tcp"}, BackendRedis, true},
		{"BACKEND_TYPE wins", map[string]string{"BACKEND_TYPE": "memory", "REDIS_URL": "redis:6379"}, BackendMemory, false},
		{"BACKEND_TYPE=redis", map[string]string{"BACKEND_TYPE": "redis"}, BackendRedis, false},
		{"a socket path", map[string]string{"REDIS_URL": "/var/run/nutcracker/ratelimit.sock"}, BackendRedis, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			unsetAll(t)
			unsetRedis(t)
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			s, err := Load()
			if err != nil {
				t.Fatal(err)
			}
			if s.BackendType != c.want {
				t.Errorf("BackendType = %q, want %q", s.BackendType, c.want)
			}
			if got := s.BackendReason() != "BACKEND_TYPE"; got != c.inferred {
				t.Errorf("BackendReason() = %q", s.BackendReason())
			}
			wantSocket := SocketTCP
			if strings.HasPrefix(c.env["REDIS_URL"], "/") {
				wantSocket = SocketUnix
			}
			if s.Redis.SocketType != wantSocket {
				t.Errorf("REDIS_SOCKET_TYPE = %q, want %q", s.Redis.SocketType, wantSocket)
			}
			if c.inferred && !strings.Contains(s.BackendReason(), "BACKEND_TYPE=memory") {
				t.Errorf("BackendReason() = %q, want it to say how to keep memory", s.BackendReason())
			}
		})
	}
}

// TestSettingsFormatsHideSecrets: every way of printing Settings masks the
// secrets, the embedded Redis settings' included.
func TestSettingsFormatsHideSecrets(t *testing.T) {
	s := Defaults()
	s.ReportToken, s.Redis.Auth, s.Redis.SentinelAuth = "tok-123", "user:pw-456", "pw-789"
	var logged strings.Builder
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("x", "settings", s)
	for name, out := range map[string]string{
		"%v": fmt.Sprintf("%v", s), "%+v": fmt.Sprintf("%+v", s), "%#v": fmt.Sprintf("%#v", s), "%s": s.String(), "slog": logged.String(),
	} {
		for _, secret := range []string{"tok-123", "pw-456", "pw-789"} {
			if strings.Contains(out, secret) {
				t.Errorf("%s shows the secret %q", name, secret)
			}
		}
		if !strings.Contains(out, "REDIS_URL") && !strings.Contains(out, "url=") {
			t.Errorf("%s does not show the settings: %s", name, out)
		}
	}
}
