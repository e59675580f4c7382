package examples

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/leapgate/leapgate/internal/figures"
)

// TestFigureCommandsExist: every measured figure of the docs is a block of
// docs/benchmarks.md or docs/accuracy.md, written by its command (it
// carries the stamp make figures writes), and every command names what
// exists: a make target, a directory to cd into, a tool under cmd/, and
// for go test the packages and, for -bench and -run, at least one
// benchmark or test of theirs that the pattern matches.
func TestFigureCommandsExist(t *testing.T) {
	makefile := string(readFile(t, "../Makefile"))
	n := 0
	for _, doc := range []string{"docs/benchmarks.md", "docs/accuracy.md", "docs/rlqs.md"} {
		blocks, err := figures.Parse(string(readFile(t, "../"+doc)))
		if err != nil {
			t.Fatalf("%s: %v", doc, err)
		}
		for _, b := range blocks {
			n++
			if b.Stamp == "" {
				t.Errorf("%s: %q was never run (no stamp): run make figures FIGURES=...", doc, b.Command)
			}
			checkCommand(t, doc, b.Command, makefile)
		}
	}
	if n < 10 {
		t.Fatalf("only %d figure blocks", n)
	}
}

// checkCommand checks every step of a shell command: cd, make, go test and
// go run; the filters after a pipe are ordinary tools.
func checkCommand(t *testing.T, doc, command, makefile string) {
	t.Helper()
	dir := ".."
	for _, step := range strings.Split(strings.SplitN(command, " | ", 2)[0], "&&") {
		words := strings.Fields(step)
		if i := slices.Index(words, "2>&1"); i >= 0 {
			words = words[:i]
		}
		switch {
		case len(words) == 0:
		case words[0] == "cd":
			dir = filepath.Join(dir, words[1])
			if _, err := os.Stat(dir); err != nil {
				t.Errorf("%s: %q: no directory %s", doc, command, words[1])
			}
		case words[0] == "make":
			for _, w := range words[1:] {
				if strings.HasPrefix(w, "-") || strings.Contains(w, "=") {
					continue
				}
				if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(w) + `:`).MatchString(makefile) {
					t.Errorf("%s: %q: no make target %s", doc, command, w)
				}
			}
		case len(words) > 2 && words[0] == "go" && words[1] == "run":
			if _, err := os.Stat(filepath.Join(dir, words[2])); err != nil {
				t.Errorf("%s: %q: no tool %s", doc, command, words[2])
			}
		case len(words) > 2 && words[0] == "go" && words[1] == "test":
			checkGoTest(t, doc, command, dir, words[2:])
		default:
			t.Errorf("%s: %q: a step this test cannot check: %q", doc, command, step)
		}
	}
}

// checkGoTest checks go test's packages and its -bench and -run patterns.
func checkGoTest(t *testing.T, doc, command, dir string, args []string) {
	t.Helper()
	patterns := map[string]string{}
	var pkgs []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if (a == "-bench" || a == "-run") && i+1 < len(args) {
			patterns[a] = strings.Trim(args[i+1], `'"`)
			i++
			continue
		}
		if strings.HasPrefix(a, "./") || a == "." {
			pkgs = append(pkgs, strings.TrimSuffix(strings.TrimSuffix(a, "/..."), "/"))
		}
	}
	if len(pkgs) == 0 {
		pkgs = []string{"."}
	}
	var sources strings.Builder
	for _, p := range pkgs {
		files, _ := filepath.Glob(filepath.Join(dir, p, "*_test.go"))
		if len(files) == 0 {
			t.Errorf("%s: %q: no tests in %s", doc, command, p)
		}
		for _, f := range files {
			sources.Write(readFile(t, f))
		}
	}
	for flag, kind := range map[string]string{"-bench": "Benchmark", "-run": "Test"} {
		pattern, ok := patterns[flag]
		if !ok || pattern == "^$" || pattern == "XXX" {
			continue
		}
		re, err := regexp.Compile(pattern)
		if err != nil {
			t.Errorf("%s: %q: %s %v", doc, command, flag, err)
			continue
		}
		found := false
		for _, m := range regexp.MustCompile(`(?m)^func (`+kind+`\w+)\(`).FindAllStringSubmatch(sources.String(), -1) {
			for _, part := range strings.Split(pattern, "|") {
				if sub, err := regexp.Compile(part); err == nil && sub.MatchString(m[1]) && re.MatchString(m[1]) {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("%s: %q: %s %s matches no %s of %v", doc, command, flag, pattern, kind, pkgs)
		}
	}
}
