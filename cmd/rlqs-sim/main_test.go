package main

import (
	"strings"
	"testing"
)

// TestRunPrintsOneRowPerScenario: the in-process run prints the table
// header and one row per scenario the filter selects.
func TestRunPrintsOneRowPerScenario(t *testing.T) {
	var out strings.Builder
	if err := run([]string{"-reports", "1s", "-run", "^(join|leave)"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[2], "| join") || !strings.HasPrefix(lines[3], "| leave") {
		t.Fatalf("output:\n%s\nwant a header and the join and leave rows", out.String())
	}
	if err := run([]string{"-reports", "soon"}, &out); err == nil {
		t.Error("a malformed -reports was accepted")
	}
}
