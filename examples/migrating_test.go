package examples

import (
	"bufio"
	"os"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestMigratingListsEveryUpstreamSetting: docs/migrating.md has a row for
// every variable envoyproxy/ratelimit reads (config/testdata lists them).
func TestMigratingListsEveryUpstreamSetting(t *testing.T) {
	doc := docFiles(t)["docs/migrating.md"]
	f, err := os.Open("../config/testdata/upstream_settings.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" || strings.HasPrefix(name, "#") {
			continue
		}
		if !strings.Contains(doc, "| `"+name+"` |") {
			t.Errorf("docs/migrating.md has no row for upstream's %s", name)
		}
	}
}

// relabelRule is the part of a Prometheus relabel_config the migration
// rules use.
type relabelRule struct {
	SourceLabels []string `yaml:"source_labels"`
	Regex        string   `yaml:"regex"`
	TargetLabel  string   `yaml:"target_label"`
	Replacement  string   `yaml:"replacement"`
	Action       string   `yaml:"action"`
}

// TestMigratingRelabelRules applies the documented metric_relabel_configs
// as Prometheus does (source values joined by ";", the regex anchored at
// both ends, RE2 as in Prometheus) to Leapgate's labels and checks they give
// upstream's key1 and key2.
func TestMigratingRelabelRules(t *testing.T) {
	doc := docFiles(t)["docs/migrating.md"]
	_, rest, ok := strings.Cut(doc, "```yaml\nmetric_relabel_configs:")
	if !ok {
		t.Fatal("docs/migrating.md has no metric_relabel_configs block")
	}
	block, _, _ := strings.Cut(rest, "```")
	var rules []relabelRule
	if err := yaml.Unmarshal([]byte(block), &rules); err != nil {
		t.Fatal(err)
	}
	apply := func(labels map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range labels {
			out[k] = v
		}
		for _, r := range rules {
			re := regexp.MustCompile("^(?:" + r.Regex + ")$")
			switch r.Action {
			case "", "replace":
				var vals []string
				for _, l := range r.SourceLabels {
					vals = append(vals, out[l])
				}
				src := strings.Join(vals, ";")
				if m := re.FindStringSubmatchIndex(src); m != nil {
					out[r.TargetLabel] = string(re.ExpandString(nil, r.Replacement, src, m))
				}
			case "labeldrop":
				for k := range out {
					if re.MatchString(k) {
						delete(out, k)
					}
				}
			default:
				t.Fatalf("action %q not covered by this test", r.Action)
			}
		}
		return out
	}
	for _, tt := range []struct {
		key        string
		key1, key2 string
	}{
		{"test.user", "user", ""},
		{"test.key1_value1.subkey1", "key1_value1", "subkey1"},
		{"edge.generic_key_api.user.path_/x", "generic_key_api", "user"},
	} {
		got := apply(map[string]string{"__name__": "ratelimit_service_rate_limit_total_hits", "domain": "test", "key": tt.key})
		if got["key1"] != tt.key1 || got["key2"] != tt.key2 || got["key"] != "" || got["domain"] != "test" {
			t.Errorf("key=%q relabelled to %v, want key1=%q key2=%q and no key", tt.key, got, tt.key1, tt.key2)
		}
	}
	// Other metrics are left alone (but for the key label, which only the
	// rule metrics have).
	if got := apply(map[string]string{"__name__": "leapgate_memory_keys"}); len(got) != 1 {
		t.Errorf("leapgate_memory_keys relabelled to %v", got)
	}
}
