package main

import (
	"bufio"
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

const floodRules = `domain: flood
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: log
    rate_limit: {unit: hour, requests_per_unit: 10000, algorithm: sliding_log}
`

// defaultMaxMemoryBytes is MAX_MEMORY_BYTES's default (config pins it).
const defaultMaxMemoryBytes = 128 << 20

// TestBinaryFloodMemory floods the real binary, with default settings, with
// distinct 4 KiB values: on a value-less rule (each key a 256-byte
// counter, whatever the value's length), and on a sliding_log rule of limit
// 10,000 (each key an 80 KB log: 100,000 of them would be 8 GB, so
// MAX_MEMORY_BYTES must evict). The process's peak RSS (VmHWM) stays under
// 300 MiB for the first; for the second, under twice MAX_MEMORY_BYTES (the
// garbage collector's headroom at GOGC=100) plus 128 MiB (measured 304 and
// 320 MiB: the runtime's own memory and freed spans not yet returned vary
// from run to run). A hot key hammered
// through each flood keeps exactly its count.
func TestBinaryFloodMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 250,000 requests of 4 KiB")
	}
	root := ruleRoot(t, floodRules)
	rb := startBinary(t, nil, "RUNTIME_ROOT="+root)
	client := rb.dial(t)
	t.Logf("RSS at start: %d MiB", rss(t, rb.cmd.Process.Pid, "VmRSS")>>20)

	for _, c := range []struct {
		key      string
		n        int
		limit    uint32
		rssBound int64
	}{
		{"user", 150_000, 100, 300 << 20},
		{"log", 100_000, 10_000, 2*defaultMaxMemoryBytes + 128<<20},
	} {
		ask := func(value string) *rlsv3.RateLimitResponse {
			resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "flood",
				Descriptors: []*rlcommonv3.RateLimitDescriptor{{Entries: []*rlcommonv3.RateLimitDescriptor_Entry{{Key: c.key, Value: value}}}}})
			if err != nil {
				t.Error(err)
				return nil
			}
			return resp
		}
		pad := strings.Repeat("x", 4096-8)
		var next atomic.Int64
		var hotCalls, hotAdmitted atomic.Int64
		var hotMu sync.Mutex // hot calls in order, so remaining can be checked
		evicted := false     // reported once
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for {
					i := next.Add(1)
					if i > int64(c.n) {
						return
					}
					ask(pad + strconv.FormatInt(i, 16))
					if i%250 == 0 {
						hotMu.Lock()
						resp := ask("hot")
						n := hotCalls.Add(1)
						if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
							hotAdmitted.Add(1)
						}
						// Nothing is recorded once over, so the remaining
						// quota is the limit less the admitted calls.
						if want := c.limit - uint32(min(n, int64(c.limit))); resp.GetStatuses()[0].GetLimitRemaining() != want && !evicted {
							evicted = true
							t.Errorf("hot key call %d (after %d requests): remaining %d, want %d (its counter was evicted)", n, i, resp.GetStatuses()[0].GetLimitRemaining(), want)
						}
						hotMu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		peak := rss(t, rb.cmd.Process.Pid, "VmHWM")
		t.Logf("%s: %d distinct 4 KiB values: peak RSS %d MiB; hot key admitted %d of %d", c.key, c.n, peak>>20, hotAdmitted.Load(), hotCalls.Load())
		if peak > c.rssBound {
			t.Errorf("%s flood: peak RSS %d MiB, bound %d MiB", c.key, peak>>20, c.rssBound>>20)
		}
		if want := min(hotCalls.Load(), int64(c.limit)); hotAdmitted.Load() != want {
			t.Errorf("%s: hot key admitted %d, want exactly %d", c.key, hotAdmitted.Load(), want)
		}
	}
}

// rss reads a size field (VmRSS, VmHWM) of /proc/pid/status, in bytes.
func rss(t *testing.T, pid int, field string) int64 {
	t.Helper()
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", field, err)
		}
		return kb << 10
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
