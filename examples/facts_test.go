package examples

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/leapgate/leapgate/window"
)

// TestBlocksAsTheDocsStateThem: the docs state window.Blocks as a number
// (ceil(limit/106), 106 blocks, ...) where a reader needs it; every such
// mention is the constant's value, so changing it fails here, naming each
// place to update.
func TestBlocksAsTheDocsStateThem(t *testing.T) {
	mention := regexp.MustCompile(`ceil\(limit/(\d+)\)|limit/(\d+)\x60|(\d+) blocks|ring of (\d+) |limit / (\d+)\)|\((\d+) is|q/(\d+)\)|any (\d+) consecutive`)
	n := 0
	for path, text := range docFiles(t) {
		for i, line := range strings.Split(text, "\n") {
			for _, m := range mention.FindAllStringSubmatch(line, -1) {
				for _, g := range m[1:] {
					if g == "" {
						continue
					}
					n++
					if v, _ := strconv.Atoi(g); v != window.Blocks {
						t.Errorf("%s:%d states %d for window.Blocks, which is %d: %q", path, i+1, v, window.Blocks, m[0])
					}
				}
			}
		}
	}
	if n < 5 {
		t.Fatalf("found %d mentions of window.Blocks; the pattern no longer matches the docs", n)
	}
}

// TestRedisKeyTable: docs/redis.md's table of Redis keys names every
// algorithm of window's table with its key suffix, as the store builds it.
func TestRedisKeyTable(t *testing.T) {
	text := docFiles(t)["docs/redis.md"]
	row := regexp.MustCompile("(?m)^\\| `(\\w+)`[^|]*\\| `P\\{key\\}([^`]*)` \\|")
	got := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(text, -1) {
		got[m[1]] = m[2]
	}
	for _, a := range window.Algorithms() {
		info := a.Info()
		suffix, ok := got[info.Name]
		if !ok {
			t.Errorf("docs/redis.md's key table has no row for %s", info.Name)
			continue
		}
		if suffix != info.KeySuffix {
			t.Errorf("docs/redis.md: %s keys end in %q, the store's in %q", info.Name, suffix, info.KeySuffix)
		}
	}
	if len(got) != len(window.Algorithms()) {
		t.Errorf("docs/redis.md's key table has %d rows, window %d algorithms: %v", len(got), len(window.Algorithms()), got)
	}
}
