package redisstore

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/leapgate/leapgate/internal/logthrottle"
)

// TestClientLogLines: a go-redis line is one JSON object with one "msg"
// (its text is under "detail"), and a dial failure repeated while Redis is
// down is logged once per interval, with the count held back.
func TestClientLogLines(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	c := clientLogger{logger: slog.New(slog.NewJSONHandler(&buf, nil)), throttle: &logthrottle.Throttle{Now: func() time.Time { return now }}}
	for range 3 {
		c.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %s", 1, "refused")
	}
	now = now.Add(logthrottle.Interval)
	c.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %s", 1, "refused")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), buf.String())
	}
	for i, l := range lines {
		if n := strings.Count(l, `"msg":`); n != 1 {
			t.Errorf("line %d has %d msg keys: %s", i, n, l)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		if m["msg"] != "redis client" || !strings.Contains(m["detail"].(string), "failed to dial after 1 attempts: refused") {
			t.Errorf("line %d: %v", i, m)
		}
	}
	if !strings.Contains(lines[1], `"suppressed":2`) {
		t.Errorf("second line does not count the 2 held back: %s", lines[1])
	}
}
