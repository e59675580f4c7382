package logthrottle

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestThrottle(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, nil))
	now := time.Unix(1000, 0)
	th := Throttle{Now: func() time.Time { return now }}
	lines := func() []map[string]any {
		var out []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if l == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatal(err)
			}
			out = append(out, m)
		}
		return out
	}
	for _, step := range []struct {
		at         time.Duration
		calls      int
		lines      int     // in all, after the step
		suppressed float64 // on the last line, 0 for none
	}{
		{0, 1, 1, 0},
		{time.Second, 10, 1, 0},                  // within the interval: counted only
		{Interval - time.Nanosecond, 1, 1, 0},    // still within
		{Interval, 1, 2, 11},                     // the next line says how many were held back
		{Interval + time.Second, 1, 2, 11},       // within again
		{3 * Interval, 1, 3, 1},                  // much later
		{3*Interval + time.Millisecond, 0, 3, 1}, // nothing logged, nothing counted
	} {
		now = time.Unix(1000, 0).Add(step.at)
		for range step.calls {
			th.Warn(logger, "backend failed", "err", "boom")
		}
		got := lines()
		if len(got) != step.lines {
			t.Fatalf("at %v: %d lines, want %d", step.at, len(got), step.lines)
		}
		last := got[len(got)-1]
		if n, _ := last["suppressed"].(float64); n != step.suppressed {
			t.Errorf("at %v: suppressed %v, want %v", step.at, last["suppressed"], step.suppressed)
		}
	}
}

func TestThrottleConcurrent(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), nil))
	now := time.Unix(1000, 0)
	th := Throttle{Now: func() time.Time { return now }}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				th.Warn(logger, "x")
			}
		})
	}
	wg.Wait()
	if n := strings.Count(buf.String(), "\n"); n != 1 {
		t.Errorf("%d lines from 800 calls at one instant, want 1", n)
	}
	if got := th.suppressed.Load(); got != 799 {
		t.Errorf("suppressed %d, want 799", got)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
