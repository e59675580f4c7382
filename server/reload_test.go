package server_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leapgate/leapgate/config"
)

func rulesPerMinute(n string) string {
	return strings.Replace(limitRules, "requests_per_unit: 2", "requests_per_unit: "+n, 1)
}

// waitRules waits until /rlconfig contains want.
func waitRules(t *testing.T, ts *testServer, want string) {
	t.Helper()
	eventually(t, "/rlconfig to show "+want, func() bool {
		_, body := get(t, ts.debugURL("/rlconfig"))
		return strings.Contains(body, want)
	})
}

func callUser(t *testing.T, client rlsv3.RateLimitServiceClient, user string) *rlsv3.RateLimitResponse_DescriptorStatus {
	t.Helper()
	resp, err := client.ShouldRateLimit(context.Background(), request("test", []string{"user", user}))
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp.GetStatuses()[0]
}

func TestReloadPlainEditKeepsCounters(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, nil)
	client := ts.rls(t)
	callUser(t, client, "alice")
	if st := callUser(t, client, "alice"); st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 0 {
		t.Fatalf("second call: %v", st)
	}

	writeRules(t, ts.ruleDir, "rules.yaml", rulesPerMinute("3"))
	waitRules(t, ts, "test.user: unit=MINUTE requests_per_unit=3")

	// The two hits before the reload still count under the raised limit.
	if st := callUser(t, client, "alice"); st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 0 ||
		st.GetCurrentLimit().GetRequestsPerUnit() != 3 {
		t.Errorf("third call after raising the limit to 3: %v, want OK with 0 remaining", st)
	}
	if st := callUser(t, client, "alice"); st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("fourth call: %v, want OVER_LIMIT", st)
	}
	if got := metricValue(t, ts, "ratelimit_service_config_load_success"); got == "1" || got == "" {
		t.Errorf("config_load_success = %q, want more than 1 after a reload", got)
	}

	// A new file adds a domain.
	writeRules(t, ts.ruleDir, "other.yml", "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	waitRules(t, ts, "other.k: unit=SECOND requests_per_unit=1")
	waitRules(t, ts, "test.user: unit=MINUTE requests_per_unit=3")
}

func TestReloadBadFileKeepsLastGoodRules(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, nil)
	client := ts.rls(t)
	callUser(t, client, "alice")

	// An unknown unit in a second file: the whole set is rejected.
	writeRules(t, ts.ruleDir, "broken.yaml", "domain: other\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n")
	eventually(t, "config_load_error to count the bad file", func() bool {
		return metricValue(t, ts, "ratelimit_service_config_load_error") == "1"
	})
	if _, body := get(t, ts.debugURL("/rlconfig")); strings.Contains(body, "other.") || !strings.Contains(body, "requests_per_unit=2") {
		t.Errorf("rules after a bad file:\n%s", body)
	}
	if st := callUser(t, client, "alice"); st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 0 {
		t.Errorf("second call on the last good rules: %v, want OK with 0 remaining", st)
	}
	// The last good rules serve: health stays SERVING.
	if got := healthStatus(t, ts.conn(t), ""); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health after a rejected reload = %v, want SERVING", got)
	}
	if code, _ := get(t, ts.httpURL("/healthcheck")); code != http.StatusOK {
		t.Errorf("/healthcheck after a rejected reload = %d, want 200", code)
	}
	if st := callUser(t, client, "alice"); st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("third call: %v, want OVER_LIMIT", st)
	}

	// Fixing the file puts both into service.
	writeRules(t, ts.ruleDir, "broken.yaml", "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	waitRules(t, ts, "other.k: unit=HOUR")
}

// TestReloadConfigMapSymlinkSwap reproduces how the kubelet updates a
// ConfigMap volume: files are symlinks through ..data, which is atomically
// renamed to point at a new timestamped directory.
func TestReloadConfigMapSymlinkSwap(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "config")
	mustDo := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	writeRules(t, filepath.Join(dir, "..2026_11_30_10_00_00.1"), "rules.yaml", limitRules)
	mustDo(os.Symlink("..2026_11_30_10_00_00.1", filepath.Join(dir, "..data")))
	mustDo(os.Symlink("..data/rules.yaml", filepath.Join(dir, "rules.yaml")))

	ts := startWith(t, settingsFor(dir))
	waitRules(t, ts, "test.user: unit=MINUTE requests_per_unit=2")

	writeRules(t, filepath.Join(dir, "..2026_11_30_10_05_00.2"), "rules.yaml", rulesPerMinute("7"))
	mustDo(os.Symlink("..2026_11_30_10_05_00.2", filepath.Join(dir, "..data_tmp")))
	mustDo(os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	mustDo(os.RemoveAll(filepath.Join(dir, "..2026_11_30_10_00_00.1")))

	waitRules(t, ts, "test.user: unit=MINUTE requests_per_unit=7")
	if st := callUser(t, ts.rls(t), "alice"); st.GetCurrentLimit().GetRequestsPerUnit() != 7 {
		t.Errorf("after the swap: %v", st)
	}
	if got := metricValue(t, ts, "ratelimit_service_config_load_error"); got != "0" {
		t.Errorf("config_load_error = %q during a ConfigMap swap, want 0", got)
	}
}

func TestReloadAfterTheDirectoryIsRecreated(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, nil)
	client := ts.rls(t)
	if err := os.RemoveAll(ts.ruleDir); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the failed reload of the missing directory", func() bool {
		return metricValue(t, ts, "ratelimit_service_config_load_error") == "1"
	})
	if st := callUser(t, client, "alice"); st.GetCurrentLimit().GetRequestsPerUnit() != 2 {
		t.Errorf("with the directory gone: %v, want the last good rules", st)
	}
	// The watch on the old directory is gone: the new one is found by the
	// periodic re-watch.
	writeRules(t, ts.ruleDir, "rules.yaml", rulesPerMinute("9"))
	waitRules(t, ts, "test.user: unit=MINUTE requests_per_unit=9")
}

// TestReloadRefusedByTheServiceKeepsLastGoodRules: a rule set that parses
// but that the service cannot serve (a time_buckets window the loader laid
// out with 20 buckets, which WINDOW_BUCKETS=16 does not divide) is refused
// like a malformed file: the last good rules keep serving, SERVING.
func TestReloadRefusedByTheServiceKeepsLastGoodRules(t *testing.T) {
	ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) { s.WindowBuckets = 16 })
	waitRules(t, ts, "test.user: unit=MINUTE requests_per_unit=2")
	writeRules(t, ts.ruleDir, "odd.yaml", "domain: odd\ndescriptors:\n  - key: k\n    rate_limit: {window: 1100ns, requests_per_unit: 1, algorithm: time_buckets}\n")
	eventually(t, "config_load_error to count the refused set", func() bool {
		return metricValue(t, ts, "ratelimit_service_config_load_error") == "1"
	})
	if _, body := get(t, ts.debugURL("/rlconfig")); strings.Contains(body, "odd.") || !strings.Contains(body, "requests_per_unit=2") {
		t.Errorf("rules after a set the service refused:\n%s", body)
	}
	if got := healthStatus(t, ts.conn(t), ""); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health = %v, want SERVING", got)
	}
}

// TestRuntimeRootSwap: with RUNTIME_WATCH_ROOT (the default) replacing
// RUNTIME_ROOT itself, the symlink swap of a Lyft-style deploy, reloads the
// rules from the new target, whose directory is watched from then on.
func TestRuntimeRootSwap(t *testing.T) {
	base := t.TempDir()
	rules := func(rpu int) string {
		return fmt.Sprintf("domain: test\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", rpu)
	}
	writeRules(t, filepath.Join(base, "v1", "config"), "rules.yaml", rules(2))
	writeRules(t, filepath.Join(base, "v2", "config"), "rules.yaml", rules(7))
	root := filepath.Join(base, "current")
	if err := os.Symlink(filepath.Join(base, "v1"), root); err != nil {
		t.Fatal(err)
	}
	s := settingsFor(filepath.Join(root, "config"))
	s.RuntimeRoot, s.RuntimeSubdirectory, s.RuntimeAppDirectory = root, "", "config"
	ts := startWith(t, s)
	waitRules(t, ts, "test.user: unit=MINUTE requests_per_unit=2")

	// The atomic swap: a new link renamed over the old one.
	next := filepath.Join(base, "current.next")
	if err := os.Symlink(filepath.Join(base, "v2"), next); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, root); err != nil {
		t.Fatal(err)
	}
	waitRules(t, ts, "test.user: unit=MINUTE requests_per_unit=7")
	writeRules(t, filepath.Join(base, "v2", "config"), "rules.yaml", rules(9))
	waitRules(t, ts, "test.user: unit=MINUTE requests_per_unit=9")
}
