package descriptors

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/leapgate/leapgate/window"
)

const extensionRules = `
domain: ext
descriptors:
  - key: user
    shadow_mode: true
    quota_mode: true
    detailed_metric: true
    metadata:
      team: payments
      tier: 2
    rate_limit:
      name: per_user
      unit: Second
      requests_per_unit: 10
      replaces:
        - name: global
    rate_limits:
      - unit: minute
        unit_multiplier: 5
        requests_per_unit: 300
        buckets: 30
        algorithm: time_buckets
      - window: 90m
        requests_per_unit: 10000 # the sliding_log maximum
        algorithm: sliding_log
      - window: 1500ms
        requests_per_unit: 2
        algorithm: fixed_window
  - key: ban
    rate_limit: {unit: DAY, requests_per_unit: 0}
  - key: everyone
    rate_limit: {unlimited: true, name: global}
  - key: upstream
    circuit_breaker:
      strategy: slow_request_ratio
      threshold: 0.5
      max_response_time: 250ms
      min_requests: 20
      window: 30s
      buckets: 15
      open_duration: 10s
      half_open_probes: 3
      probe_timeout: 2s
  - key: flaky
    circuit_breaker:
      strategy: error_ratio
      threshold: 1
      error_statuses: [500, 503]
`

func TestParseExtensions(t *testing.T) {
	s := mustParse(t, File{Name: "ext.yaml", Data: []byte(extensionRules)})

	user := s.Rule("ext.user")
	if user == nil {
		t.Fatal("no rule ext.user")
	}
	wantLimits := []Limit{
		{Name: "per_user", RequestsPerUnit: 10, Unit: UnitSecond, UnitMultiplier: 1},
		{RequestsPerUnit: 300, Unit: UnitMinute, UnitMultiplier: 5, Buckets: 30, Algorithm: window.TimeBuckets},
		{RequestsPerUnit: 10000, Unit: UnitMinute, UnitMultiplier: 90, Length: 90 * time.Minute, Algorithm: window.SlidingLog},
		{RequestsPerUnit: 2, Unit: UnitSecond, UnitMultiplier: 1, Length: 1500 * time.Millisecond, Algorithm: window.FixedWindow},
	}
	if !reflect.DeepEqual(layoutless(user.Limits), wantLimits) {
		t.Errorf("Limits:\n got %+v\nwant %+v", user.Limits, wantLimits)
	}
	for i, want := range []time.Duration{time.Second, 5 * time.Minute, 90 * time.Minute, 1500 * time.Millisecond} {
		if got := user.Limits[i].Window(); got != want {
			t.Errorf("Limits[%d].Window() = %v, want %v", i, got, want)
		}
	}
	if !user.ShadowMode || !user.QuotaMode || !user.DetailedMetric || user.ValueToMetric || user.ShareThreshold {
		t.Errorf("flags: %+v", user)
	}
	if !reflect.DeepEqual(user.Replaces, []string{"global"}) {
		t.Errorf("Replaces = %v", user.Replaces)
	}
	if !reflect.DeepEqual(user.Metadata, map[string]any{"team": "payments", "tier": 2}) {
		t.Errorf("Metadata = %#v", user.Metadata)
	}
	if user.File != "ext.yaml" || user.Line != 4 {
		t.Errorf("position = %s:%d, want ext.yaml:4", user.File, user.Line)
	}
	if !reflect.DeepEqual(user.Names(), []string{"per_user"}) {
		t.Errorf("Names() = %v", user.Names())
	}

	ban := s.Rule("ext.ban")
	if len(ban.Limits) != 1 || ban.Limits[0].RequestsPerUnit != 0 || ban.Limits[0].Unit != UnitDay {
		t.Errorf("ban limits = %+v", ban.Limits)
	}

	everyone := s.Rule("ext.everyone")
	if !everyone.Unlimited || len(everyone.Limits) != 0 || !reflect.DeepEqual(everyone.Names(), []string{"global"}) {
		t.Errorf("unlimited rule = %+v, names %v", everyone, everyone.Names())
	}

	spec := func(length time.Duration, buckets int) window.Spec {
		sp, err := window.NewSpec(length, buckets)
		if err != nil {
			t.Fatal(err)
		}
		return sp
	}
	wantSlow := &Breaker{
		Strategy: SlowRequestRatio, Threshold: 0.5, MaxResponseTime: 250 * time.Millisecond,
		MinRequests: 20, Spec: spec(30*time.Second, 15), OpenDuration: 10 * time.Second, MaxOpenDuration: 10 * time.Second,
		HalfOpenProbes: 3, ProbeTimeout: 2 * time.Second,
	}
	if got := s.Rule("ext.upstream").Breaker; !reflect.DeepEqual(got, wantSlow) {
		t.Errorf("upstream breaker = %+v, want %+v", got, wantSlow)
	}
	wantDefaults := &Breaker{
		Strategy: ErrorRatio, Threshold: 1, ErrorStatuses: []int{500, 503},
		Spec: spec(DefaultBreakerWindow, DefaultBreakerBuckets), OpenDuration: DefaultBreakerOpenDuration,
		MaxOpenDuration: DefaultBreakerOpenDuration, HalfOpenProbes: 1, ProbeTimeout: 5 * time.Second,
	}
	if got := s.Rule("ext.flaky").Breaker; !reflect.DeepEqual(got, wantDefaults) {
		t.Errorf("flaky breaker = %+v, want %+v", got, wantDefaults)
	}
}

func TestReportingUnit(t *testing.T) {
	tests := []struct {
		window time.Duration
		unit   Unit
		mult   uint32
	}{
		{30 * time.Second, UnitSecond, 30},
		{2 * time.Minute, UnitMinute, 2},
		{90 * time.Minute, UnitMinute, 90},
		{48 * time.Hour, UnitDay, 2},
		{14 * 24 * time.Hour, UnitWeek, 2},
		{60 * 24 * time.Hour, UnitMonth, 2},
		{365 * 24 * time.Hour, UnitYear, 1},
		{500 * time.Millisecond, UnitSecond, 1},
		{math.MaxUint32 * time.Second, UnitSecond, math.MaxUint32}, // the largest multiplier
		{(math.MaxUint32 + 1) * time.Second, UnitSecond, 1},        // too many seconds to report
	}
	for _, tt := range tests {
		u, m := reportingUnit(tt.window)
		if u != tt.unit || m != tt.mult {
			t.Errorf("reportingUnit(%v) = %v×%d, want %v×%d", tt.window, u, m, tt.unit, tt.mult)
		}
	}
}

func TestUnits(t *testing.T) {
	for _, name := range []string{"second", "MINUTE", "Hour", "day", "week", "month", "year"} {
		u, ok := ParseUnit(name)
		if !ok || !strings.EqualFold(u.String(), name) || u.Duration() == 0 {
			t.Errorf("ParseUnit(%q) = %v, %v", name, u, ok)
		}
	}
	for _, name := range []string{"", "unknown", "fortnight", "seconds"} {
		if u, ok := ParseUnit(name); ok {
			t.Errorf("ParseUnit(%q) = %v, want error", name, u)
		}
	}
	if UnitWeek != 7 || UnitYear != 6 {
		t.Error("unit numbering differs from Envoy's enum")
	}
}

func TestParseCollectsEveryError(t *testing.T) {
	_, err := Parse([]File{
		{Name: "a.yaml", Data: []byte("domain: a\ndescriptors:\n  - key: x\n    ratelimit: {}\n  - key: \"\"\n")},
		{Name: "b.yaml", Data: []byte("domain: a\n")},
		{Name: "c.yaml", Data: []byte("domain: c\ndescriptors: [{key: y, rate_limit: {unit: eon}}]\n")},
		{Name: "d.yaml", Data: []byte("domain: [\n")},
	}, Options{})
	var got []string
	for _, e := range unwrapErrors(t, err) {
		got = append(got, e.Error())
	}
	want := []string{
		"a.yaml:4: config error, unknown key 'ratelimit'",
		"a.yaml:5: descriptor has empty key",
		"b.yaml:1: duplicate domain 'a' in config file (first defined at a.yaml:1)",
		"c.yaml:2: invalid rate limit unit 'eon'",
		"d.yaml: error loading config file: yaml: line 2: did not find expected node content",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("errors:\n got %q\nwant %q", got, want)
	}
}

func TestParseEmpty(t *testing.T) {
	for _, data := range []string{"", "# only a comment\n", "---\n"} {
		_, err := Parse([]File{{Name: "e.yaml", Data: []byte(data)}}, Options{})
		errs := unwrapErrors(t, err)
		if len(errs) != 1 || errs[0].Reason != "config file cannot have empty domain" || errs[0].File != "e.yaml" {
			t.Errorf("Parse(%q, Options{}) = %v, want empty domain error", data, err)
		}
	}
	s, err := Parse(nil, Options{})
	if err != nil || s == nil || len(s.Rules()) != 0 {
		t.Errorf("Parse(nil, Options{}) = %v, %v; want an empty set", s, err)
	}
}

func TestLoadFSSelectsFiles(t *testing.T) {
	// Every file whose name does not start with a dot is a rule file, as
	// envoyproxy/ratelimit reads them: a ConfigMap key such as
	// "ratelimit-config" is not skipped silently.
	fsys := fstest.MapFS{
		"config/a.yaml":            {Data: []byte("domain: a\n")},
		"config/b.yml":             {Data: []byte("domain: b\n")},
		"config/team/c.yaml":       {Data: []byte("domain: c\n")},
		"config/ratelimit-config":  {Data: []byte("domain: d\n")},
		"config/e.json":            {Data: []byte(`{"domain": "e"}`)},
		"config/.hidden.yaml":      {Data: []byte("not yaml: [")},
		"config/.git/x.yaml":       {Data: []byte("not yaml: [")},
		"config/..data/a.yaml":     {Data: []byte("domain: a\n")},
		"config/team/.old.yml":     {Data: []byte("not yaml: [")},
		"elsewhere/other.yaml":     {Data: []byte("not yaml: [")},
		"elsewhere/ratelimit.conf": {Data: []byte("not yaml: [")},
	}
	s, err := LoadFS(fsys, "config", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Domains(); !reflect.DeepEqual(got, []string{"a", "b", "c", "d", "e"}) {
		t.Errorf("Domains() = %v, want [a b c d e]", got)
	}
	// A stray file that is not a rule file is refused loudly, not skipped.
	fsys["config/README.txt"] = &fstest.MapFile{Data: []byte("not yaml: [")}
	if _, err := LoadFS(fsys, "config", Options{}); err == nil || !strings.Contains(err.Error(), "config/README.txt") {
		t.Errorf("a stray README.txt: %v, want an error naming it", err)
	}
	_, err = LoadFS(fsys, "missing", Options{})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing dir: %v, want fs.ErrNotExist", err)
	}
}

// TestMergeDomains: with MergeDomains a domain split across files is one
// domain, a descriptor defined in two files is still refused; without it
// the second definition is refused. (upstream_test.go runs upstream's own
// merge fixtures.)
func TestMergeDomains(t *testing.T) {
	key1 := File{Name: "merge_domain_key1.yaml", Data: []byte(`domain: test-domain
descriptors:
  - key: key1
    rate_limit:
      unit: minute
      requests_per_unit: 10
`)}
	key2 := File{Name: "merge_domain_key2.yaml", Data: []byte(`domain: test-domain
descriptors:
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
`)}
	again := File{Name: "again.yaml", Data: []byte("domain: test-domain\ndescriptors:\n  - key: key1\n    rate_limit: {unit: second, requests_per_unit: 1}\n")}

	s, err := Parse([]File{key1, key2}, Options{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]uint32{"key1": 10, "key2": 20} {
		r := s.Match("test-domain", []Entry{{Key: key, Value: "x"}})
		if r == nil || len(r.Limits) != 1 || r.Limits[0].RequestsPerUnit != want || r.ID != "test-domain."+key {
			t.Errorf("%s: %+v, want %d/min", key, r, want)
		}
	}
	if got := s.Domains(); !reflect.DeepEqual(got, []string{"test-domain"}) {
		t.Errorf("Domains() = %v", got)
	}

	for _, tt := range []struct {
		name  string
		files []File
		opts  Options
		want  string
	}{
		{"not merged", []File{key1, key2}, Options{}, "merge_domain_key2.yaml:1: duplicate domain 'test-domain' in config file (first defined at merge_domain_key1.yaml:1)"},
		{"merged, duplicate key", []File{key1, key2, again}, Options{MergeDomains: true}, "again.yaml:3: duplicate descriptor composite key 'test-domain.key1' (first at merge_domain_key1.yaml:3)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.files, tt.opts)
			if err == nil || err.Error() != tt.want {
				t.Errorf("error %v, want %q", err, tt.want)
			}
		})
	}
}

// TestLoadKubernetesConfigMap mounts rules the way the kubelet does: the
// files are symlinks into a ..data symlink to a timestamped dot-directory.
func TestLoadKubernetesConfigMap(t *testing.T) {
	dir := t.TempDir()
	ts := filepath.Join(dir, "..2026_11_30_12_00_00.000000001")
	must(t, os.Mkdir(ts, 0o755))
	must(t, os.WriteFile(filepath.Join(ts, "rules.yaml"), []byte("domain: k8s\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(ts, "broken.yaml"), []byte("domain: [\n"), 0o644))
	must(t, os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")))
	must(t, os.Symlink(filepath.Join("..data", "rules.yaml"), filepath.Join(dir, "rules.yaml")))
	// A symlink to a directory is not followed.
	must(t, os.Symlink(ts, filepath.Join(dir, "linked.yaml")))

	s, err := Load(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := s.Match("k8s", []Entry{{Key: "k", Value: "v"}})
	if r == nil || r.File != filepath.Join(dir, "rules.yaml") {
		t.Fatalf("Match = %+v, want the rule from %s", r, filepath.Join(dir, "rules.yaml"))
	}

	// A dangling symlink is reported as an *Error with the file, together
	// with the errors of the other files.
	must(t, os.Symlink("nowhere.yaml", filepath.Join(dir, "dangling.yaml")))
	must(t, os.WriteFile(filepath.Join(dir, "zz.yaml"), []byte("domain: \"\"\n"), 0o644))
	_, err = Load(dir, Options{})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("dangling symlink: %v, want fs.ErrNotExist inside", err)
	}
	errs := unwrapErrors(t, err)
	if len(errs) != 2 || errs[0].File != filepath.Join(dir, "dangling.yaml") ||
		!strings.HasPrefix(errs[0].Reason, "error reading config file: ") ||
		errs[1].File != filepath.Join(dir, "zz.yaml") {
		t.Errorf("errors = %v", err)
	}
}

func TestLoadReportsFullPath(t *testing.T) {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "bad.yml"), []byte("domain: d\ndescriptors:\n  - key: a\n    ratelimit: {}\n"), 0o644))
	_, err := Load(dir, Options{})
	errs := unwrapErrors(t, err)
	if len(errs) != 1 || errs[0].File != filepath.Join(dir, "bad.yml") || errs[0].Line != 4 {
		t.Errorf("Load: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing"), Options{}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing dir: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestParseHostileYAML covers inputs found by FuzzParse or built to attack
// the loader: alias cycles and alias explosions must end quickly with an
// error, and the error list stays bounded.
func TestParseHostileYAML(t *testing.T) {
	bomb := "domain: d\na: &a [{key: k}, {key: k}, {key: k}, {key: k}, {key: k}, {key: k}, {key: k}, {key: k}, {key: k}, {key: k}]\n"
	prev := "a"
	for _, l := range []string{"b", "c", "e", "f", "g", "h"} {
		bomb += fmt.Sprintf("%s: &%s [", l, l)
		for i := 0; i < 10; i++ {
			bomb += fmt.Sprintf("{key: k%d, descriptors: *%s}, ", i, prev)
		}
		bomb += "]\n"
		prev = l
	}
	bomb += "descriptors: *h\n" // 10^7 descriptors once expanded
	tests := []struct {
		name  string
		input string
		first string // the first error
	}{
		{"root alias cycle", "&a {domain: d, descriptors: [*a]}",
			"x.yaml:1: config error, unknown key 'domain'"},
		{"descriptors alias cycle", "domain: d\ndescriptors: &a [{key: k, descriptors: *a}, {key: j, descriptors: *a}]\n",
			"x.yaml:2: config error, descriptors refer to themselves through a YAML alias"},
		{"domain alias cycle", "domain: &a [*a]\n",
			"x.yaml:1: config error, domain must be a string, got a list"},
		{"metadata alias cycle", "domain: d\ndescriptors:\n - key: a\n   metadata: &m {x: *m}\n",
			"x.yaml:4: error parsing metadata: yaml: anchor 'm' value contains itself"},
		{"alias explosion", bomb, "x.yaml:2: config error, unknown key 'a'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]File{{Name: "x.yaml", Data: []byte(tt.input)}}, Options{})
			errs := unwrapErrors(t, err)
			if len(errs) == 0 || errs[0].Error() != tt.first {
				t.Fatalf("first error = %v, want %q", err, tt.first)
			}
			if len(errs) > 2*maxErrors+2 {
				t.Errorf("%d errors reported, want at most %d", len(errs), 2*maxErrors+2)
			}
		})
	}
}

// TestLongestUnitMultiplier: the longest window unit_multiplier can make
// of a unit, 106751 days (what a time.Duration holds), loads, with its
// unit and multiplier kept as written; one day more is refused
// (testdata/errors/unit_multiplier_overflow.yaml).
func TestLongestUnitMultiplier(t *testing.T) {
	yaml := "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: day\n      unit_multiplier: 106751\n      requests_per_unit: 1\n"
	s, err := Parse([]File{{Name: "d.yaml", Data: []byte(yaml)}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	l := s.Rule("d.a").Limits[0]
	if l.Unit != UnitDay || l.UnitMultiplier != 106751 || l.Spec.Length() != 106751*24*time.Hour {
		t.Errorf("limit %+v, want 106751 days", l)
	}
}

// TestNullFields: a field left empty (YAML null), as a template often
// leaves one, loads as if it were absent, as envoyproxy/ratelimit's YAML
// decoding takes it: no error, and the rule it belongs to is the same.
func TestNullFields(t *testing.T) {
	for _, tt := range []struct {
		name, yaml string
		rules      int
	}{
		{"descriptors", "domain: d\ndescriptors:\n", 0},
		{"descriptors ~", "domain: d\ndescriptors: ~\n", 0},
		{"nested descriptors", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n", 0},
		{"rate_limit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n", 0},
		{"rate_limits", "domain: d\ndescriptors:\n  - key: a\n    rate_limits: null\n", 0},
		{"metadata", "domain: d\ndescriptors:\n  - key: a\n    metadata:\n    rate_limit: {unit: second, requests_per_unit: 1}\n", 1},
		{"value and shadow_mode", "domain: d\ndescriptors:\n  - key: a\n    value:\n    shadow_mode:\n    rate_limit: {unit: second, requests_per_unit: 1}\n", 1},
		{"error_statuses", "domain: d\ndescriptors:\n  - key: a\n    circuit_breaker: {strategy: error_ratio, threshold: 0.5, error_statuses: }\n", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse([]File{{Name: "null.yaml", Data: []byte(tt.yaml)}}, Options{})
			if err != nil {
				t.Fatalf("%v", err)
			}
			if got := len(s.Rules()); got != tt.rules {
				t.Errorf("%d rules, want %d", got, tt.rules)
			}
		})
	}
}
