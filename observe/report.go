package observe

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/leapgate/leapgate/breaker"
	"github.com/leapgate/leapgate/descriptors"
)

// MaxReportBytes is the largest JSON body the report endpoint accepts.
const MaxReportBytes = 64 << 10

// Report is the http.Handler of POST /report: callers that are not Envoy
// report the outcome of one upstream call as JSON,
//
//	{"resource": "orders", "route": "checkout", "response_time_ms": 120,
//	 "status": 200, "error": false, "headers": {"x-user-id": "42"}}
//
// resource is the upstream, an alias of cluster (it meets the breakers of
// destination_cluster descriptors); route and headers are optional entries
// (see breaker.Mapping). The response time is response_time_ms (a number)
// or response_time (a Go duration such as "120ms"); status is the HTTP
// status; error marks a failed call and aborted a call that got no response.
// At least one of resource, cluster or route, and at least one of a
// response time, status, error or aborted are required. A report without a
// response time is not counted by slow_request_ratio breakers.
//
// Answers: 204 when counted, 400 with a reason for a malformed report, 405
// for a method other than POST, 413 for a body over MaxReportBytes.
type Report struct {
	reg *breaker.Registry
}

// NewReport returns the report handler feeding opts.Registry (only the
// Registry is used).
func NewReport(opts Options) *Report { return &Report{reg: opts.Registry} }

type reportBody struct {
	Resource       string            `json:"resource"`
	Cluster        string            `json:"cluster"`
	Route          string            `json:"route"`
	ResponseTimeMs *float64          `json:"response_time_ms"`
	ResponseTime   *string           `json:"response_time"`
	Status         *int              `json:"status"`
	Error          bool              `json:"error"`
	Aborted        bool              `json:"aborted"`
	Headers        map[string]string `json:"headers"`
}

// ServeHTTP handles one report.
func (h *Report) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "report: use POST", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxReportBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			http.Error(w, fmt.Sprintf("report: body larger than %d bytes", MaxReportBytes), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "report: reading body: "+err.Error(), http.StatusBadRequest)
		return
	}
	obs, timed, err := parseReport(body)
	if err != nil {
		http.Error(w, "report: "+err.Error(), http.StatusBadRequest)
		return
	}
	var buf [8]breaker.Target
	targets := h.reg.Targets(buf[:0], &obs)
	if !timed { // no response time: not evidence for or against slowness
		kept := targets[:0]
		for _, t := range targets {
			if !t.Breaker().Config().Strategy.Timed() {
				kept = append(kept, t)
			}
		}
		targets = kept
	}
	h.reg.ObserveTargets(targets, obs)
	w.WriteHeader(http.StatusNoContent)
}

// parseReport validates a report body; timed reports whether it carried a
// response time.
func parseReport(data []byte) (obs breaker.Observation, timed bool, err error) {
	var b reportBody
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return obs, false, fmt.Errorf("invalid JSON: %w", err)
	}
	if dec.More() {
		return obs, false, errors.New("invalid JSON: more than one value")
	}
	if b.Resource != "" && b.Cluster != "" && b.Resource != b.Cluster {
		return obs, false, errors.New("resource and cluster name different upstreams (resource is an alias of cluster)")
	}
	obs = breaker.Observation{Cluster: b.Cluster, Route: b.Route, Error: b.Error, Aborted: b.Aborted, Source: breaker.SourceReport}
	if obs.Cluster == "" {
		obs.Cluster = b.Resource
	}
	if obs.Cluster == "" && obs.Route == "" {
		return obs, false, errors.New("one of resource, cluster or route is required")
	}
	switch {
	case b.ResponseTimeMs != nil && b.ResponseTime != nil:
		return obs, false, errors.New("give response_time_ms or response_time, not both")
	case b.ResponseTimeMs != nil:
		ms := *b.ResponseTimeMs
		if ms < 0 || math.IsNaN(ms) || ms > float64(math.MaxInt64/int64(time.Millisecond)) {
			return obs, false, fmt.Errorf("response_time_ms %v must be a non-negative number of milliseconds", ms)
		}
		obs.ResponseTime, timed = time.Duration(ms*float64(time.Millisecond)), true
	case b.ResponseTime != nil:
		d, err := time.ParseDuration(*b.ResponseTime)
		if err != nil || d < 0 {
			return obs, false, fmt.Errorf("response_time %q must be a non-negative duration such as \"120ms\"", *b.ResponseTime)
		}
		obs.ResponseTime, timed = d, true
	}
	if b.Status != nil {
		if *b.Status < 100 || *b.Status > 599 {
			return obs, false, fmt.Errorf("status %d is not an HTTP status", *b.Status)
		}
		obs.Status = *b.Status
	}
	if !timed && b.Status == nil && !b.Error && !b.Aborted {
		return obs, false, errors.New("nothing to report: give a response time, status, error or aborted")
	}
	for name, value := range b.Headers {
		obs.Headers = append(obs.Headers, descriptors.Entry{Key: strings.ToLower(name), Value: value})
	}
	return obs, timed, nil
}
