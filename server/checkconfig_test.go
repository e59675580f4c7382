package server_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/server"
)

func TestCheckConfig(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string
		ok    bool
		want  []string // lines of the output, by substring
	}{
		{"valid", map[string]string{"a.yaml": limitRules}, true, []string{"OK, 2 rules in 1 domains"}},
		{"every error with file and line", map[string]string{
			"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    ratelimit: {unit: second}\n",
			"b.yaml": "domain: b\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
		}, false, []string{"a.yaml:4: ", "unknown key 'ratelimit'", "b.yaml:5: ", "fortnight", "2 error(s)"}},
		{"window the bucket count does not divide", map[string]string{
			"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {window: 7ns, requests_per_unit: 1, algorithm: time_buckets}\n",
		}, false, []string{"a.yaml:", "1 error(s)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "rules")
			for name, content := range c.files {
				writeRules(t, dir, name, content)
			}
			var out strings.Builder
			if ok := server.CheckConfig(dir, config.Defaults(), &out); ok != c.ok {
				t.Errorf("CheckConfig = %t, want %t\n%s", ok, c.ok, out.String())
			}
			for _, want := range c.want {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
	var out strings.Builder
	if server.CheckConfig(filepath.Join(t.TempDir(), "missing"), config.Defaults(), &out) {
		t.Errorf("a missing directory passed: %s", out.String())
	}
}

// TestCheckConfigUsesTheServersSettings: check-config refuses exactly what
// a server with the same settings refuses, and accepts what it accepts.
func TestCheckConfigUsesTheServersSettings(t *testing.T) {
	withSettings := func(mod func(*config.Settings)) config.Settings {
		s := config.Defaults()
		mod(&s)
		return s
	}
	r := redistest.Start(t)
	onRedis := withSettings(func(s *config.Settings) { s.BackendType, s.Redis.URL = config.BackendRedis, r.Addr() })
	// 1 s in 128 buckets: 7812.5 µs each, which the in-memory store keeps
	// and the Redis scripts (whole microseconds) cannot.
	subMicro := map[string]string{"a.yaml": "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2, algorithm: time_buckets, buckets: 128}\n"}
	for _, c := range []struct {
		name     string
		files    map[string]string
		settings config.Settings
		ok       bool
	}{
		{"metadata without dynamic metadata", map[string]string{"a.yaml": "domain: m\ndescriptors:\n  - key: k\n    metadata: {when: 2024-01-01}\n    rate_limit: {unit: second, requests_per_unit: 1}\n"},
			config.Defaults(), true},
		{"metadata that dynamic metadata cannot carry", map[string]string{"a.yaml": "domain: m\ndescriptors:\n  - key: k\n    metadata: {when: 2024-01-01}\n    rate_limit: {unit: second, requests_per_unit: 1}\n"},
			withSettings(func(s *config.Settings) { s.ResponseDynamicMetadata = true }), false},
		{"a domain in two files", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			"b.yaml": "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1}\n"}, config.Defaults(), false},
		{"a domain in two files, merged", map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			"b.yaml": "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1}\n"}, withSettings(func(s *config.Settings) { s.MergeDomainConfig = true }), true},
		{"sub-microsecond buckets in memory", subMicro, config.Defaults(), true},
		{"sub-microsecond buckets on Redis", subMicro, onRedis, false},
		{"whole-microsecond buckets on Redis", map[string]string{"a.yaml": "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2, algorithm: time_buckets, buckets: 125}\n"}, onRedis, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "config")
			for name, content := range c.files {
				writeRules(t, dir, name, content)
			}
			var out strings.Builder
			if got := server.CheckConfig(dir, c.settings, &out); got != c.ok {
				t.Errorf("CheckConfig = %t, want %t:\n%s", got, c.ok, out.String())
			}
			// The server agrees: it serves the rules, or rejects them.
			s := c.settings
			s.GRPCHost, s.Host, s.DebugHost = "127.0.0.1", "127.0.0.1", "127.0.0.1"
			s.GRPCPort, s.Port, s.DebugPort, s.ReportPort = 0, 0, 0, 0
			s.RuntimeRoot, s.RuntimeSubdirectory, s.RuntimeAppDirectory = filepath.Dir(dir), "", "config"
			ts := startWith(t, s)
			loaded := metricValue(t, ts, "ratelimit_service_config_load_success") == "1"
			if loaded != c.ok {
				t.Errorf("the server loaded the rules: %t, check-config said %t", loaded, c.ok)
			}
		})
	}
}
