// Package ruletest is the one helper of Leapgate's tests for rules that
// must load: YAML in, a *descriptors.Set out, or the test stops with the
// loader's file, line and reason. (A test of a refusal calls
// descriptors.Parse itself and checks the error.)
package ruletest

import (
	"testing"

	"github.com/leapgate/leapgate/descriptors"
)

// Parse loads docs as rule files named rulesa.yaml, rulesb.yaml, and so
// on, with opts, and returns the set; if the loader refuses them, t fails
// at once with its error.
func Parse(t testing.TB, opts descriptors.Options, docs ...string) *descriptors.Set {
	t.Helper()
	files := make([]descriptors.File, len(docs))
	for i, d := range docs {
		files[i] = descriptors.File{Name: "rules" + string(rune('a'+i)) + ".yaml", Data: []byte(d)}
	}
	return ParseFiles(t, opts, files...)
}

// ParseFiles is Parse of named files.
func ParseFiles(t testing.TB, opts descriptors.Options, files ...descriptors.File) *descriptors.Set {
	t.Helper()
	set, err := descriptors.Parse(files, opts)
	if err != nil {
		t.Fatalf("rules refused: %v", err)
	}
	return set
}
