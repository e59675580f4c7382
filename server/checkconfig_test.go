package server_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/leapgate/leapgate/config"
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
