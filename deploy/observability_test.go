// Package deploy_test checks what deploy/ ships against a running server:
// the metrics follow Prometheus conventions (promtool check metrics), the
// alert rules are valid and unit-tested (promtool check rules, test rules),
// and every query of the alerts and the dashboard names a metric the server
// exports.
package deploy_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"gopkg.in/yaml.v3"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/internal/redistest"
	"github.com/leapgate/leapgate/internal/tooltest"
	"github.com/leapgate/leapgate/server"
)

const rules = `domain: shop
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: destination_cluster
    value: backend
    circuit_breaker: {strategy: error_count, threshold: 1, min_requests: 1, window: 1h, open_duration: 1h}
`

// scrape starts a server on Redis (failure mode local, so that the
// in-memory backend is there too) with a rate limit and a breaker, sends
// traffic that uses every part (admitted, refused, a breaker opened by a
// report and refusing), and returns its /metrics in the text format.
func scrape(t *testing.T) string {
	t.Helper()
	redistest.Need(t)
	r := redistest.Start(t)
	dir := filepath.Join(t.TempDir(), "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	s := config.Defaults()
	s.GRPCHost, s.Host, s.DebugHost, s.ReportHost = "127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1"
	s.GRPCPort, s.Port, s.DebugPort, s.ReportPort = 0, 0, 0, 0
	s.RuntimeRoot, s.RuntimeSubdirectory, s.RuntimeAppDirectory = filepath.Dir(dir), "", "config"
	s.BackendType, s.Redis.URL, s.Redis.Timeout, s.Redis.FailureMode = config.BackendRedis, r.Addr(), 2*time.Second, config.RedisFailLocal
	srv, err := server.New(s, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	cc, err := grpc.NewClient(srv.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := rlsv3.NewRateLimitServiceClient(cc)
	call := func(key, value string) {
		_, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlcommonv3.RateLimitDescriptor{
			{Entries: []*rlcommonv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}},
		}})
		if err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		call("user", "alice") // OK, OK, OVER_LIMIT
	}
	resp, err := http.Post("http://"+srv.ReportAddr().String()+"/report", "application/json", strings.NewReader(`{"cluster":"backend","status":503,"response_time_ms":12}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	call("destination_cluster", "backend") // refused by the open breaker

	resp, err = http.Get("http://" + srv.HTTPAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// upstreamNames are the metrics named as envoyproxy/ratelimit names them
// (its Prometheus mapping), which dashboards depend on: the only ones
// allowed to break Prometheus conventions.
var upstreamNames = map[string]bool{
	"ratelimit_service_config_load_error":       true,
	"ratelimit_service_config_load_success":     true,
	"ratelimit_service_domain_not_found":        true,
	"ratelimit_service_global_shadow_mode":      true,
	"ratelimit_service_rate_limit_near_limit":   true,
	"ratelimit_service_rate_limit_over_limit":   true,
	"ratelimit_service_rate_limit_shadow_mode":  true,
	"ratelimit_service_rate_limit_total_hits":   true,
	"ratelimit_service_rate_limit_within_limit": true,
	"ratelimit_service_should_rate_limit_error": true,
	"ratelimit_service_total_requests":          true,
}

func TestDeployedObservability(t *testing.T) {
	exported := scrape(t)
	types := exportedTypes(exported)

	t.Run("promtool check metrics: only upstream's names break conventions", func(t *testing.T) {
		promtool := tooltest.Path(t, "promtool")
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(exported)
		out, _ := cmd.CombinedOutput() // exit status 1 with any finding
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if line == "" {
				continue
			}
			name, _, _ := strings.Cut(line, " ")
			if !upstreamNames[name] {
				t.Errorf("promtool check metrics: %s", line)
			}
		}
	})

	t.Run("alert rules: promtool check and test rules, metrics exported", func(t *testing.T) {
		promtool := tooltest.Path(t, "promtool")
		for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
			cmd := exec.Command(promtool, args...)
			cmd.Dir = "prometheus"
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
		var file struct {
			Groups []struct {
				Rules []struct {
					Alert string `yaml:"alert"`
					Expr  string `yaml:"expr"`
				} `yaml:"rules"`
			} `yaml:"groups"`
		}
		readYAML(t, "prometheus/alerts.yml", &file)
		n := 0
		for _, g := range file.Groups {
			for _, r := range g.Rules {
				n++
				checkExported(t, "alert "+r.Alert, r.Expr, types)
			}
		}
		if n < 8 {
			t.Errorf("%d alert rules, want at least 8", n)
		}
	})

	t.Run("dashboard: every query parses and names exported metrics", func(t *testing.T) {
		var d struct {
			Templating struct {
				List []struct {
					Name string `json:"name"`
					Type string `json:"type"`
				} `json:"list"`
			} `json:"templating"`
			Panels []struct {
				Type    string `json:"type"`
				Title   string `json:"title"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		data, err := os.ReadFile("grafana/dashboards/leapgate.json")
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &d); err != nil {
			t.Fatal(err)
		}
		vars := map[string]string{}
		for _, v := range d.Templating.List {
			vars[v.Name] = v.Type
		}
		if vars["datasource"] != "datasource" || vars["domain"] == "" || vars["instance"] == "" {
			t.Errorf("template variables %v: want datasource (a data source variable), domain and instance", vars)
		}
		// Grafana's variables as Prometheus would see them once filled in.
		fill := strings.NewReplacer("$__rate_interval", "5m", "$domain", ".*", "$instance", ".*")
		var exprs []string
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				checkExported(t, "panel "+p.Title, tg.Expr, types)
				exprs = append(exprs, fill.Replace(tg.Expr))
			}
		}
		if len(exprs) < 10 {
			t.Errorf("%d queries in the dashboard, want its panels' queries", len(exprs))
		}
		// Each query as a recording rule, for promtool's PromQL parser.
		promtool := tooltest.Path(t, "promtool")
		type rule struct {
			Record string `yaml:"record"`
			Expr   string `yaml:"expr"`
		}
		var rs []rule
		for i, e := range exprs {
			rs = append(rs, rule{Record: "dashboard:query" + string(rune('a'+i%26)) + ":" + strings.Repeat("x", i/26+1), Expr: e})
		}
		out, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rs}}})
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(t.TempDir(), "dashboard-queries.yml")
		if err := os.WriteFile(f, out, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput(); err != nil {
			t.Errorf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
		}
	})
}

// exportedTypes maps every metric family of a text exposition to its type.
func exportedTypes(exposition string) map[string]string {
	types := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (\S+) (\S+)$`).FindAllStringSubmatch(exposition, -1) {
		types[m[1]] = m[2]
	}
	return types
}

var (
	promqlStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promqlNumbers  = regexp.MustCompile(`\b[0-9][0-9.e+]*(?:ms|[smhdwy])?\b`)
	promqlToken    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(?`)
	promqlKeywords = map[string]bool{"and": true, "or": true, "unless": true, "offset": true, "bool": true, "inf": true, "nan": true}
)

// metricNames returns the metric names a PromQL expression reads: its
// identifiers that are not functions, keywords, label names or durations.
func metricNames(expr string) []string {
	e := promqlStrings.ReplaceAllString(expr, `""`)
	e = promqlMatchers.ReplaceAllString(e, "")
	e = promqlGrouping.ReplaceAllString(e, "")
	e = promqlRanges.ReplaceAllString(e, "")
	e = promqlNumbers.ReplaceAllString(e, "")
	e = regexp.MustCompile(`\{\{[^}]*\}\}`).ReplaceAllString(e, "")
	var names []string
	for _, tok := range promqlToken.FindAllString(e, -1) {
		name := strings.TrimSpace(tok)
		if strings.HasSuffix(name, "(") || promqlKeywords[strings.ToLower(name)] {
			continue
		}
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// checkExported fails unless every metric expr reads is exported (a
// histogram's or summary's _bucket, _count and _sum series by its family).
func checkExported(t *testing.T, where, expr string, types map[string]string) {
	t.Helper()
	names := metricNames(expr)
	if len(names) == 0 {
		t.Errorf("%s: no metric found in %q", where, expr)
	}
	for _, n := range names {
		if _, ok := types[n]; ok {
			continue
		}
		found := false
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			if base, ok := strings.CutSuffix(n, suffix); ok && (types[base] == "histogram" || types[base] == "summary") {
				found = true
			}
		}
		if !found {
			t.Errorf("%s reads %s, which the server does not export", where, n)
		}
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func TestMetricNames(t *testing.T) {
	for _, tt := range []struct {
		expr string
		want []string
	}{
		{`sum by (le) (rate(x_bucket{a="b",c=~"$d"}[5m])) / sum(rate(y_total[1h] offset 1h)) or vector(0)`, []string{"x_bucket", "y_total"}},
		{"histogram_quantile(0.99, sum by (instance, le) (rate(leapgate_redis_call_duration_seconds_bucket[5m]))) > 0.05", []string{"leapgate_redis_call_duration_seconds_bucket"}},
		{"max by (rule) (leapgate_breaker_state) >= 1\nand\ncount(up == 0)", []string{"leapgate_breaker_state", "up"}},
		{`topk(10, sum without (key) (a:b:c{x="{not}"}))`, []string{"a:b:c"}},
	} {
		if got := metricNames(tt.expr); strings.Join(got, " ") != strings.Join(tt.want, " ") {
			t.Errorf("metricNames(%q) = %v, want %v", tt.expr, got, tt.want)
		}
	}
}
