package redisstore

import (
	"io/fs"
	"slices"
	"strings"
	"testing"

	"github.com/leapgate/leapgate/window"
)

// Every algorithm of window's table has its script, lua/<name>.lua, which
// registers its table under its injected number and defines every method
// batch.lua and undo call; no script is left over, and no script names an
// algorithm by a bare number.
func TestEveryAlgorithmHasItsScript(t *testing.T) {
	want := []string{"batch.lua", "checkpoint.lua", "common.lua"}
	for _, a := range window.Algorithms() {
		name := a.String() + ".lua"
		want = append(want, name)
		src := luaFile(a.String())
		if !strings.Contains(src, "ALGS["+luaName(a)+"] = ") {
			t.Errorf("%s does not register its table as ALGS[%s]", name, luaName(a))
		}
		for _, method := range []string{"load", "allow", "refund", "write", "rollback", "settle", "undo"} {
			if !strings.Contains(src, "."+method+"(") {
				t.Errorf("%s has no %s", name, method)
			}
		}
	}
	entries, err := fs.ReadDir(luaFiles, "lua")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
		src := luaFile(strings.TrimSuffix(e.Name(), ".lua"))
		for _, bare := range []string{"alg == ", "alg ~= ", "alg = 0", "alg = 1", "alg = 2", "alg = 3", "alg = 4", "alg = 5"} {
			if strings.Contains(src, bare) {
				t.Errorf("%s compares or sets an algorithm by number (%q): use its ALG_ name", e.Name(), bare)
			}
		}
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("lua/ holds %v, want %v", got, want)
	}
	if !strings.Contains(code(false), "local CP_TICKS") && !strings.Contains(code(false), "CP_TICKS, LIBRARY") {
		t.Fatal("CP_TICKS is not injected")
	}
}

// TestRedisKeysAreStable pins the Redis key of every algorithm's counter:
// the prefix, the request key as the hash tag, the algorithm's suffix. It
// is persisted state: a change resets every counter on deploy.
func TestRedisKeysAreStable(t *testing.T) {
	s := &Store{prefix: "lg_"}
	want := map[window.Algorithm]string{
		window.SlidingWindow: "lg_{k\x00v}:sw",
		window.TokenBucket:   "lg_{k\x00v}:tb",
		window.FixedWindow:   "lg_{k\x00v}:fw",
		window.SlidingLog:    "lg_{k\x00v}:lz",
		window.TimeBuckets:   "lg_{k\x00v}",
		window.Concurrency:   "lg_{k\x00v}:cz",
	}
	for _, a := range window.Algorithms() {
		if got := s.counterKey(&window.Request{Key: "k\x00v", Algorithm: a}); got != want[a] {
			t.Errorf("%v: key %q, want %q", a, got, want[a])
		}
	}
}
