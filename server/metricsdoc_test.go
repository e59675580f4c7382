package server_test

import (
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/internal/redistest"
)

// TestEveryMetricIsDocumented: every metric a server exports, in memory and
// on Redis, is named in docs/operations.md (the Go runtime's and the
// process's collectors aside), so the page an operator reads at 2 a.m.
// lists all of them.
func TestEveryMetricIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	r := redistest.Start(t)
	memory := start(t, map[string]string{"rules.yaml": limitRules}, nil)
	onRedis := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) {
		s.BackendType, s.Redis.URL = config.BackendRedis, r.Addr()
	})
	names := map[string]bool{}
	for _, ts := range []*testServer{memory, onRedis} {
		mfs, err := ts.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			names[mf.GetName()] = true
		}
	}
	var missing []string
	for name := range names {
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		if !strings.Contains(string(doc), "`"+name+"`") && !strings.Contains(string(doc), "`"+name+"{") {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("docs/operations.md does not name %d exported metrics: %s", len(missing), strings.Join(missing, ", "))
	}
	if len(names) < 30 {
		t.Fatalf("only %d metrics gathered", len(names))
	}
}
