package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeSleeper records the delays the handler asks for instead of waiting.
type fakeSleeper struct {
	mu     sync.Mutex
	delays []time.Duration
}

func (s *fakeSleeper) sleep(_ context.Context, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delays = append(s.delays, d)
	return nil
}

func (s *fakeSleeper) last(t *testing.T) time.Duration {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.delays) == 0 {
		t.Fatal("handler never slept")
	}
	return s.delays[len(s.delays)-1]
}

func do(t *testing.T, h http.Handler, method, target string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	return rec
}

func TestTrafficFollowsAdminSettings(t *testing.T) {
	tests := []struct {
		name        string
		admin       string // PUT /faults query; "" for none
		adminStatus int
		random      float64
		target      string
		wantStatus  int
		wantDelay   time.Duration
	}{
		{name: "default is fast and healthy", random: 0, target: "/api/x", wantStatus: 200},
		{name: "latency", admin: "latency=800ms", adminStatus: 200, target: "/checkout", wantStatus: 200, wantDelay: 800 * time.Millisecond},
		{name: "always failing", admin: "error_rate=1", adminStatus: 200, random: 0.99, target: "/", wantStatus: 500},
		{name: "failing with chosen status", admin: "error_rate=0.5&error_status=503", adminStatus: 200, random: 0.2, target: "/", wantStatus: 503},
		{name: "error rate not hit", admin: "error_rate=0.5", adminStatus: 200, random: 0.7, target: "/", wantStatus: 200},
		{name: "per-request overrides", target: "/x?latency=1.5s&status=502", wantStatus: 502, wantDelay: 1500 * time.Millisecond},
		{name: "bad latency rejected, settings kept", admin: "latency=fast", adminStatus: 400, target: "/", wantStatus: 200},
		{name: "bad error rate rejected", admin: "error_rate=2&latency=1s", adminStatus: 400, target: "/", wantStatus: 200},
		{name: "bad error status rejected", admin: "error_status=200", adminStatus: 400, target: "/", wantStatus: 200},
		{name: "bad per-request latency", target: "/?latency=-1s", wantStatus: 400},
		{name: "bad per-request status", target: "/?status=99", wantStatus: 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s fakeSleeper
			u := newUpstream(func() float64 { return tt.random }, s.sleep)
			if tt.admin != "" {
				rec := do(t, u.adminHandler(), http.MethodPut, "/faults?"+tt.admin)
				if rec.Code != tt.adminStatus {
					t.Fatalf("PUT /faults?%s = %d %s, want %d", tt.admin, rec.Code, rec.Body, tt.adminStatus)
				}
			}
			rec := do(t, u.trafficHandler(), http.MethodGet, tt.target)
			if rec.Code != tt.wantStatus {
				t.Fatalf("GET %s = %d %s, want %d", tt.target, rec.Code, rec.Body, tt.wantStatus)
			}
			if tt.wantStatus == 400 {
				return
			}
			if got := s.last(t); got != tt.wantDelay {
				t.Errorf("slept %v, want %v", got, tt.wantDelay)
			}
			var body map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if body["status"] != float64(tt.wantStatus) {
				t.Errorf("body status = %v, want %d", body["status"], tt.wantStatus)
			}
		})
	}
}

func TestAdminGetAndReset(t *testing.T) {
	var s fakeSleeper
	u := newUpstream(func() float64 { return 0 }, s.sleep)
	admin := u.adminHandler()

	if rec := do(t, admin, http.MethodPost, "/faults?latency=250ms&error_rate=0.25&error_status=504"); rec.Code != 200 {
		t.Fatalf("POST /faults = %d %s", rec.Code, rec.Body)
	}
	rec := do(t, admin, http.MethodGet, "/faults")
	want := `{"latency":"250ms","error_rate":0.25,"error_status":504}`
	if got := strings.TrimSpace(rec.Body.String()); got != want {
		t.Errorf("GET /faults = %s, want %s", got, want)
	}
	rec = do(t, admin, http.MethodDelete, "/faults")
	want = `{"latency":"0s","error_rate":0,"error_status":500}`
	if got := strings.TrimSpace(rec.Body.String()); got != want {
		t.Errorf("DELETE /faults = %s, want %s", got, want)
	}
	if rec := do(t, admin, http.MethodGet, "/healthz"); rec.Code != 200 {
		t.Errorf("GET /healthz = %d", rec.Code)
	}
}

func TestSleepContextStopsWhenClientLeaves(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := sleepContext(ctx, time.Hour); err != context.Canceled {
		t.Fatalf("sleepContext on a cancelled context = %v, want context.Canceled", err)
	}
	if err := sleepContext(context.Background(), 0); err != nil {
		t.Fatalf("sleepContext(0) = %v", err)
	}
}

// TestRunServesUntilCancelled starts the real listeners on loopback ports.
func TestRunServesUntilCancelled(t *testing.T) {
	traffic, admin := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, discardLogger(), traffic, admin) }()

	waitOK(t, "http://"+admin+"/healthz")
	req, _ := http.NewRequest(http.MethodPut, "http://"+admin+"/faults?error_rate=1&error_status=503", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp, err = http.Get("http://" + traffic + "/api/hello")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Errorf("traffic after error_rate=1: %d, want 503", resp.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}
