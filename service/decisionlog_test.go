package service

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/leapgate/leapgate/internal/envoyhdr"
)

// Refused descriptors are logged at debug level, one JSON line each, with
// the rule but not the request's value (unless the rule has
// detailed_metric), and a flood is cut to decisionLinesPerSecond.
func TestDecisionLog(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h := newHarness(t, mustParse(t, testRules), func(o *Options) { o.Logger = logger })
	h.call(req("test", desc("ban", "secret-value"), desc("k", "exact")))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d lines, want 1: %s", len(lines), buf.String())
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &got); err != nil {
		t.Fatal(err)
	}
	if got["msg"] != "refused" || got["level"] != "DEBUG" || got["domain"] != "test" || got["rule"] != "test.ban" ||
		got["descriptor"] != 0.0 || got["limit"] != 0.0 || got["reason"] != envoyhdr.ReasonRateLimited {
		t.Errorf("decision line %v", got)
	}
	if strings.Contains(buf.String(), "secret-value") {
		t.Error("the request's value was logged")
	}

	// A flood is cut to decisionLinesPerSecond lines a second of the
	// clock; the next second's first line says how many were left out.
	for _, flood := range []int{decisionLinesPerSecond, decisionLinesPerSecond + 7} {
		h.clock.Advance(time.Second)
		buf.Reset()
		h.call(req("test", desc("ban", "x"))) // opens the second's budget
		if flood == decisionLinesPerSecond && strings.Contains(buf.String(), "left out") {
			t.Errorf("left-out line after a second that left none out: %s", buf.String())
		}
		buf.Reset()
		for range flood - 1 {
			h.call(req("test", desc("ban", "x")))
		}
		if n := strings.Count(buf.String(), `"msg":"refused"`); n != decisionLinesPerSecond-1 {
			t.Errorf("flood of %d: %d lines after the first, want %d", flood, n, decisionLinesPerSecond-1)
		}
		h.clock.Advance(999 * time.Millisecond) // not yet the next second
		h.call(req("test", desc("ban", "x")))
		if strings.Contains(buf.String(), "left out") {
			t.Errorf("flood of %d: left-out line within the second", flood)
		}
		buf.Reset()
		h.clock.Advance(time.Millisecond)
		h.call(req("test", desc("ban", "x")))
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		wantLines, wantLeftOut := 1, ""
		if left := flood + 1 - decisionLinesPerSecond; left > 0 {
			wantLines, wantLeftOut = 2, fmt.Sprintf(`"count":%d`, left)
		}
		if len(lines) != wantLines || !strings.Contains(lines[0], cmp.Or(wantLeftOut, `"msg":"refused"`)) {
			t.Errorf("flood of %d: next second logged %q, want %d lines (left out: %q)", flood, lines, wantLines, wantLeftOut)
		}
	}

	// Not at info level: nothing.
	buf.Reset()
	quiet := newHarness(t, mustParse(t, testRules), func(o *Options) { o.Logger = slog.New(slog.NewJSONHandler(&buf, nil)) })
	quiet.call(req("test", desc("ban", "x")))
	if buf.Len() != 0 {
		t.Errorf("logged at info level: %s", buf.String())
	}
}
