package server_test

import (
	"net"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/internal/redistest"
)

// TestNewReleasesWhatItBuiltOnFailure: a New that fails late (here: its
// gRPC port is taken) stops what it had started: the OTLP exporter, the
// Redis backend's health check and connections, the rule watcher. No
// goroutine is left.
func TestNewReleasesWhatItBuiltOnFailure(t *testing.T) {
	r := redistest.Start(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := filepath.Join(t.TempDir(), "rules")
	writeRules(t, dir, "a.yaml", limitRules)
	s := settingsFor(dir)
	s.BackendType, s.Redis.URL = config.BackendRedis, r.Addr()
	s.GRPCPort = taken.Addr().(*net.TCPAddr).Port
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1") // never reached: nothing is traced

	before := runtime.NumGoroutine()
	for range 3 {
		if _, err := newServerErr(t, s); err == nil {
			t.Fatal("New succeeded on a taken port")
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines before, %d after three failed News:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
