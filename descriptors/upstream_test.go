package descriptors

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The tests in this file check Leapgate's rule loading against the
// expectations of envoyproxy/ratelimit's test/config/config_test.go, on that
// project's own fixtures (testdata/upstream, Apache-2.0; see its NOTICE).

// upstreamFiles reads fixtures from testdata/upstream.
func upstreamFiles(t *testing.T, names ...string) []File {
	t.Helper()
	var files []File
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join("testdata", "upstream", n))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, File{Name: n, Data: data})
	}
	return files
}

// TestUpstreamErrorFixtures: every malformed fixture is refused with
// upstream's reason, worded as upstream words it ("file: reason"); Leapgate
// may add the line number and detail after it.
func TestUpstreamErrorFixtures(t *testing.T) {
	for _, tt := range []struct {
		files []string
		merge bool
		want  string // upstream's panic message
	}{
		{[]string{"empty_domain.yaml"}, false, "empty_domain.yaml: config file cannot have empty domain"},
		{[]string{"basic_config.yaml", "duplicate_domain.yaml"}, false, "duplicate_domain.yaml: duplicate domain 'test-domain' in config file"},
		{[]string{"empty_key.yaml"}, false, "empty_key.yaml: descriptor has empty key"},
		{[]string{"duplicate_key.yaml"}, false, "duplicate_key.yaml: duplicate descriptor composite key 'test-domain.key1_value1'"},
		{[]string{"merge_domain_key1.yaml", "merge_domain_key1.yaml"}, true, "merge_domain_key1.yaml: duplicate descriptor composite key 'test-domain.key1_value1'"},
		{[]string{"bad_limit_unit.yaml"}, false, "bad_limit_unit.yaml: invalid rate limit unit 'foo'"},
		{[]string{"replaces_self.yaml"}, false, "replaces_self.yaml: replaces should not contain name of same descriptor"},
		{[]string{"replaces_empty.yaml"}, false, "replaces_empty.yaml: should not have an empty replaces entry"},
		{[]string{"bad_yaml.yaml"}, false, "bad_yaml.yaml: error loading config file: yaml: line 2: found unexpected end of stream"},
		{[]string{"misspelled_key.yaml"}, false, "misspelled_key.yaml: config error, unknown key 'ratelimit'"},
		{[]string{"misspelled_key2.yaml"}, false, "misspelled_key2.yaml: config error, unknown key 'requestsperunit'"},
		{[]string{"non_string_key.yaml"}, false, "non_string_key.yaml: config error, key is not of type string: 0.25"},
		{[]string{"non_map_list.yaml"}, false, "non_map_list.yaml: config error, yaml file contains list of type other than map: a"},
		{[]string{"unlimited_with_unit.yaml"}, false, "unlimited_with_unit.yaml: should not specify rate limit unit when unlimited"},
	} {
		t.Run(tt.want, func(t *testing.T) {
			_, err := Parse(upstreamFiles(t, tt.files...), Options{MergeDomains: tt.merge})
			if err == nil {
				t.Fatal("accepted")
			}
			file, reason, _ := strings.Cut(tt.want, ": ")
			for _, e := range unwrapErrors(t, err) {
				if e.File == file && strings.HasPrefix(e.Reason, reason) {
					if !e.lineInReason && e.Line == 0 {
						t.Errorf("%v: no line", e)
					}
					return
				}
			}
			t.Errorf("errors %v, want one %q", err, tt.want)
		})
	}
}

// TestUpstreamLookups: the lookups and stats keys of upstream's
// TestBasicConfig, TestDomainMerge, TestWildcardConfig and
// TestShareThreshold.
func TestUpstreamLookups(t *testing.T) {
	basic, err := Parse(upstreamFiles(t, "basic_config.yaml"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	merged, err := Parse(upstreamFiles(t, "merge_domain_key1.yaml", "merge_domain_key2.yaml"), Options{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	wildcard, err := Parse(upstreamFiles(t, "wildcard.yaml"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	share, err := Parse(upstreamFiles(t, "share_threshold.yaml"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := func(kv ...string) []Entry {
		var out []Entry
		for i := 0; i < len(kv); i += 2 {
			out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	for _, tt := range []struct {
		set     *Set
		domain  string
		entries []Entry
		rpu     uint32 // 0: no limit
		unit    Unit
		metric  string
	}{
		{basic, "foo_domain", nil, 0, 0, ""},
		{basic, "test-domain", nil, 0, 0, ""},
		{basic, "test-domain", e("key1", "something"), 0, 0, ""},
		{basic, "test-domain", e("key1", "value1"), 0, 0, ""},
		{basic, "test-domain", e("key2", "value2", "subkey", "subvalue"), 0, 0, ""},
		{basic, "test-domain", e("key5", "value5", "subkey5", "subvalue"), 0, 0, ""},
		{basic, "test-domain", e("key1", "value1", "subkey1", "something"), 5, UnitSecond, "test-domain.key1_value1.subkey1"},
		{basic, "test-domain", e("key1", "value1", "subkey1", "subvalue1"), 10, UnitSecond, "test-domain.key1_value1.subkey1_subvalue1"},
		{basic, "test-domain", e("key2", "something"), 20, UnitMinute, "test-domain.key2"},
		{basic, "test-domain", e("key2", "value2"), 30, UnitMinute, "test-domain.key2_value2"},
		{basic, "test-domain", e("key2", "value3"), 0, 0, ""},
		{basic, "test-domain", e("key3", "foo"), 1, UnitHour, "test-domain.key3"},
		{basic, "test-domain", e("key4", "foo"), 1, UnitDay, "test-domain.key4"},
		{basic, "test-domain", e("key5", "value5"), 15, UnitDay, "test-domain.key5_value5"},
		{basic, "test-domain", e("key5", "value5", "subkey5", "subvalue5"), 25, UnitDay, "test-domain.key5_value5.subkey5_subvalue5"},
		{merged, "test-domain", e("key1", "value1"), 10, UnitMinute, "test-domain.key1_value1"},
		{merged, "test-domain", e("key2", "value2"), 20, UnitMinute, "test-domain.key2_value2"},
		// TestWildcardConfig.
		{wildcard, "test-domain", e("noVal", "foo1"), 20, UnitMinute, "test-domain.noVal"},
		{wildcard, "test-domain", e("wild", "foo1"), 20, UnitMinute, "test-domain.wild_foo*"},
		{wildcard, "test-domain", e("wild", "foo2"), 20, UnitMinute, "test-domain.wild_foo*"},
		{wildcard, "test-domain", e("nestedWild", "val1", "wild", "goo2"), 20, UnitMinute, "test-domain.nestedWild_val1.wild_goo*"},
		{wildcard, "test-domain", e("wild", "bar"), 0, 0, ""},
		{wildcard, "test-domain", e("noWild", "foo1"), 0, 0, ""},
		// TestShareThreshold.
		{share, "test-domain", e("files", "files/a.txt"), 100, UnitMinute, "test-domain.files_files/*"},
		{share, "test-domain", e("route", "api/v1", "method", "GET"), 60, UnitMinute, "test-domain.route_api/*.method"},
		{share, "test-domain", e("service", "svc/user", "endpoint", "get"), 80, UnitMinute, "test-domain.service_svc/*.endpoint_get"},
		{share, "test-domain", e("nested", "parent", "files", "nested/file1.txt"), 200, UnitMinute, "test-domain.nested_parent.files_nested/*"},
		{share, "test-domain", e("files", "top/file1.txt", "files", "nested/file1.txt"), 300, UnitMinute, "test-domain.files_top/*.files_nested/*"},
		{share, "test-domain", e("path", "path/foo", "file", "file/doc1", "type", "pdf"), 120, UnitMinute, "test-domain.path_path/*.file_file/*.type"},
		{share, "test-domain", e("file", "test1"), 50, UnitMinute, "test-domain.file_test1"},
		{share, "test-domain", e("file", "test2"), 100, UnitMinute, "test-domain.file_test*"},
	} {
		r := tt.set.Match(tt.domain, tt.entries)
		var rpu uint32
		var unit Unit
		if r != nil && len(r.Limits) > 0 {
			rpu, unit = r.Limits[0].RequestsPerUnit, r.Limits[0].Unit
		}
		if rpu != tt.rpu || unit != tt.unit {
			t.Errorf("%s %v: limit %d/%v, want %d/%v", tt.domain, tt.entries, rpu, unit, tt.rpu, tt.unit)
			continue
		}
		if tt.rpu > 0 && r.MetricKey(tt.entries) != tt.metric {
			t.Errorf("%s %v: metric key %q, want %q", tt.domain, tt.entries, r.MetricKey(tt.entries), tt.metric)
		}
	}
}

// TestUpstreamValueToMetric: the stats keys of upstream's
// TestValueToMetric_* tests.
func TestUpstreamValueToMetric(t *testing.T) {
	e := func(kv ...string) []Entry {
		var out []Entry
		for i := 0; i < len(kv); i += 2 {
			out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	routeMethodSubject := `domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
`
	for _, tt := range []struct {
		name    string
		yaml    string
		domain  string
		entries []Entry
		want    string
	}{
		{"UsesRuntimeValuesInStats", routeMethodSubject, "domain", e("route", "draw", "http_method", "GET", "subject_id", "123"),
			"domain.route_draw.http_method_GET.subject_id"},
		{"DefaultKeyIncludesValueAtThatLevel", "domain: d\ndescriptors:\n  - key: k1\n    value_to_metric: true\n    descriptors:\n      - key: k2\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
			"d", e("k1", "A", "k2", "foo"), "d.k1_A.k2"},
		{"MidLevelOnly", "domain: d\ndescriptors:\n  - key: k1\n    descriptors:\n      - key: k2\n        value_to_metric: true\n        descriptors:\n          - key: k3\n            rate_limit: {unit: second, requests_per_unit: 1}\n",
			"d", e("k1", "X", "k2", "Y", "k3", "Z"), "d.k1.k2_Y.k3"},
		{"NoFlag_Unchanged", "domain: d\ndescriptors:\n  - key: k1\n    descriptors:\n      - key: k2\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
			"d", e("k1", "X", "k2", "Y"), "d.k1.k2"},
		{"DoesNotOverrideDetailedMetric", strings.Replace(routeMethodSubject, "          - key: subject_id\n", "          - key: subject_id\n            detailed_metric: true\n", 1),
			"domain", e("route", "draw", "http_method", "GET", "subject_id", "123"), "domain.route_draw.http_method_GET.subject_id_123"},
		{"WithConfiguredValues", "domain: test-domain\ndescriptors:\n  - key: route\n    value_to_metric: true\n    descriptors:\n      - key: http_method\n        value: GET\n        value_to_metric: true\n        descriptors:\n          - key: subject_id\n            rate_limit: {unit: minute, requests_per_unit: 60}\n",
			"test-domain", e("route", "draw", "http_method", "GET", "subject_id", "123"), "test-domain.route_draw.http_method_GET.subject_id"},
		{"WithWildcard", "domain: domain\ndescriptors:\n  - key: user\n    value_to_metric: true\n    descriptors:\n      - key: action\n        value: read*\n        value_to_metric: true\n        descriptors:\n          - key: resource\n            rate_limit: {unit: minute, requests_per_unit: 60}\n",
			"domain", e("user", "alice", "action", "readfile", "resource", "documents"), "domain.user_alice.action_readfile.resource"},
		{"WithEmptyValue/route", routeMethodSubject, "domain", e("route", "", "http_method", "GET", "subject_id", "123"), "domain.route.http_method_GET.subject_id"},
		{"WithEmptyValue/method", routeMethodSubject, "domain", e("route", "draw", "http_method", "", "subject_id", "123"), "domain.route_draw.http_method.subject_id"},
		{"WithEmptyValue/both", routeMethodSubject, "domain", e("route", "", "http_method", "", "subject_id", "123"), "domain.route.http_method.subject_id"},
		{"FullKeyMatchesStatsKey", strings.ReplaceAll(routeMethodSubject, "domain: domain", "domain: test-domain"), "test-domain",
			e("route", "api", "http_method", "GET", "subject_id", "user123"), "test-domain.route_api.http_method_GET.subject_id"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			set, err := Parse([]File{{Name: "inline.yaml", Data: []byte(tt.yaml)}}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			r := set.Match(tt.domain, tt.entries)
			if r == nil {
				t.Fatal("no rule matched")
			}
			if got := r.MetricKey(tt.entries); got != tt.want {
				t.Errorf("metric key %q, want %q", got, tt.want)
			}
		})
	}
}

// TestUpstreamShadowMode: upstream's TestShadowModeConfig, on its
// shadowmode_config.yaml.
func TestUpstreamShadowMode(t *testing.T) {
	set, err := Parse(upstreamFiles(t, "shadowmode_config.yaml"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		entries []Entry
		rpu     uint32
		shadow  bool
	}{
		{[]Entry{{"key1", "value1"}, {"subkey1", "something"}}, 5, false},
		{[]Entry{{"key1", "value1"}, {"subkey1", "subvalue1"}}, 10, true},
	} {
		r := set.Match("test-domain", tt.entries)
		if r == nil || len(r.Limits) == 0 || r.Limits[0].RequestsPerUnit != tt.rpu || r.Limits[0].Unit != UnitSecond || r.ShadowMode != tt.shadow {
			t.Errorf("%v: %+v, want %d/s, shadow %t", tt.entries, r, tt.rpu, tt.shadow)
		}
	}
}
