package main

import (
	"strings"
	"testing"

	"github.com/leapgate/leapgate/internal/redistest"
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

// TestRunOnReplicas: -replicas 2 runs the scenarios on two replicas
// sharing the given Redis, leaving out the restart scenario, and scores
// them as one server's (the no-waste row uses the limit); -replicas with
// -addr is refused.
func TestRunOnReplicas(t *testing.T) {
	r := redistest.Start(t)
	var out strings.Builder
	if err := run([]string{"-reports", "1s", "-replicas", "2", "-redis", r.Addr()}, &out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	if strings.Contains(text, "restart") || !strings.Contains(text, "| no waste (20, 20, 20, 1000/s), 1s reports | 0.9") {
		t.Fatalf("output:\n%s\nwant every scenario but the restart, the no-waste one near the limit", text)
	}
	if err := run([]string{"-replicas", "2", "-addr", "127.0.0.1:1"}, &out); err == nil {
		t.Error("-replicas with -addr was accepted")
	}
}
