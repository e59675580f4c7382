package service

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

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

	// A flood is bounded.
	buf.Reset()
	for range 3 * decisionLinesPerSecond {
		h.call(req("test", desc("ban", "x")))
	}
	if n := strings.Count(buf.String(), `"msg":"refused"`); n > decisionLinesPerSecond*2 {
		t.Errorf("%d lines for %d refusals, want at most %d a second", n, 3*decisionLinesPerSecond, decisionLinesPerSecond)
	}

	// Not at info level: nothing.
	buf.Reset()
	quiet := newHarness(t, mustParse(t, testRules), func(o *Options) { o.Logger = slog.New(slog.NewJSONHandler(&buf, nil)) })
	quiet.call(req("test", desc("ban", "x")))
	if buf.Len() != 0 {
		t.Errorf("logged at info level: %s", buf.String())
	}
}
