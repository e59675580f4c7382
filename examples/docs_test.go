package examples

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/leapgate/leapgate/config"
)

// docFiles returns the README and every file of docs/, by path from the
// repository root, with their text.
func docFiles(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, p := range append(paths, "../README.md") {
		files[strings.TrimPrefix(p, "../")] = string(readFile(t, p))
	}
	return files
}

// TestReadmeIsShort: the README is the newcomer's page (at most 30 KB, the
// rest in docs/), and it opens with exactly the two set-up commands.
func TestReadmeIsShort(t *testing.T) {
	text := docFiles(t)["README.md"]
	if len(text) > 30_000 {
		t.Errorf("README.md is %d bytes, want at most 30000 (move the long material into docs/)", len(text))
	}
	_, rest, _ := strings.Cut(text, "```sh\n")
	first, _, _ := strings.Cut(rest, "```")
	if first != "EXAMPLE_RULES=true go run ./cmd/ratelimit\nmake test\n" {
		t.Errorf("the README's first commands are %q, want the run and test commands", first)
	}
}

// slug is GitHub's anchor for a heading.
func slug(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	h = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`).ReplaceAllString(h, "")
	return strings.ReplaceAll(h, " ", "-")
}

// anchors returns the heading anchors of a markdown text (code blocks
// skipped).
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	code := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			code = !code
		}
		if m := regexp.MustCompile(`^#{1,6} (.*)$`).FindStringSubmatch(line); m != nil && !code {
			out[slug(m[1])] = true
		}
	}
	return out
}

// TestDocLinksResolve: every relative link of the README and docs/ names a
// file of the repository and, with #anchor, a heading of that file.
func TestDocLinksResolve(t *testing.T) {
	files := docFiles(t)
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	checked := 0
	for path, text := range files {
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			dest := path
			if file != "" {
				dest = filepath.ToSlash(filepath.Join(filepath.Dir(path), file))
			}
			data, err := os.ReadFile(filepath.Join("..", dest))
			if err != nil {
				t.Errorf("%s: link %s: %v", path, target, err)
				continue
			}
			if anchor != "" && !anchors(string(data))[anchor] {
				t.Errorf("%s: link %s: no heading #%s in %s", path, target, anchor, dest)
			}
			checked++
		}
	}
	if checked < 50 {
		t.Fatalf("checked %d links, want the docs' links (at least 50)", checked)
	}
}

// envVars returns every setting's variable and its default tag, walking
// config.Settings and its nested structs.
func envVars(t reflect.Type, out map[string]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Type.Kind() == reflect.Struct && f.Tag.Get("envconfig") == "" {
			envVars(f.Type, out)
			continue
		}
		if name := f.Tag.Get("envconfig"); name != "" {
			out[name] = f.Tag.Get("default")
		}
	}
}

// TestSettingsTableMatchesConfig: docs/settings.md lists every variable
// config reads, no other, each with its default as config sets it; the
// README's table of the settings that matter most is a part of it, with the
// same defaults.
func TestSettingsTableMatchesConfig(t *testing.T) {
	want := map[string]string{}
	envVars(reflect.TypeFor[config.Settings](), want)
	if len(want) < 30 {
		t.Fatalf("found %d settings in config, want them all", len(want))
	}
	documented := checkSettingsTable(t, "docs/settings.md", want)
	for name := range want {
		if !documented[name] {
			t.Errorf("docs/settings.md does not document %s", name)
		}
	}
	if n := len(checkSettingsTable(t, "README.md", want)); n < 10 {
		t.Errorf("read %d settings from the README's table", n)
	}
}

// checkSettingsTable checks the settings table of the doc file against
// config's variables and defaults (want) and returns the names it lists.
func checkSettingsTable(t *testing.T, file string, want map[string]string) map[string]bool {
	t.Helper()
	text := docFiles(t)[file]
	documented := map[string]bool{}
	tick := regexp.MustCompile("`([^`]*)`")
	for _, line := range strings.Split(text, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		var names []string
		for _, m := range tick.FindAllStringSubmatch(cells[1], -1) {
			if strings.ToUpper(m[1]) != m[1] || strings.ContainsAny(m[1], " .{/") {
				names = nil // a table of something else (metrics, fields)
				break
			}
			names = append(names, m[1])
		}
		defaults := strings.Split(strings.TrimSpace(cells[2]), ", ")
		for i, name := range names {
			documented[name] = true
			def, known := want[name]
			if !known {
				t.Errorf("%s documents %s, which config does not read", file, name)
				continue
			}
			if len(defaults) != len(names) {
				continue // a default written in words for several variables
			}
			// A default is the backticked value; words ("empty", "system
			// roots") stand for an empty default.
			got := ""
			if m := tick.FindStringSubmatch(defaults[i]); m != nil {
				got = m[1]
			}
			if got != def {
				t.Errorf("%s: %s defaults to %q, config to %q", file, name, got, def)
			}
		}
	}
	return documented
}
