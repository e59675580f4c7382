package examples

import (
	"go/build"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestArchitectureArrowsPointDown: docs/architecture.md's table of layers
// lists each package once, every package those import is in it, and a
// package imports only packages below it in the table (tests aside), so
// the map stays true.
func TestArchitectureArrowsPointDown(t *testing.T) {
	const module = "github.com/leapgate/leapgate/"
	text := docFiles(t)["docs/architecture.md"]
	_, table, _ := strings.Cut(text, "## The layers")
	table, _, _ = strings.Cut(strings.TrimLeft(table, "\n"), "\n\n")
	rank := map[string]int{}
	row := 0
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.Contains(cells[2], "`") {
			continue
		}
		row++
		for _, m := range regexp.MustCompile("`([a-z/]+)`").FindAllStringSubmatch(cells[2], -1) {
			if _, dup := rank[m[1]]; dup {
				t.Errorf("%s is listed twice", m[1])
			}
			rank[m[1]] = row
		}
	}
	if len(rank) < 10 {
		t.Fatalf("read %d packages from the table: %v", len(rank), rank)
	}
	for pkg, r := range rank {
		p, err := build.ImportDir(filepath.Join("..", pkg), 0)
		if err != nil {
			t.Errorf("%s: %v", pkg, err)
			continue
		}
		for _, imp := range p.Imports {
			dep, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			depRank, listed := rank[dep]
			switch {
			case !listed:
				t.Errorf("%s imports %s, which the table does not list", pkg, dep)
			case depRank <= r:
				t.Errorf("%s (row %d) imports %s (row %d): arrows must point down", pkg, r, dep, depRank)
			}
		}
	}
}
