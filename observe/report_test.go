package observe

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/leapgate/leapgate/breaker"
)

// observations reads leapgate_breaker_observations_total{source}.
func observations(t testing.TB, e *breakerEnv, source string) float64 {
	t.Helper()
	families, err := e.prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "leapgate_breaker_observations_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "source" && l.GetValue() == source {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func postReport(h http.Handler, method, body string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, "/report", strings.NewReader(body)))
	return rec
}

func TestReportValidation(t *testing.T) {
	e := newBreakerEnv(t)
	h := NewReport(Options{Registry: e.reg})
	tests := []struct {
		body string
		code int
		want string // in the 400 reason
	}{
		{`{"resource":"orders","response_time_ms":12.5,"status":200}`, 204, ""},
		{`{"cluster":"orders","response_time":"120ms","status":503}`, 204, ""},
		{`{"resource":"orders","cluster":"orders","error":true}`, 204, ""},
		{`{"route":"checkout","aborted":true}`, 204, ""},
		{`{"resource":"orders","headers":{"X-User-Id":"carol"},"status":200}`, 204, ""},
		{`{"resource":"nobody-configured","status":200}`, 204, ""},
		{``, 400, "invalid JSON"},
		{`{`, 400, "invalid JSON"},
		{`[]`, 400, "invalid JSON"},
		{`{"resource":"orders","status":200} {}`, 400, "more than one value"},
		{`{"resource":"orders","latency":5}`, 400, "unknown field"},
		{`{"status":200}`, 400, "one of resource, cluster or route"},
		{`{"resource":"a","cluster":"b","status":200}`, 400, "different upstreams"},
		{`{"resource":"orders"}`, 400, "nothing to report"},
		{`{"resource":"orders","response_time_ms":1,"response_time":"1ms"}`, 400, "not both"},
		{`{"resource":"orders","response_time_ms":-1}`, 400, "non-negative"},
		{`{"resource":"orders","response_time_ms":1e300}`, 400, "non-negative"},
		{`{"resource":"orders","response_time":"fast"}`, 400, "duration"},
		{`{"resource":"orders","response_time":"-3s"}`, 400, "duration"},
		{`{"resource":"orders","status":42}`, 400, "not an HTTP status"},
		// Each bound at its edge, and just past it.
		{`{"resource":"orders","response_time_ms":0}`, 204, ""},
		{`{"resource":"orders","response_time_ms":-0.001}`, 400, "non-negative"},
		{`{"resource":"orders","response_time_ms":9223372036854}`, 204, ""},
		{`{"resource":"orders","response_time_ms":9223372036855}`, 400, "non-negative"},
		{`{"resource":"orders","response_time":"0s"}`, 204, ""},
		{`{"resource":"orders","response_time":"-1ns"}`, 400, "duration"},
		{`{"resource":"orders","status":100}`, 204, ""},
		{`{"resource":"orders","status":99}`, 400, "not an HTTP status"},
		{`{"resource":"orders","status":599}`, 204, ""},
		{`{"resource":"orders","status":600}`, 400, "not an HTTP status"},
		{`{"resource":"orders","status":"200"}`, 400, "invalid JSON"},
	}
	for _, tt := range tests {
		rec := postReport(h, http.MethodPost, tt.body)
		if rec.Code != tt.code || !strings.Contains(rec.Body.String(), tt.want) {
			t.Errorf("%s: %d %q, want %d containing %q", tt.body, rec.Code, rec.Body, tt.code, tt.want)
		}
	}
	if rec := postReport(h, http.MethodGet, ""); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d", rec.Code)
	}
	big := `{"resource":"orders","status":200,"route":"` + strings.Repeat("x", MaxReportBytes) + `"}`
	if rec := postReport(h, http.MethodPost, big); rec.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized body: %d", rec.Code)
	}
}

func TestReportFeedsBreakers(t *testing.T) {
	e := newBreakerEnv(t)
	h := NewReport(Options{Registry: e.reg})
	for _, body := range []string{
		`{"resource":"orders","response_time":"5ms","status":200}`,
		`{"resource":"orders","error":true}`,
	} {
		if rec := postReport(h, http.MethodPost, body); rec.Code != http.StatusNoContent {
			t.Fatalf("%s: %d %s", body, rec.Code, rec.Body)
		}
	}
	if st := e.stats(ordersRule); st.State != breaker.Open || st.Failed != 1 || st.Total != 2 {
		t.Errorf("orders: %+v", st.Stats)
	}
	// A report without a response time does not count for slow_request_ratio.
	postReport(h, http.MethodPost, `{"route":"checkout","cluster":"backend","status":200}`)
	if st := e.stats(slowRule); st.Total != 0 {
		t.Errorf("untimed report counted by the slow breaker: %+v", st.Stats)
	}
	postReport(h, http.MethodPost, `{"route":"checkout","cluster":"backend","response_time_ms":250}`)
	postReport(h, http.MethodPost, `{"route":"checkout","cluster":"backend","response_time_ms":250}`)
	if st := e.stats(slowRule); st.State != breaker.Open {
		t.Errorf("slow breaker after two slow reports: %+v", st.Stats)
	}
	if got := observations(t, e, breaker.SourceReport); got != 5 {
		t.Errorf("report observations = %v, want 5", got)
	}
}
