package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// faults is the behaviour of the demo upstream; the zero value is fast and
// healthy.
type faults struct {
	// Latency is how long each request waits before it is answered.
	Latency time.Duration `json:"-"`
	// ErrorRate is the probability, in [0,1], of answering ErrorStatus.
	ErrorRate float64 `json:"error_rate"`
	// ErrorStatus is the status of a failed request (500 when 0).
	ErrorStatus int `json:"error_status"`
}

// MarshalJSON writes Latency as a Go duration string ("800ms").
func (f faults) MarshalJSON() ([]byte, error) {
	type plain faults
	return json.Marshal(struct {
		Latency string `json:"latency"`
		plain
	}{Latency: f.Latency.String(), plain: plain(f)})
}

// upstream holds the current faults; handlers read them without locking.
type upstream struct {
	current atomic.Pointer[faults]
	// random returns a number in [0,1) deciding whether a request fails.
	random func() float64
	// sleep waits d or until ctx is done, returning ctx.Err() in that case.
	sleep func(ctx context.Context, d time.Duration) error
}

func newUpstream(random func() float64, sleep func(context.Context, time.Duration) error) *upstream {
	u := &upstream{random: random, sleep: sleep}
	u.current.Store(&faults{ErrorStatus: http.StatusInternalServerError})
	return u
}

// sleepContext waits d, or until ctx is done.
func sleepContext(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// trafficHandler answers every path after the configured latency, failing
// with the configured probability. The query parameters latency and status
// override the settings for one request.
func (u *upstream) trafficHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := *u.current.Load()
		q := r.URL.Query()
		status := http.StatusOK
		if f.ErrorRate > 0 && u.random() < f.ErrorRate {
			status = f.ErrorStatus
		}
		if v := q.Get("latency"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				http.Error(w, fmt.Sprintf("bad latency %q: want a duration such as 800ms", v), http.StatusBadRequest)
				return
			}
			f.Latency = d
		}
		if v := q.Get("status"); v != "" {
			s, err := strconv.Atoi(v)
			if err != nil || s < 200 || s > 599 {
				http.Error(w, fmt.Sprintf("bad status %q: want 200..599", v), http.StatusBadRequest)
				return
			}
			status = s
		}
		if err := u.sleep(r.Context(), f.Latency); err != nil {
			return // client went away
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]any{
			"path":    r.URL.Path,
			"status":  status,
			"latency": f.Latency.String(),
		})
	})
}

// adminHandler serves /faults (GET, PUT/POST, DELETE) and /healthz.
func (u *upstream) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /faults", u.writeFaults)
	mux.HandleFunc("PUT /faults", u.setFaults)
	mux.HandleFunc("POST /faults", u.setFaults)
	mux.HandleFunc("DELETE /faults", func(w http.ResponseWriter, r *http.Request) {
		u.current.Store(&faults{ErrorStatus: http.StatusInternalServerError})
		u.writeFaults(w, r)
	})
	return mux
}

func (u *upstream) writeFaults(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(u.current.Load())
}

// setFaults changes the settings named in the query (or form); the others
// keep their values. Nothing changes if any value is invalid.
func (u *upstream) setFaults(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f := *u.current.Load()
	if v := r.Form.Get("latency"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			http.Error(w, fmt.Sprintf("bad latency %q: want a duration such as 800ms", v), http.StatusBadRequest)
			return
		}
		f.Latency = d
	}
	if v := r.Form.Get("error_rate"); v != "" {
		p, err := strconv.ParseFloat(v, 64)
		if err != nil || p < 0 || p > 1 {
			http.Error(w, fmt.Sprintf("bad error_rate %q: want a number in [0,1]", v), http.StatusBadRequest)
			return
		}
		f.ErrorRate = p
	}
	if v := r.Form.Get("error_status"); v != "" {
		s, err := strconv.Atoi(v)
		if err != nil || s < 400 || s > 599 {
			http.Error(w, fmt.Sprintf("bad error_status %q: want 400..599", v), http.StatusBadRequest)
			return
		}
		f.ErrorStatus = s
	}
	u.current.Store(&f)
	u.writeFaults(w, r)
}
